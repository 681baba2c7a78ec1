"""Forgetting through the run loop: sequential domains without EWC, with EWC, and mixed.

    .venv/bin/python bench/bench_forgetting.py                 # the README table
    .venv/bin/python bench/bench_forgetting.py --quick         # fewer steps and tasks
    .venv/bin/python bench/bench_forgetting.py --work-dir var/bench/forgetting   # keep the runs

Every phase is one ``training.run(RunSpec, sink, control)``: the DeepSpeed trainer, the
``transformers`` rollout engine, the domain mix, checkpoints and the spec's ``ewc`` section
exactly as a console job would run them. Domain A (default ``parity``, a skill the demo model
only learns by RL: its warm-up labels are coin flips) and domain B (default ``json_format``),
from the same demo model, with the same seed and the same number of updates per row:

- ``sequential``: run 1 trains A for ``--steps`` steps; its final checkpoint is checkpoint A.
  Run 2 starts from checkpoint A's Hugging Face copy and trains B for ``--steps`` steps, with A
  in the spec at weight 0 (evaluated, never trained on).
- ``sequential+ewc``: the same run 2 with the spec's ``ewc`` section set: a diagonal Fisher
  estimated at checkpoint A on held-out A tasks (completions sampled from the checkpoint-A
  model: the true Fisher, mean-normalised), anchored at checkpoint A's parameters. One row per
  ``--ewc-strength`` value: the strength trades keeping A against learning B.
- ``mixed``: one run of ``2 x --steps`` steps with A and B at weight 1 each.

Reported per domain: the held-out mean reward (greedy, the domain's rubric, test-split tasks
never trained on and disjoint from the Fisher's tasks; the loop's own ``eval/reward/<domain>/
mean``) at the base model, at checkpoint A and at the end; *forgetting* = A's reward at
checkpoint A minus A's reward at the end; and the distance of each final model from checkpoint
A, Fisher-weighted (what EWC penalises) and plain L2. The baseline every row compares with is
the ``sequential`` row of the same invocation. The runs' files (checkpoints, Fisher, anchor)
go to a temporary directory that is removed afterwards, unless ``--work-dir`` names one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# Run as a script from the repository root (python bench/bench_forgetting.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.checkpoint import hf_copy
from training.control import StaticControl
from training.demo.domains import DemoDomain, demo_domains, get_domain
from training.ewc import EWCPenalty, causal_lm_nll, estimate_fisher, fisher_batches
from training.loop import RunOutcome, run
from training.spec import RunSpec

Say = Callable[..., None]


@dataclass(frozen=True)
class ForgettingConfig:
    domains: tuple[str, str] = ("parity", "json_format")
    steps: int = 48  # steps per domain (mixed gets twice as many); parity takes 24-40 (preset)
    prompts_per_step: int = 16
    group_size: int = 8
    # The learning preset's (training/presets.py): lr 1e-3 without a warm-up broke the answer
    # format or collapsed the policy on demo recipe 5 (bench/README.md, "Levers").
    lr: float = 3e-4
    lr_warmup_steps: int = 8
    temperature: float = 1.2
    # One sequential+ewc row each. Measured (bench/README.md): 0.2 and 1 kept most of A and B
    # still learned; at 5, one seed kept A whole and did not learn B, the other learned both.
    ewc_strengths: tuple[float, ...] = (0.2, 1.0, 5.0)
    eval_tasks: int = 64
    fisher_tasks: int = 32
    seed: int = 0
    gradient_clipping: float = 1.0
    micro_batch_tokens: int = 4096
    train_tasks: int = 512


@dataclass
class HeldOut:
    """Test-split tasks of each domain, split into an evaluation set and a disjoint Fisher set."""

    evaluation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fisher: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def draw(cls, config: ForgettingConfig) -> HeldOut:
        held_out = cls()
        needed = config.eval_tasks + config.fisher_tasks
        for name in config.domains:
            # Small domains repeat held-out tasks; over-draw, then keep each task once.
            tasks = _unique(
                get_domain(name).make_tasks(4 * needed, seed=config.seed, split="held_out")
            )
            tasks = _balance_answers(tasks)
            if len(tasks) < needed:
                raise RuntimeError(f"{name}: only {len(tasks)} distinct held-out tasks")
            held_out.evaluation[name] = tasks[: config.eval_tasks]
            held_out.fisher[name] = tasks[config.eval_tasks : needed]
        return held_out


def _unique(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    kept = []
    for task in tasks:
        key = task["metadata"]["task_id"]
        if key not in seen:
            seen.add(key)
            kept.append(task)
    return kept


def _balance_answers(tasks: list[dict[str, Any]], most: int = 4) -> list[dict[str, Any]]:
    """Interleaves the tasks of a domain with at most ``most`` distinct answers (``parity``:
    even/odd) so that every prefix holds each answer equally often: a model that learned to
    give one answer to everything then scores exactly chance, and cannot pass for one that
    learned the skill (32 random parity tasks held 22 odd ones: 0.69 for answering "odd")."""
    by_answer: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        by_answer.setdefault(str(task["ground_truth"]), []).append(task)
    if len(by_answer) > most:
        return tasks
    columns = list(by_answer.values())
    return [column[row] for row in range(min(map(len, columns))) for column in columns]


# --------------------------------------------------------------------------------------------
# One phase = one run of the loop
# --------------------------------------------------------------------------------------------


def phase_spec(
    config: ForgettingConfig,
    held_out: HeldOut,
    *,
    name: str,
    base_model: str | Path,
    weights: dict[str, float],
    steps: int,
    run_dir: Path,
    ewc: dict[str, Any] | None = None,
) -> RunSpec:
    """A spec that trains on ``weights`` for ``steps`` steps and evaluates every domain of the
    experiment (weight 0 included) on the same held-out tasks before the first and after the
    last step; the final checkpoint is the phase's model."""
    domains = []
    for domain_name in config.domains:
        demo: DemoDomain = get_domain(domain_name)
        domains.append(
            {
                "name": domain_name,
                "weight": weights.get(domain_name, 0.0),
                "rubric_spec": demo.rubric_spec,
                "task_source": {
                    "kind": "demo",
                    "domain": domain_name,
                    "n": config.train_tasks,
                    "seed": config.seed,
                    "split": "train",
                },
                "eval_tasks": held_out.evaluation[domain_name],
                "max_new_tokens": demo.max_new_tokens,
            }
        )
    return RunSpec.from_dict(
        {
            "name": name,
            "base_model": str(base_model),
            "seed": config.seed,
            "max_steps": steps,
            "lr": config.lr,
            "lr_warmup_steps": config.lr_warmup_steps,
            "algorithm": {"algorithm": "grpo"},
            # No KL to the base: forgetting is what is measured, not what a KL term would hold.
            "kl": {"coef": 0.0, "reference": False},
            "batch": {
                "prompts_per_step": config.prompts_per_step,
                "group_size": config.group_size,
                "micro_batch_tokens": config.micro_batch_tokens,
            },
            "sampling": {"temperature": config.temperature},
            "domains": domains,
            "eval": {"tasks_per_domain": config.eval_tasks, "greedy": True},
            "deepspeed": {
                "zero_optimization": {"stage": 1},
                "gradient_clipping": config.gradient_clipping,
            },
            "rollout": {"engine": "hf"},
            "checkpoint": {"dir": str(run_dir / "checkpoints"), "resume": "none"},
            "ewc": ewc or {},
            "output_dir": str(run_dir),
        }
    )


class ProgressSink:
    """Prints one line per step (train reward, EWC penalty) and per held-out evaluation."""

    def __init__(self, label: str, say: Say) -> None:
        self.label = label
        self.say = say

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        pass

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if "eval/reward/mean" in values:
            rewards = {
                key.split("/")[2]: round(value, 3)
                for key, value in values.items()
                if key.startswith("eval/reward/") and key.endswith("/mean") and key.count("/") == 3
            }
            self.say(f"  [{self.label}] eval @ step {step}: {rewards}", flush=True)
            return
        extra = f", ewc penalty {values['ewc/penalty']:.4f}" if "ewc/penalty" in values else ""
        self.say(
            f"  [{self.label}] step {step:3d}: train reward {values['reward/mean']:.3f}, "
            f"flat groups {values['frac_reward_zero_std']:.2f}, "
            f"{values['timing_s/step']:.1f} s{extra}",
            flush=True,
        )

    def checkpoint(self, info: dict[str, Any]) -> None:
        pass

    def event(self, kind: str, data: dict[str, Any]) -> None:
        pass


@dataclass
class PhaseResult:
    start: dict[str, float]  # held-out reward per domain before the first step
    end: dict[str, float]  # ... and after the last
    model_dir: Path  # the final checkpoint's Hugging Face copy
    seconds: float


def _rewards(metrics: dict[str, float], domains: Sequence[str]) -> dict[str, float]:
    return {name: metrics[f"eval/reward/{name}/mean"] for name in domains}


def run_phase(spec: RunSpec, say: Say) -> PhaseResult:
    started = time.perf_counter()
    outcome: RunOutcome = run(spec, ProgressSink(spec.name, say), StaticControl())
    if outcome.status != "completed" or outcome.checkpoint is None:
        raise RuntimeError(f"{spec.name}: {outcome.status} ({outcome.error})")
    (first_step, before), (last_step, after) = outcome.eval_history[0], outcome.eval_history[-1]
    assert first_step == 0 and last_step == spec.max_steps, outcome.eval_history
    return PhaseResult(
        start=_rewards(before, spec.domain_names),
        end=_rewards(after, spec.domain_names),
        model_dir=hf_copy(outcome.checkpoint),
        seconds=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------------------------
# The Fisher at checkpoint A, and distances from it
# --------------------------------------------------------------------------------------------


def load_model(model_dir: str | Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def fisher_at(
    model_dir: str | Path, tasks: Sequence[dict[str, Any]], domain: str, *, seed: int
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher (mean-normalised) of the model in ``model_dir`` on ``tasks``.

    The completions are sampled from that model at temperature 1 (the true Fisher): the
    empirical one, on reference answers, would be near zero wherever the model already fits
    them and say nothing about what its own behaviour depends on.
    """
    from training.rollout.base import RolloutEngineConfig, SamplingConfig
    from training.rollout.hf import HFEngine

    engine = HFEngine(model_dir, RolloutEngineConfig(engine="hf"))
    try:
        sampling = SamplingConfig(
            temperature=1.0, max_new_tokens=get_domain(domain).max_new_tokens, n=1, seed=seed
        )
        outputs = engine.generate([task["prompt"] for task in tasks], sampling)
        tokenizer = engine.tokenizer
        # Special tokens kept: the end-of-turn token the model sampled is part of what it does.
        pairs = [
            (task["prompt"], str(tokenizer.decode(samples[0].token_ids, skip_special_tokens=False)))
            for task, samples in zip(tasks, outputs, strict=True)
        ]
    finally:
        engine.close()
    model = load_model(model_dir)
    batches = fisher_batches(tokenizer, pairs, batch_size=8)
    return estimate_fisher(model, batches, causal_lm_nll, normalize="mean")


def anchor_at(
    model_dir: str | Path,
    tasks: Sequence[dict[str, Any]],
    domain: str,
    *,
    strength: float,
    seed: int,
) -> EWCPenalty:
    """The EWC penalty anchored at the model in ``model_dir`` with its Fisher on ``tasks``."""
    fisher = fisher_at(model_dir, tasks, domain, seed=seed)
    return EWCPenalty.from_model(load_model(model_dir), fisher, strength=strength)


def save_anchor(anchor: EWCPenalty, directory: Path) -> dict[str, Any]:
    """Writes Fisher and anchor files; returns the spec's ``ewc`` section that names them."""
    directory.mkdir(parents=True, exist_ok=True)
    fisher_path, anchor_path = directory / "fisher.pt", directory / "anchor.pt"
    anchor.save_parts(fisher_path, anchor_path)
    return {
        "strength": anchor.strength,
        "fisher_path": str(fisher_path),
        "anchor_path": str(anchor_path),
    }


def distances(anchor: EWCPenalty, model_dir: str | Path) -> dict[str, float]:
    model = load_model(model_dir)
    return {
        "fisher_distance": anchor.anchor_distance(model, weighted=True),
        "distance": anchor.anchor_distance(model),
    }


def train_second_domain(
    config: ForgettingConfig,
    held_out: HeldOut,
    checkpoint_a: Path,
    run_dir: Path,
    say: Say,
    *,
    label: str,
    ewc: dict[str, Any] | None = None,
) -> PhaseResult:
    """Run 2: B from checkpoint A, with A in the spec at weight 0 (evaluated only)."""
    first, second = config.domains
    spec = phase_spec(
        config,
        held_out,
        name=label,
        base_model=checkpoint_a,
        weights={first: 0.0, second: 1.0},
        steps=config.steps,
        run_dir=run_dir,
        ewc=ewc,
    )
    return run_phase(spec, say)


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------


def run_experiment(
    model_dir: str | Path, config: ForgettingConfig, work_dir: Path, *, verbose: bool = True
) -> dict[str, Any]:
    first, second = config.domains
    held_out = HeldOut.draw(config)
    say: Say = print if verbose else (lambda *args, **kwargs: None)
    started = time.perf_counter()

    # Run 1 (shared by both sequential rows): A alone; its final checkpoint is checkpoint A.
    phase_a = run_phase(
        phase_spec(
            config,
            held_out,
            name=f"1-{first}",
            base_model=model_dir,
            weights={first: 1.0, second: 0.0},
            steps=config.steps,
            run_dir=work_dir / "run1",
        ),
        say,
    )
    say(f"checkpoint A ({first}): {phase_a.end}", flush=True)
    # The strength is the spec's; the anchor's own only scales what anchor_distance ignores.
    anchor = anchor_at(
        phase_a.model_dir, held_out.fisher[first], first, strength=1.0, seed=config.seed + 1
    )
    ewc_files = save_anchor(anchor, work_dir / "ewc")

    second_runs: list[tuple[str, dict[str, Any] | None]] = [("sequential", None)]
    for strength in config.ewc_strengths:
        label = "sequential+ewc"
        if len(config.ewc_strengths) > 1:
            label += f" {strength:g}"
        second_runs.append((label, {**ewc_files, "strength": strength}))
    rows: dict[str, dict[str, Any]] = {}
    for label, ewc in second_runs:
        phase_b = train_second_domain(
            config,
            held_out,
            phase_a.model_dir,
            work_dir / label.replace(" ", "-"),
            say,
            label=f"2-{label.replace(' ', '-')}",
            ewc=ewc,
        )
        rows[label] = {
            "checkpoint": phase_a.end,
            "final": phase_b.end,
            "forgetting": phase_a.end[first] - phase_b.end[first],
            "steps": 2 * config.steps,
            "seconds": phase_a.seconds + phase_b.seconds,
            **distances(anchor, phase_b.model_dir),
        }
        say(f"{label}: {rows[label]}", flush=True)

    mixed = run_phase(
        phase_spec(
            config,
            held_out,
            name="mixed",
            base_model=model_dir,
            weights={first: 1.0, second: 1.0},
            steps=2 * config.steps,
            run_dir=work_dir / "mixed",
        ),
        say,
    )
    rows["mixed"] = {
        "checkpoint": None,
        "final": mixed.end,
        "forgetting": None,
        "steps": 2 * config.steps,
        "seconds": mixed.seconds,
        **distances(anchor, mixed.model_dir),
    }
    say(f"mixed: {rows['mixed']}", flush=True)
    return {
        "config": asdict(config),
        "base": phase_a.start,
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }


def _ratio(value: float, baseline: float) -> str:
    return f" ({value / baseline:.2f}x)" if baseline > 0 else ""


def format_table(results: dict[str, Any]) -> str:
    first, second = results["config"]["domains"]
    base = results["base"]
    baseline = results["rows"]["sequential"]
    lines = [
        f"| setting | {first} base | {first} at ckpt A | {first} final | forgetting ({first}) "
        f"| {second} base | {second} at ckpt A | {second} final "
        "| Fisher-weighted distance from ckpt A | L2 distance from ckpt A |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in results["rows"].items():
        checkpoint = row["checkpoint"]
        at_a = {name: f"{checkpoint[name]:.3f}" if checkpoint else "—" for name in (first, second)}
        forgetting = "—"
        if row["forgetting"] is not None:
            forgetting = f"{row['forgetting']:+.3f}"
            # A ratio of a gain (negative forgetting) to a loss would read as nonsense.
            if label != "sequential" and row["forgetting"] >= 0:
                forgetting += _ratio(row["forgetting"], baseline["forgetting"])
        fisher_distance = f"{row['fisher_distance']:.3f}"
        distance = f"{row['distance']:.3f}"
        if label != "sequential":
            fisher_distance += _ratio(row["fisher_distance"], baseline["fisher_distance"])
            distance += _ratio(row["distance"], baseline["distance"])
        name = f"{label} ({row['steps']} steps, half each)" if label == "mixed" else label
        lines.append(
            f"| {name} | {base[first]:.3f} | {at_a[first]} | {row['final'][first]:.3f} "
            f"| {forgetting} | {base[second]:.3f} | {at_a[second]} | {row['final'][second]:.3f} "
            f"| {fisher_distance} | {distance} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    defaults = ForgettingConfig()
    parser.add_argument("--model", default=None, help="model dir (default: the demo model)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--ewc-strength",
        type=float,
        nargs="+",
        default=list(defaults.ewc_strengths),
        help="EWC strength(s): one sequential+ewc row each",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--prompts-per-step", type=int, default=defaults.prompts_per_step)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument(
        "--domains",
        nargs=2,
        default=list(defaults.domains),
        metavar=("FIRST", "SECOND"),
        help="domain trained first (whose forgetting is measured), then the second",
    )
    parser.add_argument("--eval-tasks", type=int, default=defaults.eval_tasks)
    parser.add_argument("--fisher-tasks", type=int, default=defaults.fisher_tasks)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 steps, 8 prompts, 16 tasks"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the runs' checkpoints, Fisher and anchor here (default: a temporary "
        "directory, removed at the end)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: a 1.4M-parameter model gains little from more, and "
        "with another process on the cores a step took 11 s at 2 threads against 0.8 s at 1)",
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    known = [domain.name for domain in demo_domains()]
    missing = [name for name in args.domains if name not in known]
    if missing:
        parser.error(f"no demo domain {', '.join(missing)} here (known: {', '.join(known)})")

    if args.model is None:
        from training.models import ensure_demo_model

        model_dir = ensure_demo_model()
    else:
        model_dir = Path(args.model)
    config = ForgettingConfig(
        domains=(args.domains[0], args.domains[1]),
        steps=2 if args.quick else args.steps,
        prompts_per_step=8 if args.quick else args.prompts_per_step,
        group_size=args.group_size,
        lr=args.lr,
        temperature=args.temperature,
        ewc_strengths=tuple(args.ewc_strength),
        eval_tasks=16 if args.quick else args.eval_tasks,
        fisher_tasks=16 if args.quick else args.fisher_tasks,
        seed=args.seed,
    )
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        work_dir = Path(tempfile.mkdtemp(prefix="forgetting-", dir=args.work_dir))
    else:
        work_dir = Path(tempfile.mkdtemp(prefix="bench-forgetting-"))
    try:
        results = run_experiment(model_dir, config, work_dir)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    print()
    print(format_table(results))
    print(f"\n{results['seconds']:.0f} s; config {json.dumps(results['config'])}")
    if args.work_dir is not None:
        print(f"runs kept in {work_dir}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
