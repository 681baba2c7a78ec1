"""``python -m training``: run a spec with no Django.

    python -m training run spec.json [--output DIR] [--control control.json] [--max-steps N]
                                     [--resume latest|none|PATH] [--no-table]
    python -m training example-spec [--steps N] > spec.json     # a demo spec to start from

``run`` shows a progress bar and a compact table of the main metrics (one row per step), and
writes ``metrics.jsonl``, ``trajectories.jsonl``, ``events.jsonl`` and ``checkpoints.jsonl`` to
the output directory (``--output``, else the spec's ``output_dir``, else ``var/runs/<name>``).
``--control`` names a JSON file to steer the run while it goes (`training.control.FileControl`);
SIGTERM or Ctrl-C checkpoints and stops (a second Ctrl-C stops at once).

Under a launcher (``deepspeed --num_gpus 2 --module training run spec.json`` or ``torchrun
--nproc_per_node 2 -m training run spec.json``) every rank runs the loop; rank 0 alone
writes files and draws the table.

Exit status: 0 completed, 3 preempted, 4 cancelled, 1 failed, 2 the spec is invalid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.control import FileControl, SignalControl, StaticControl
from training.metrics import MAIN_METRICS
from training.sink import JsonlSink, NullSink
from training.spec import RunSpec, SpecError

EXIT_CODES = {"completed": 0, "failed": 1, "preempted": 3, "cancelled": 4}

_SHORT_NAMES = {
    "reward/mean": "reward",
    "pass_rate": "pass",
    "response_length/mean": "len",
    "actor/kl": "kl",
    "actor/entropy": "entropy",
    "actor/pg_loss": "pg_loss",
    "actor/grad_norm": "grad",
    "frac_reward_zero_std": "flat",
    "perf/throughput": "tok/s",
    "timing_s/step": "s/step",
}


def _format(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    magnitude = abs(value)
    if magnitude != 0 and (magnitude >= 1e4 or magnitude < 1e-3):
        return f"{value:.2e}"
    return f"{value:.4g}"


# Events a person watching the terminal must see (the rest go to events.jsonl only).
_SHOWN_EVENTS = frozenset(
    {
        "run.failed",
        "run.preempted",
        "run.cancelled",
        "run.collapsed",
        "run.collapse_recovered",
        "train.skipped",
        "batch.short",
        "sink.trajectories_dropped",
    }
)


class ConsoleSink:
    """Forwards to a `JsonlSink` and draws a progress bar plus one table row per step."""

    def __init__(self, inner: JsonlSink, total_steps: int, table: bool = True) -> None:
        from tqdm import tqdm

        self.inner = inner
        self.table = table
        self.bar = tqdm(total=total_steps, unit="step", file=sys.stderr, dynamic_ncols=True)
        self.header_shown = False

    def _write(self, line: str) -> None:
        self.bar.write(line, file=sys.stdout)
        sys.stdout.flush()

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        self.inner.trajectories(items)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.inner.metrics(step, values)
        if "eval/reward/mean" in values:
            self._write(
                f"eval @ step {step}: reward {_format(values['eval/reward/mean'])} "
                f"± {_format(values.get('eval/reward/sem'))}, "
                f"pass {_format(values.get('eval/pass_rate'))}"
            )
            return
        if self.table:
            columns = ["step"] + [_SHORT_NAMES[name] for name in MAIN_METRICS]
            if not self.header_shown:
                self._write("  ".join(f"{c:>9}" for c in columns))
                self.header_shown = True
            cells = [str(step)] + [_format(values.get(name)) for name in MAIN_METRICS]
            self._write("  ".join(f"{c:>9}" for c in cells))
        self.bar.n = step
        self.bar.set_postfix(reward=_format(values.get("reward/mean")), refresh=False)
        self.bar.refresh()

    def checkpoint(self, info: dict[str, Any]) -> None:
        self.inner.checkpoint(info)
        self._write(f"checkpoint @ step {info.get('step')}: {info.get('path')}")

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.inner.event(kind, data)
        if kind in _SHOWN_EVENTS or kind.endswith("_changed"):
            shown = {k: v for k, v in data.items() if k != "traceback"}
            self._write(f"{kind}: {json.dumps(shown, default=str)}")

    def close(self) -> None:
        self.bar.close()
        self.inner.close()


def example_spec(steps: int = 20) -> dict[str, Any]:
    """A GRPO spec on the demo model and the arithmetic and JSON demo domains."""
    from training.demo.domains import get_domain

    domains = []
    for name, weight in (("arithmetic", 1.0), ("json_format", 1.0)):
        domain = get_domain(name)
        domains.append(
            {
                "name": name,
                "weight": weight,
                "rubric_spec": domain.rubric_spec,
                "task_source": {"kind": "demo", "n": 256, "seed": 0},
            }
        )
    return {
        "name": "demo-grpo",
        "base_model": "demo",
        "seed": 0,
        "max_steps": steps,
        "lr": 2e-5,
        "algorithm": {"algorithm": "grpo"},
        "kl": {"coef": 0.0},
        "batch": {"prompts_per_step": 8, "group_size": 4, "micro_batch_tokens": 2048},
        "sampling": {"temperature": 1.0, "max_new_tokens": 48},
        "domains": domains,
        "eval": {"every_steps": 10, "tasks_per_domain": 32},
        "deepspeed": {"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0},
        "rollout": {"engine": "hf"},
        "checkpoint": {"dir": "var/runs/demo-grpo/checkpoints", "every_steps": 10},
        "output_dir": "var/runs/demo-grpo",
    }


def _run_command(args: argparse.Namespace) -> int:
    from training.loop import run

    try:
        spec = RunSpec.from_json_file(args.spec)
        changes: dict[str, Any] = {}
        if args.max_steps is not None:
            changes["max_steps"] = args.max_steps
        if args.resume is not None:
            changes["checkpoint"] = {"resume": args.resume}
        output = Path(args.output or spec.output_dir or Path("var") / "runs" / spec.name)
        changes["output_dir"] = str(output)
        if spec.checkpoint.dir is None:
            changes.setdefault("checkpoint", {})["dir"] = str(output / "checkpoints")
        spec = spec.with_changes(**changes)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    sink: Any = NullSink()
    if rank == 0:
        sink = ConsoleSink(JsonlSink(output), spec.max_steps, table=not args.no_table)
    inner = FileControl(args.control) if args.control else StaticControl()
    control = SignalControl(inner)
    try:
        outcome = run(spec, sink, control)
    finally:
        control.restore()
        if rank == 0:
            sink.close()
    if rank == 0:
        summary = {"status": outcome.status, "step": outcome.step, "checkpoint": outcome.checkpoint}
        if outcome.error:
            summary["error"] = outcome.error
        print(json.dumps(summary))
    return EXIT_CODES.get(outcome.status, 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run a spec (JSON file)")
    run_parser.add_argument("spec", help="the run spec, a JSON file")
    run_parser.add_argument("--output", help="directory for the JSONL files")
    run_parser.add_argument("--control", help="a JSON control file to steer the run live")
    run_parser.add_argument("--max-steps", type=int, help="override the spec's max_steps")
    run_parser.add_argument("--resume", help="latest (default), none, or a checkpoint directory")
    run_parser.add_argument("--no-table", action="store_true", help="no per-step table")
    example = commands.add_parser("example-spec", help="print a demo spec to start from")
    example.add_argument("--steps", type=int, default=20)
    # the DeepSpeed launcher appends --local_rank=N; LOCAL_RANK in the environment says the same
    args, unknown = parser.parse_known_args(argv)
    unknown = [u for u in unknown if not u.startswith("--local_rank")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "example-spec":
        print(json.dumps(example_spec(args.steps), indent=2))
        return 0
    return _run_command(args)
