"""The live stream's delta read (`console.runs.live.delta`) against another version of it, in
one process, read by read in turn: what a change to `console/runs/live.py` costs per read, with
the machine's load the same for both.

    .venv/bin/python bench/bench_delta_ab.py --old /path/to/other/checkout [--reads 100]

A run with 3,000 events and 60 steps of metrics; then per round one writer transaction of 50
events (a metric step every fifth round) and one delta of each version from its own cursors,
in alternating order. Both must send the same events and points (checked every round).
Medians, and the ratio this / other.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="a checkout of the console to compare")
    parser.add_argument("--reads", type=int, default=100)
    args = parser.parse_args()
    from bench._console import console

    with console("bench-delta-ab-"):
        return _bench(Path(args.old) / "console" / "runs" / "live.py", args.reads)


def _bench(old_path: Path, reads: int) -> int:
    from django.db import transaction

    from bench._console import fixture, running_attempt
    from console.runs import live as this_live
    from console.runs.sink import ConsoleSink

    spec = importlib.util.spec_from_file_location("other_live", old_path)
    assert spec is not None and spec.loader is not None
    other_live = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other_live)

    attempt = running_attempt(fixture(host="h"), state="running")
    run = attempt.run
    sink = ConsoleSink(attempt)

    def write(step: int | None) -> None:
        with transaction.atomic():
            for _ in range(50):
                sink.event("bench.tick", {"reason": "tick"})
            if step is not None:
                sink.metrics(step, {"reward/mean": 0.5, "actor/kl": 0.1})

    for step in range(1, 61):
        write(step)
    versions = {"this": this_live, "other": other_live}
    cursors = {name: module.snapshot(run.pk)["cursors"] for name, module in versions.items()}
    times: dict[str, list[float]] = {name: [] for name in versions}
    for i in range(reads):
        write(100 + i if i % 5 == 0 else None)
        order = list(versions) if i % 2 else list(reversed(versions))
        sent = {}
        for name in order:
            start = time.perf_counter()
            message = versions[name].delta(run.pk, cursors[name])
            times[name].append(time.perf_counter() - start)
            cursors[name] = message["cursors"]
            sent[name] = ([e["id"] for e in message["events"]], message["series"])
        assert sent["this"] == sent["other"], f"the two versions sent different rows (read {i})"
    this, other = (statistics.median(times[name]) * 1e3 for name in ("this", "other"))
    print(f"delta of 50 events: this {this:.1f} ms   other {other:.1f} ms   this/other "
          f"{this / other:.2f}   (medians of {reads}, same rows sent)")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
