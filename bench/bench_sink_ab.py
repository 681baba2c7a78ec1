"""The console's Sink against another version of itself, in one process, call by call in turn:
what a change to `console/runs/sink.py` costs per write, with the machine's load the same for
both (a busy shared machine moves separate runs by more than such a change).

    .venv/bin/python bench/bench_sink_ab.py --old /path/to/other/checkout [--calls 600]

The other version's `console/runs/sink.py` is loaded beside this one (the rest of the console
is this checkout's); each sink writes its own run. Per step: `metrics` (40 keys) and one
`event`, in alternating order; every fifth step a batch of 64 trajectories. Medians, and the
ratio this / other.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="a checkout of the console to compare")
    parser.add_argument("--calls", type=int, default=600)
    args = parser.parse_args()
    from bench._console import console

    with console("bench-sink-ab-"):
        return _bench(Path(args.old) / "console" / "runs" / "sink.py", args.calls)


def _bench(old_path: Path, calls: int) -> int:
    from bench._console import fixture, running_attempt
    from console.runs import sink as this_sink

    spec = importlib.util.spec_from_file_location("other_sink", old_path)
    assert spec is not None and spec.loader is not None
    other_sink = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other_sink)

    fx = fixture()

    def trajectory(step: int) -> dict[str, Any]:
        return {
            "messages": [], "prompt": "p", "completion": "c" * 800, "observations": [],
            "reward": {"total": 1.0, "breakdown": {}, "details": {}}, "finish_reason": "stop",
            "response_tokens": 5, "task_id": "1",
            "provenance": {"step": step, "policy_version": step, "domain": "d"},
        }  # fmt: skip

    values = {f"key/{k}": k / 7 for k in range(40)}
    event = {"reason": "tick", "stages": [{"name": "rollout", "s": 0.5}] * 4}
    sinks = {
        "this": this_sink.ConsoleSink(running_attempt(fx)),
        "other": other_sink.ConsoleSink(running_attempt(fx)),
    }
    times: dict[str, list[float]] = {
        f"{name} {what}": [] for name in sinks for what in ("metrics", "event", "trajectories")
    }
    for step in range(1, calls + 1):
        order = list(sinks.items()) if step % 2 else list(reversed(sinks.items()))
        for name, sink in order:
            start = time.perf_counter()
            sink.metrics(step, values)
            times[f"{name} metrics"].append(time.perf_counter() - start)
            start = time.perf_counter()
            sink.event("bench.tick", {**event, "step": step})
            times[f"{name} event"].append(time.perf_counter() - start)
            if step % 5 == 0:
                batch = [trajectory(step) for _ in range(64)]
                start = time.perf_counter()
                sink.trajectories(batch)
                times[f"{name} trajectories"].append(time.perf_counter() - start)
    for what in ("metrics", "event", "trajectories"):
        this = statistics.median(times[f"this {what}"]) * 1e6
        other = statistics.median(times[f"other {what}"]) * 1e6
        count = len(times[f"this {what}"])
        print(f"{what:12} this {this:7.0f} us   other {other:7.0f} us   this/other "
              f"{this / other:.2f}   (medians of {count})")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
