"""Run specs that learn on the demo domains: what the learning test, the learning benchmark and
the console's demo launch start from.

``learning_run_dict(domain, algorithm=..., seed=..., steps=...)`` returns a plain run-spec dict
(``RunSpec.from_dict`` takes it) for one demo domain: the domain's train tasks, a held-out set
from its held-out split (balanced by answer where the answers are a few labels, or by the
domain's ``balance_by`` label, so a policy that gives one answer to everything scores exactly
chance), the domain's rubric, and the settings measured to learn (``bench/README.md``,
"Learning"): on parity, json_format and code with GRPO and DAPO on the seeds measured there.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULT_RL_STEPS",
    "HELD_OUT_TASKS",
    "RL_STEPS",
    "balanced_held_out",
    "learning_run_dict",
    "learning_settings",
]

HELD_OUT_TASKS = 64
# Steps a domain's run takes by default: what it was measured to need (bench/README.md,
# "Learning"). json_format's rise is gradual (DAPO seed 1, recipe 7: held-out 0.52 -> 0.77 at
# step 64, 1.00 at 80) where parity's is abrupt (0.50 -> 1.00 between steps 16 and 32).
RL_STEPS = {"json_format": 96}
DEFAULT_RL_STEPS = 64


def balanced_held_out(domain: Any, n: int) -> list[dict[str, Any]]:
    """``n`` held-out tasks; for a domain with few distinct answers (parity) or a label a
    policy could give to everything (json_format's naming, ``domain.balance_by``), as many of
    each, so a constant policy scores exactly the chance level."""
    tasks = domain.make_tasks(4 * n, seed=0, split="held_out")

    def label(task: dict[str, Any]) -> str:
        if domain.balance_by:
            return str(task["metadata"][domain.balance_by])
        return str(task["ground_truth"])

    labels = sorted({label(t) for t in tasks})
    if len(labels) > 4:
        return tasks[:n]
    per = n // len(labels)
    return [t for a in labels for t in [t for t in tasks if label(t) == a][:per]]


def learning_settings(
    *, algorithm: str = "grpo", steps: int = 64, eval_every: int = 0, tools: bool = False
) -> dict[str, Any]:
    """The run-spec sections measured to learn on the demo domains, without the domains (the
    console's new-run form starts from these)."""
    return {
        "max_steps": steps,
        "lr": 3e-4,
        "lr_warmup_steps": 8,
        "cpu_threads": 1,
        # No entropy bonus. A bonus on every response token also spreads the tokens that must
        # stay near-certain (the format's): their entropy's gradient grows as they spread, so
        # the bonus feeds itself. On the recipe-7 base, parity seed 0 with 0.01 saw its
        # gradient norm climb 0.3 -> 1.4 over steps 17-21 while the reward was flat, then one
        # update broke the format (every group's reward 0), after which the bonus alone drove
        # the entropy to 6 nats; without it the same run learned by step 32. Parity had
        # learned on 5 of 5 seeds with or without it on the recipe-5 base (bench/README.md,
        # "Learning").
        "algorithm": {"algorithm": algorithm, "entropy_coef": 0.0},
        "kl": {"coef": 0.0, "reference": False},
        "batch": {"prompts_per_step": 16, "group_size": 8, "micro_batch_tokens": 4096},
        "sampling": {"temperature": 1.2, "max_new_tokens": 48},
        "eval": {"tasks_per_domain": HELD_OUT_TASKS, "greedy": True, "every_steps": eval_every},
        "deepspeed": {"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0},
        "rollout": {"engine": "hf"},
        "tools": {"enabled": tools},
        "checkpoint": {"save_final": False, "resume": "none"},
    }


def learning_run_dict(
    domain_name: str,
    *,
    algorithm: str = "grpo",
    seed: int = 0,
    steps: int | None = None,
    eval_every: int = 0,
    model_dir: str = "demo",
) -> dict[str, Any]:
    from training.demo.domains import get_domain

    domain = get_domain(domain_name)
    settings = learning_settings(
        algorithm=algorithm,
        steps=steps if steps is not None else RL_STEPS.get(domain_name, DEFAULT_RL_STEPS),
        eval_every=eval_every,
        tools=bool(domain.tools),
    )
    settings["sampling"]["max_new_tokens"] = domain.max_new_tokens
    return {
        "name": f"learn-{domain_name}-{algorithm}-s{seed}",
        "base_model": model_dir,
        "seed": seed,
        **settings,
        "domains": [
            {
                "name": domain_name,
                "rubric_spec": domain.rubric_spec,
                "tasks": domain.make_tasks(512, seed=0, split="train"),
                "eval_tasks": balanced_held_out(domain, HELD_OUT_TASKS),
            }
        ],
    }
