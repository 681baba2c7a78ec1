"""Forgetting on the demo model: sequential domains without EWC, with EWC, and mixed.

    .venv/bin/python bench/bench_forgetting.py                 # the README table (lr 1e-3)
    .venv/bin/python bench/bench_forgetting.py --lr 5e-4       # its second table
    .venv/bin/python bench/bench_forgetting.py --steps 3 --quick

Three ways to train on domain A (default ``code``, which the demo model's warm-up already
solves, so there is something to forget) and domain B (``json_format``) with GRPO, from the
same demo model, the same seed and the same number of updates:

- ``sequential``: A for ``--steps`` updates (checkpoint A), then B for ``--steps``.
- ``sequential+ewc``: the same, but at checkpoint A a diagonal Fisher is estimated on held-out
  A tasks (completions sampled from the model: the true Fisher) and B's updates carry the EWC
  penalty anchored at checkpoint A.
- ``mixed``: ``2 x --steps`` updates whose batches hold A and B half and half.

Reported per domain: held-out mean reward (greedy, the domain's rubric, tasks never trained
on and disjoint from the Fisher tasks) at the base model, at checkpoint A and at the end;
*forgetting* = A's reward at checkpoint A minus A's reward at the end; and the Fisher-weighted
distance of the parameters from checkpoint A. The baseline every row compares with is the
``sequential`` row of the same run.

The updates are a plain on-policy GRPO step written with ``training.algorithms`` (advantages,
PPO-clip loss, token-mean aggregation) and ``training.ewc`` on a ``transformers`` model, with
``generate`` for rollouts: the experiment isolates what EWC and mixing do to the parameters, so
it runs the same update rule everywhere without the DeepSpeed loop's machinery.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# Run as a script from the repository root (python bench/bench_forgetting.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards import Rubric, Sample  # noqa: E402
from training.algorithms import (  # noqa: E402
    compute_advantages,
    filter_zero_variance_groups,
    policy_loss,
)
from training.demo import demo_domains  # noqa: E402
from training.ewc import EWCPenalty, causal_lm_nll, estimate_fisher, fisher_batches  # noqa: E402


@dataclass
class ForgettingConfig:
    domains: tuple[str, str] = ("code", "json_format")
    steps: int = 8  # updates per domain (mixed gets twice as many)
    prompts_per_step: int = 8
    group_size: int = 4
    lr: float = 1e-3
    temperature: float = 1.2
    ewc_strength: float = 50.0
    eval_tasks: int = 32
    fisher_tasks: int = 32
    seed: int = 0
    max_grad_norm: float = 1.0


@dataclass
class Policy:
    model: Any
    tokenizer: Any


@dataclass
class Phase:
    rewards: dict[str, float] = field(default_factory=dict)


def load_policy(model_dir: str | Path) -> Policy:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return Policy(model=model, tokenizer=tokenizer)


def domain_table() -> dict[str, Any]:
    return {domain.name: domain for domain in demo_domains()}


class TaskPool:
    """Train tasks to draw from, and held-out tasks split into Fisher and evaluation halves."""

    def __init__(self, config: ForgettingConfig) -> None:
        domains = domain_table()
        self.domains = {name: domains[name] for name in config.domains}
        self.rubrics = {name: Rubric.from_spec(d.rubric_spec) for name, d in self.domains.items()}
        self.train: dict[str, list[dict[str, Any]]] = {}
        self.fisher: dict[str, list[dict[str, Any]]] = {}
        self.eval: dict[str, list[dict[str, Any]]] = {}
        for name, domain in self.domains.items():
            self.train[name] = domain.make_tasks(512, seed=config.seed, split="train")
            held_out = _unique(
                domain.make_tasks(
                    4 * (config.eval_tasks + config.fisher_tasks), seed=config.seed, split="test"
                )
            )
            needed = config.eval_tasks + config.fisher_tasks
            if len(held_out) < needed:
                raise RuntimeError(f"{name}: only {len(held_out)} distinct held-out tasks")
            self.eval[name] = held_out[: config.eval_tasks]
            self.fisher[name] = held_out[config.eval_tasks : needed]

    def score(self, tasks: Sequence[dict[str, Any]], completions: Sequence[str]) -> list[float]:
        scores = []
        for task, completion in zip(tasks, completions, strict=True):
            domain = task["metadata"]["domain"]
            sample = Sample(
                domain=domain,
                prompt=task["prompt"],
                completion=completion,
                ground_truth=task["ground_truth"],
                metadata=task["metadata"],
            )
            scores.append(float(self.rubrics[domain].score(sample).total))
        return scores


def _unique(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for task in tasks:
        key = task["metadata"]["task_id"]
        if key not in seen:
            seen.add(key)
            out.append(task)
    return out


# --------------------------------------------------------------------------------------------
# Rollouts, evaluation and one GRPO update
# --------------------------------------------------------------------------------------------


def _end_id(tokenizer: Any) -> int:
    return int(tokenizer.eos_token_id)


@torch.no_grad()
def generate(
    policy: Policy,
    prompts: Sequence[str],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
) -> list[tuple[list[int], list[int], str]]:
    """``n`` completions per prompt as ``(prompt ids, completion ids, text)``; greedy when
    ``temperature`` is 0. Sampling uses the full distribution (no top-k), so the update's
    log-probabilities are those of the policy that sampled."""
    tokenizer, model = policy.tokenizer, policy.model
    model.eval()
    batch = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")
    sampling: dict[str, Any] = (
        {"do_sample": False}
        if temperature == 0
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    out = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        num_return_sequences=n,
        eos_token_id=_end_id(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    width = batch["input_ids"].shape[1]
    results = []
    for row in range(out.shape[0]):
        prompt_row = row // n
        prompt_ids = batch["input_ids"][prompt_row][batch["attention_mask"][prompt_row].bool()]
        completion = out[row, width:].tolist()
        if _end_id(tokenizer) in completion:
            completion = completion[: completion.index(_end_id(tokenizer)) + 1]
        else:
            completion = [t for t in completion if t != tokenizer.pad_token_id]
        text = tokenizer.decode(completion, skip_special_tokens=True)
        results.append((prompt_ids.tolist(), completion, text))
    return results


def evaluate(policy: Policy, pool: TaskPool) -> dict[str, float]:
    """Held-out mean reward per domain, greedy."""
    rewards = {}
    for name, tasks in pool.eval.items():
        max_new = pool.domains[name].max_new_tokens
        outputs = generate(
            policy, [t["prompt"] for t in tasks], n=1, max_new_tokens=max_new, temperature=0
        )
        scores = pool.score(tasks, [text for _, _, text in outputs])
        rewards[name] = sum(scores) / len(scores)
    return rewards


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    pool: TaskPool,
    tasks: Sequence[dict[str, Any]],
    config: ForgettingConfig,
    penalty: EWCPenalty | None,
) -> dict[str, float]:
    """One on-policy GRPO step: sample a group per prompt, score, update once.

    Groups whose samples all scored the same are dropped (DAPO's dynamic filtering); when no
    group is left the step is skipped (``metrics["skipped"] == 1``) and nothing is updated.
    """
    rollouts: list[tuple[list[int], list[int]]] = []
    rewards: list[float] = []
    groups: list[int] = []
    for name in dict.fromkeys(t["metadata"]["domain"] for t in tasks):
        chunk = [t for t in tasks if t["metadata"]["domain"] == name]
        outputs = generate(
            policy,
            [t["prompt"] for t in chunk],
            n=config.group_size,
            max_new_tokens=pool.domains[name].max_new_tokens,
            temperature=config.temperature,
        )
        expanded = [task for task in chunk for _ in range(config.group_size)]
        rewards += pool.score(expanded, [text for _, _, text in outputs])
        rollouts += [(p, c) for p, c, _ in outputs]
        base = len(set(groups))
        groups += [base + i // config.group_size for i in range(len(outputs))]

    keep = filter_zero_variance_groups(torch.tensor(rewards), groups)
    train_reward = sum(rewards) / len(rewards)
    if not bool(keep.any()):
        return {"skipped": 1.0, "critic/score/mean": train_reward}
    kept = keep.nonzero().squeeze(-1).tolist()
    rollouts = [rollouts[i] for i in kept]
    rewards = [rewards[i] for i in kept]
    groups = [groups[i] for i in kept]

    width = max(len(p) + len(c) for p, c in rollouts)
    pad = policy.tokenizer.pad_token_id
    input_ids = torch.full((len(rollouts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rollouts), width), dtype=torch.long)
    response = torch.zeros((len(rollouts), width), dtype=torch.float32)
    for row, (prompt_ids, completion_ids) in enumerate(rollouts):
        ids = prompt_ids + completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        response[row, len(prompt_ids) : len(ids)] = 1
    # Logits at i score token i + 1: shift the response mask with the labels.
    labels = input_ids[:, 1:]
    response_mask = response[:, 1:]

    model = policy.model
    model.train()
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    advantages, _ = compute_advantages(
        "grpo",
        rewards=torch.tensor(rewards),
        response_mask=response_mask,
        group_index=groups,
    )
    loss, metrics = policy_loss(
        "ppo",
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        advantages=advantages,
        response_mask=response_mask,
        aggregation="token-mean",
    )
    if penalty is not None:
        ewc = penalty(model)
        loss = loss + ewc
        metrics["ewc/penalty"] = float(ewc.detach())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()
    metrics["critic/score/mean"] = train_reward
    metrics["skipped"] = 0.0
    return metrics


def train(
    policy: Policy,
    pool: TaskPool,
    config: ForgettingConfig,
    domains: Sequence[str],
    steps: int,
    *,
    seed: int,
    penalty: EWCPenalty | None = None,
    log: Any = None,
) -> int:
    """``steps`` GRPO updates; each batch splits ``prompts_per_step`` evenly over ``domains``.

    Batches with no reward variance are skipped and drawn again (DAPO's dynamic sampling), up
    to ``4 * steps`` draws, so every counted step really updates the model. Returns the number
    of updates made.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=config.lr, weight_decay=0.0)
    per_domain = max(1, config.prompts_per_step // len(domains))
    updates = 0
    for _ in range(4 * steps):
        if updates == steps:
            break
        tasks = [task for name in domains for task in rng.sample(pool.train[name], per_domain)]
        metrics = grpo_update(policy, optimizer, pool, tasks, config, penalty)
        if metrics["skipped"]:
            continue
        updates += 1
        if log is not None:
            log(updates - 1, metrics)
    return updates


def fisher_at(
    policy: Policy, pool: TaskPool, domain: str, config: ForgettingConfig, *, seed: int
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher on held-out tasks of ``domain``, completions sampled from the policy."""
    torch.manual_seed(seed)
    tasks = pool.fisher[domain]
    outputs = generate(
        policy,
        [t["prompt"] for t in tasks],
        n=1,
        max_new_tokens=pool.domains[domain].max_new_tokens,
        temperature=1.0,
    )
    tokenizer = policy.tokenizer
    pairs = [
        (t["prompt"], tokenizer.decode(c, skip_special_tokens=False))
        for t, (_, c, _) in zip(tasks, outputs, strict=True)
    ]
    batches = fisher_batches(tokenizer, pairs, batch_size=8)
    return estimate_fisher(policy.model, batches, causal_lm_nll, normalize="mean")


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------


def run_experiment(
    model_dir: str | Path, config: ForgettingConfig, *, verbose: bool = True
) -> dict[str, Any]:
    first, second = config.domains
    pool = TaskPool(config)
    say = print if verbose else (lambda *a, **k: None)

    def logger(label: str) -> Any:
        def log(step: int, metrics: dict[str, float]) -> None:
            extra = f" ewc {metrics['ewc/penalty']:.4f}" if "ewc/penalty" in metrics else ""
            say(
                f"  [{label}] step {step + 1:3d} "
                f"train reward {metrics['critic/score/mean']:.3f}{extra}",
                flush=True,
            )

        return log

    started = time.perf_counter()
    base = load_policy(model_dir)
    results: dict[str, Any] = {"config": asdict(config), "rows": {}}
    base_rewards = evaluate(base, pool)
    say(f"base: {base_rewards}", flush=True)

    # Phase 1 (shared by both sequential rows): train on the first domain, checkpoint A.
    after_first = Policy(copy.deepcopy(base.model), base.tokenizer)
    train(after_first, pool, config, [first], config.steps, seed=config.seed, log=logger(first))
    checkpoint_rewards = evaluate(after_first, pool)
    say(f"checkpoint A ({first}): {checkpoint_rewards}", flush=True)
    fisher = fisher_at(after_first, pool, first, config, seed=config.seed + 1)
    anchor = EWCPenalty.from_model(after_first.model, fisher, strength=config.ewc_strength)

    rows: dict[str, dict[str, Any]] = {}
    for label, strength in (("sequential", 0.0), ("sequential+ewc", config.ewc_strength)):
        policy = Policy(copy.deepcopy(after_first.model), base.tokenizer)
        penalty = None
        if strength > 0:
            penalty = EWCPenalty.from_model(policy.model, fisher, strength=strength)
        train(
            policy,
            pool,
            config,
            [second],
            config.steps,
            seed=config.seed + 2,
            penalty=penalty,
            log=logger(label),
        )
        rows[label] = {
            "checkpoint": checkpoint_rewards,
            "final": evaluate(policy, pool),
            "fisher_distance": anchor.anchor_distance(policy.model, weighted=True),
            "distance": anchor.anchor_distance(policy.model),
        }
        say(f"{label}: {rows[label]}", flush=True)

    mixed = Policy(copy.deepcopy(base.model), base.tokenizer)
    train(
        mixed,
        pool,
        config,
        [first, second],
        2 * config.steps,
        seed=config.seed + 3,
        log=logger("mixed"),
    )
    rows["mixed"] = {
        "checkpoint": None,
        "final": evaluate(mixed, pool),
        "fisher_distance": anchor.anchor_distance(mixed.model, weighted=True),
        "distance": anchor.anchor_distance(mixed.model),
    }
    say(f"mixed: {rows['mixed']}", flush=True)
    for row in rows.values():
        if row["checkpoint"] is not None:
            row["forgetting"] = row["checkpoint"][first] - row["final"][first]
    results["base"] = base_rewards
    results["rows"] = rows
    results["seconds"] = time.perf_counter() - started
    return results


def format_table(results: dict[str, Any]) -> str:
    first, second = results["config"]["domains"]
    base = results["base"]
    lines = [
        f"| setting | {first} base | {first} at ckpt A | {first} final | forgetting ({first}) "
        f"| {second} base | {second} final | Fisher-weighted distance from ckpt A |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in results["rows"].items():
        checkpoint = row["checkpoint"]
        at_a = f"{checkpoint[first]:.3f}" if checkpoint else "—"
        forgetting = f"{row['forgetting']:+.3f}" if "forgetting" in row else "—"
        lines.append(
            f"| {label} | {base[first]:.3f} | {at_a} | {row['final'][first]:.3f} | {forgetting} "
            f"| {base[second]:.3f} | {row['final'][second]:.3f} | {row['fisher_distance']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model dir (default: the demo model)")
    parser.add_argument("--steps", type=int, default=ForgettingConfig.steps)
    parser.add_argument("--lr", type=float, default=ForgettingConfig.lr)
    parser.add_argument("--ewc-strength", type=float, default=ForgettingConfig.ewc_strength)
    parser.add_argument("--seed", type=int, default=ForgettingConfig.seed)
    parser.add_argument("--temperature", type=float, default=ForgettingConfig.temperature)
    parser.add_argument(
        "--domains",
        nargs=2,
        default=list(ForgettingConfig.domains),
        metavar=("FIRST", "SECOND"),
        help="domain trained first (whose forgetting is measured), then the second",
    )
    parser.add_argument("--eval-tasks", type=int, default=ForgettingConfig.eval_tasks)
    parser.add_argument("--quick", action="store_true", help="fewer evaluation tasks")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.model is None:
        from training.models import ensure_demo_model

        model_dir = ensure_demo_model()
    else:
        model_dir = Path(args.model)
    config = ForgettingConfig(
        domains=(args.domains[0], args.domains[1]),
        steps=args.steps,
        lr=args.lr,
        ewc_strength=args.ewc_strength,
        seed=args.seed,
        temperature=args.temperature,
        eval_tasks=16 if args.quick else args.eval_tasks,
        fisher_tasks=8 if args.quick else ForgettingConfig.fisher_tasks,
    )
    results = run_experiment(model_dir, config)
    print()
    print(format_table(results))
    print(f"\n{results['seconds']:.0f} s; config {json.dumps(results['config'])}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
