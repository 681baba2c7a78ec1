"""Trajectory ingest: the console's Sink against raw COPY and row-by-row ORM inserts of the same
rows, in the same run, on a private PostgreSQL.

    .venv/bin/python bench/bench_runs.py [--rows 20000] [--batch 256]

- **raw COPY**: the rows, already as tuples, COPYed straight into runs_trajectory (the floor).
- **console Sink**: `ConsoleSink.trajectories(batch)` from trajectory dicts (what a job does:
  row building, JSON, COPY into a staging table, INSERT ... ON CONFLICT, the notice).
- **ORM**: `TrajectoryRecord.objects.create` per row (on a tenth of the rows).
- **metrics and events** (``--calls``): `ConsoleSink.metrics(step, values)` and
  `ConsoleSink.event(kind, data)` per call, each against the same row written by one plain
  statement in autocommit (one round trip and one commit), call by call in turn; medians.

Aims (issue "Runs"): Sink >= 50 % of raw COPY, and >= 20x the ORM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    from bench._console import console

    with console("bench-runs-"):
        return _bench(args.rows, args.batch, args.calls)


def _bench(total: int, batch: int, calls: int) -> int:
    from django.db import connection, transaction
    from django.utils import timezone

    from bench._console import fixture, running_attempt
    from console.runs.models import TrajectoryRecord as Row
    from console.runs.sink import TRAJECTORY_COLUMNS, ConsoleSink, trajectory_row

    fx = fixture()

    def item(step: int, group: int) -> dict:
        text = "Let me think. 17 * 23 = 391, so the answer is \\boxed{391}. " * 6
        return {
            "messages": [{"role": "user", "content": "What is 17 * 23?"},
                         {"role": "assistant", "content": text}],
            "prompt": "<|user|>What is 17 * 23?<|assistant|>", "completion": text,
            "observations": [],
            "reward": {"total": 1.0, "breakdown": {"answer": 1.0, "format": 1.0},
                       "details": {"answer": {"extracted": "391"}}},
            "finish_reason": "stop", "response_tokens": 120, "task_id": str(group),
            "provenance": {"run": "b", "step": step, "policy_version": step - 1,
                           "domain": "arithmetic", "group": group // 8, "rubric_version": 1,
                           "rubric_digest": "1:abcdef", "sandbox_image": None},
        }  # fmt: skip

    items = [item(1 + i // 128, i % 128) for i in range(total)]
    print(f"{total} trajectories of {len(str(items[0]))} characters, batches of {batch}")

    # Raw COPY of the same rows (built beforehand: the floor of what PostgreSQL takes).
    attempt = running_attempt(fx)
    now = timezone.now()
    rows = [trajectory_row(attempt.run_id, attempt.pk, i, it, now) for i, it in enumerate(items)]
    columns = ", ".join(f'"{c}"' for c in TRAJECTORY_COLUMNS)
    start = time.perf_counter()
    for offset in range(0, total, batch):
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY runs_trajectory ({columns}) FROM STDIN") as copy,
        ):
            for row in rows[offset : offset + batch]:
                copy.write_row(row)
    copy_s = time.perf_counter() - start

    # The console's Sink, from dicts.
    sink = ConsoleSink(running_attempt(fx))
    profile = None
    if os.environ.get("BENCH_PROFILE"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    start = time.perf_counter()
    for offset in range(0, total, batch):
        sink.trajectories(items[offset : offset + batch])
    sink_s = time.perf_counter() - start
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(18)
    assert sink.written == total

    # Row by row through the ORM, on a tenth of the rows.
    orm_attempt = running_attempt(fx)
    orm_rows = total // 10
    start = time.perf_counter()
    for i, it in enumerate(items[:orm_rows]):
        row = trajectory_row(orm_attempt.run_id, orm_attempt.pk, i, it, now)
        Row.objects.create(
            run_id=row[0], attempt_id=row[1], step=row[2], index=row[3], domain=row[4],
            reward=row[5], policy_version=row[6], task_id=row[7], rubric_version=row[8],
            finish_reason=row[9], response_tokens=row[10], data=it,
        )  # fmt: skip
    orm_s = time.perf_counter() - start

    copy_rate, sink_rate, orm_rate = total / copy_s, total / sink_s, orm_rows / orm_s
    print(f"raw COPY       {copy_rate:10.0f} rows/s")
    print(f"console Sink   {sink_rate:10.0f} rows/s   {sink_rate / copy_rate:.2f}x raw COPY "
          f"(aim >= 0.5)   {sink_rate / orm_rate:.1f}x the ORM (aim >= 20)")  # fmt: skip
    print(f"ORM row by row {orm_rate:10.0f} rows/s   (on {orm_rows} rows)")

    # One step's metrics and one event per call: the sink against one plain statement in
    # autocommit, alternately call by call (both see the same moments of a busy machine), as
    # medians. Most of either is its commit's flush to disk.
    values = {f"key/{k}": k / 7 for k in range(40)}
    event = {"reason": "tick", "stages": [{"name": "rollout", "s": 0.5}] * 4}
    plain = running_attempt(fx)
    sink = ConsoleSink(running_attempt(fx))
    metric_sql = (
        'INSERT INTO runs_metric (run_id, step, "values", updated_at) '
        "VALUES (%s, %s, %s::jsonb, now())"
    )
    event_sql = (
        "INSERT INTO runs_runevent (run_id, attempt_id, kind, step, data, created_at) "
        "VALUES (%s, %s, %s, %s, %s::jsonb, now())"
    )
    times: dict[str, list[float]] = {"metrics": [], "plain metrics": [], "event": [],
                                     "plain event": []}  # fmt: skip
    with connection.cursor() as cursor:
        for step in range(1, calls + 1):
            start = time.perf_counter()
            cursor.execute(metric_sql, [plain.run_id, step, json.dumps(values)])
            times["plain metrics"].append(time.perf_counter() - start)
            start = time.perf_counter()
            sink.metrics(step, values)
            times["metrics"].append(time.perf_counter() - start)
            start = time.perf_counter()
            cursor.execute(
                event_sql, [plain.run_id, plain.pk, "bench.tick", step, json.dumps(event)]
            )
            times["plain event"].append(time.perf_counter() - start)
            start = time.perf_counter()
            sink.event("bench.tick", {**event, "step": step})
            times["event"].append(time.perf_counter() - start)
    median = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    for name in ("metrics", "event"):
        floor = median[f"plain {name}"]
        print(f"{name:14} {median[name]:7.0f} us/call (median)   plain INSERT {floor:5.0f} us"
              f"   {median[name] / floor:.2f}x")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
