"""The runs list's per-run read (newest reward, sparkline, ETA: `selectors.run_list_summaries`,
what `/runs/` and every push of `/ws/runs/` read for a run) for a run of 100 steps and one of
100,000 steps, against a baseline measured in the same run: one primary-key read of the
newest metric row of the big run. Private PostgreSQL.

    .venv/bin/python bench/bench_runs_list.py [--steps 100000] [--keys 50] [--repeat 30]

Aim: the big run's read costs about what the small run's does (its cost must not grow with
the run: the list socket re-reads a run's row at every step of it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    from bench._console import console

    with console("bench-list-"):
        return _bench(args.steps, args.keys, args.repeat)


def _median_ms(fn: object, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def _bench(steps: int, keys: int, repeat: int) -> int:
    import json

    from django.db import connection
    from django.utils import timezone

    from bench._console import fixture, running_attempt
    from console.runs import selectors
    from console.runs.models import Run

    fx = fixture()
    started = timezone.now() - timezone.timedelta(days=2)
    other = {f"metric/{i}": 0.5 for i in range(keys - 1)}

    def run_with(n: int) -> Run:
        run = running_attempt(
            fx, name=f"r{n}", state="running", max_steps=2 * n, last_step=n,
            attempt_started_at=started,
        ).run  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                'INSERT INTO runs_metric (run_id, step, "values", updated_at) '
                "SELECT %s, s, %s::jsonb || jsonb_build_object('reward/mean', s::float8 / %s), "
                "now() - make_interval(secs => %s - s) FROM generate_series(1, %s) s",
                [run.pk, json.dumps(other), n, n, n],
            )
            cursor.execute("ANALYZE runs_metric")
        return run

    load = time.perf_counter()
    small, big = run_with(100), run_with(steps)
    took = time.perf_counter() - load
    print(f"stored {steps + 100:,} metric rows of {keys} keys in {took:.0f} s")

    def summaries(run: Run) -> object:
        return lambda: selectors.run_list_summaries([Run.objects.get(pk=run.pk)])

    def baseline() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                'SELECT "values" FROM runs_metric WHERE run_id = %s AND step = %s',
                [big.pk, steps],
            )
            cursor.fetchone()

    for fn in (summaries(small), summaries(big), baseline):  # warm the caches
        fn()  # type: ignore[operator]
    rows = [
        ("baseline: the newest metric row by primary key", *_median_ms(baseline, repeat)),
        ("one run's list read, 100 steps", *_median_ms(summaries(small), repeat)),
        (f"one run's list read, {steps:,} steps", *_median_ms(summaries(big), repeat)),
    ]
    base = rows[0][1]
    print("| read | median ms | p95 ms | median / baseline |")
    print("|---|---|---|---|")
    for name, median, p95 in rows:
        print(f"| {name} | {median:.2f} | {p95:.2f} | {median / base:.1f} |")
    print(f"big / small: {rows[2][1] / rows[1][1]:.2f} (aim: about 1)")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
