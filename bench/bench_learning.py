"""Does RL learn, robustly? Held-out reward before and after a run, over seeds and settings.

    .venv/bin/python bench/bench_learning.py                          # parity, grpo + dapo, 5 seeds
    .venv/bin/python bench/bench_learning.py --domains parity --seeds 0 1 2 3 4 --algorithms grpo
    .venv/bin/python bench/bench_learning.py --lever entropy_coef=0.01 --lever lr=3e-4

Every cell is one ``training.run(RunSpec, ...)`` from the demo model (the transformers rollout
engine, DeepSpeed ZeRO-1, the domain's own rubric), so what is measured is what a console job
runs. For each (domain, algorithm, lever, seed) it reports the greedy held-out mean reward on
balanced test-split tasks at step 0 and at the end, whether the rise clears the learning
test's bar (rise > max(3 SE, 0.25) on parity and json_format; > max(3 SE, 0.1) elsewhere),
whether the run *collapsed* (the loop's ``run.collapsed`` event: entropy near zero and every
group with equal rewards), and the first step whose periodic eval cleared the bar.

Low bits: ``--threads`` and ``--micro-batch-tokens`` change the order of floating-point
reductions (another machine's kernels do the same), so a setting that only works for one of
them is luck, not learning. ``--jitter`` runs each cell under both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script from the repository root (python bench/bench_learning.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training import ListSink, RunSpec, StaticControl, run
from training.demo.domains import get_domain
from training.presets import learning_run_dict


@dataclass
class Cell:
    domain: str
    algorithm: str
    lever: str
    seed: int
    threads: int
    micro_batch_tokens: int
    before: float
    after: float
    sem: float
    learned: bool
    collapsed: bool
    steps_to_learn: int | None
    seconds: float
    # (step, held-out mean reward) at every periodic eval: whether a rise held or came late.
    history: list[tuple[int, float]]


def parse_lever(text: str) -> dict[str, Any]:
    """``key=value[,key=value]`` with dotted keys into the run dict (``algorithm.entropy_coef``);
    ``key=@file.json`` reads the value from a JSON file (a rubric: ``domains.0.rubric_spec``)."""
    out: dict[str, Any] = {}
    if text in ("", "default"):
        return out
    for part in text.split(","):
        key, _, raw = part.partition("=")
        if raw.startswith("@"):
            out[key.strip()] = json.loads(Path(raw[1:]).read_text())
            continue
        out[key.strip()] = json.loads(raw) if raw.strip()[:1] in '[{"tf-0123456789.' else raw
    return out


def apply_lever(data: dict[str, Any], lever: dict[str, Any]) -> dict[str, Any]:
    """Sets each dotted key; a numeric part indexes a list (``domains.0.rubric_spec``)."""
    for dotted, value in lever.items():
        node: Any = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value
    return data


def bar(domain: str) -> float:
    # parity and json_format: held-out sets balanced so that a policy that ignores the question
    # scores exactly chance, and 0.25 is the learning test's margin; elsewhere a probe's.
    return 0.25 if domain in ("parity", "json_format") else 0.1


def one_cell(
    domain: str,
    algorithm: str,
    lever_text: str,
    seed: int,
    steps: int,
    threads: int,
    micro_batch_tokens: int,
    eval_every: int,
) -> Cell:
    data = learning_run_dict(
        domain, algorithm=algorithm, seed=seed, steps=steps, eval_every=eval_every
    )
    data["batch"]["micro_batch_tokens"] = micro_batch_tokens
    data["cpu_threads"] = threads
    apply_lever(data, parse_lever(lever_text))
    spec = RunSpec.from_dict(data)
    sink = ListSink()
    started = time.perf_counter()
    outcome = run(spec, sink, StaticControl())
    seconds = time.perf_counter() - started
    if outcome.status != "completed":
        raise RuntimeError(f"{domain}/{algorithm}/{lever_text}/seed {seed}: {outcome.error}")
    history = outcome.eval_history
    before = history[0][1]["eval/reward/mean"]
    after = history[-1][1]["eval/reward/mean"]
    sem = math.hypot(history[0][1]["eval/reward/sem"], history[-1][1]["eval/reward/sem"])
    threshold = max(3 * sem, bar(domain))
    steps_to_learn = next(
        (step for step, m in history[1:] if m["eval/reward/mean"] - before > threshold), None
    )
    collapsed = any(name == "run.collapsed" for name, _ in sink.events)
    return Cell(
        domain,
        algorithm,
        lever_text or "default",
        seed,
        threads,
        micro_batch_tokens,
        before,
        after,
        sem,
        after - before > threshold,
        collapsed,
        steps_to_learn,
        seconds,
        [(step, round(m["eval/reward/mean"], 4)) for step, m in history],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # parity alone by default: json_format learns (--domains json_format) but needs 96 steps of
    # 40-token answers (12 minutes a run on a loaded 2-core box); tool_calc and arithmetic do
    # not learn yet with these settings (bench/README.md).
    parser.add_argument("--domains", nargs="+", default=["parity"])
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "dapo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--lever", action="append", default=None, help="key=value[,key=value]")
    parser.add_argument("--steps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument(
        "--jitter", action="store_true", help="each cell also at 2 threads, 512-token micro-batches"
    )
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="append each cell as a JSON line")
    args = parser.parse_args(argv)
    levers = args.lever or ["default"]
    variants = [(args.threads, args.micro_batch_tokens)]
    if args.jitter:
        variants.append((2, 512))
    cells: list[Cell] = []
    print(
        f"{'domain':<12} {'algo':<6} {'lever':<34} {'seed':>4} {'thr':>3} {'mbt':>5} "
        f"{'before':>6} {'after':>6} {'learned':>7} {'collapsed':>9} {'to-learn':>8} {'s':>5}",
        flush=True,
    )
    for domain in args.domains:
        get_domain(domain)  # fail early on a typo
        for algorithm in args.algorithms:
            for lever in levers:
                for seed in args.seeds:
                    for threads, mbt in variants:
                        steps = args.steps or learning_run_dict(domain)["max_steps"]
                        cell = one_cell(
                            domain, algorithm, lever, seed, steps, threads, mbt, args.eval_every
                        )
                        cells.append(cell)
                        print(
                            f"{cell.domain:<12} {cell.algorithm:<6} {cell.lever:<34} "
                            f"{cell.seed:>4} {cell.threads:>3} {cell.micro_batch_tokens:>5} "
                            f"{cell.before:>6.3f} {cell.after:>6.3f} {str(cell.learned):>7} "
                            f"{str(cell.collapsed):>9} {str(cell.steps_to_learn):>8} "
                            f"{cell.seconds:>5.0f}",
                            flush=True,
                        )
                        if args.json:
                            with args.json.open("a") as handle:
                                handle.write(json.dumps(cell.__dict__) + "\n")
    print("\n| domain | algorithm | lever | seeds learned | collapsed | before | mean rise |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(c.domain, c.algorithm, c.lever) for c in cells})
    for key in keys:
        group = [c for c in cells if (c.domain, c.algorithm, c.lever) == key]
        learned = sum(c.learned for c in group)
        collapsed = sum(c.collapsed for c in group)
        before = sum(c.before for c in group) / len(group)
        rise = sum(c.after - c.before for c in group) / len(group)
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {learned}/{len(group)} | "
            f"{collapsed}/{len(group)} | {before:.3f} | {rise:+.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
