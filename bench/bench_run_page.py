"""The run page's server time, and its websocket snapshot's, with a large run stored: the same
pages for a run 100x smaller measured in the same run (the ratio shows whether the time
depends on how much a run stored), on a private PostgreSQL.

    .venv/bin/python bench/bench_run_page.py [--trajectories 1000000] [--points 10000000]
                                             [--small 100] [--repeats 40]

Data, bulk-loaded with COPY: ``--points`` metric values (one row per step with ~100 keys: the
names training/metrics.py writes for 8 domains), ``--trajectories`` trajectories spread over
those steps (~1 kB each), one ``step.timeline`` event per step, a state event and a checkpoint
every 1,000 steps. The small run has ``--small`` times less of everything.

Timed with Django's test client (a logged-in member; the whole request: middleware, session,
access check, queries, template): ``GET /runs/<id>/`` (the run page), the htmx parts it loads
(``?part=live`` every few seconds, the steps card), and `console.runs.live.snapshot` (the
websocket's first message). p50/p95 over ``--repeats`` requests, and the queries each one ran.

Aims (issue 16): the run page p95 <= 200 ms with 1M trajectories and 10M metric points, and the
query count bounded and independent of size.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOMAINS = [f"domain{i}" for i in range(8)]
CRITERIA = ["answer", "format", "length", "tools"]


def metric_keys() -> list[str]:
    keys = [
        "reward/mean", "reward/std", "critic/score/mean", "pass_rate", "response_length/mean",
        "response_length/clip_ratio", "frac_reward_zero_std", "batch/discarded_fraction",
        "perf/throughput", "perf/num_tokens", "perf/rollout_tokens_per_s", "actor/kl",
        "actor/entropy", "actor/grad_norm", "actor/pg_loss", "actor/pg_clipfrac", "actor/lr",
        "critic/advantages/mean", "batch/kept_fraction", "policy_version", "kl_coef",
        "sampling/temperature", *(f"timing_s/{s}" for s in
                                  ("rollout", "tools", "reward", "train", "weight_sync", "step")),
    ]  # fmt: skip
    for domain in DOMAINS:
        keys += [f"reward/{domain}/mean", f"reward/{domain}/std", f"pass_rate/{domain}"]
        keys += [f"reward/{domain}/{c}/{s}" for c in CRITERIA for s in ("mean", "std")]
        keys += [f"mix/{domain}/weight"]
    return keys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trajectories", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=100, help="the small run is N times smaller")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()

    from bench._console import console

    with console("bench-run-page-", own_var_dir=False):
        return _bench(args)


def _copy(table: str, columns: list[str], lines: Any) -> None:
    """COPY text lines (tab-separated, already escaped) in chunks of ~8 MB."""
    from django.db import connection, transaction

    names = ", ".join(f'"{c}"' for c in columns)
    with (
        transaction.atomic(),
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy,
    ):
        buffer = io.StringIO()
        for line in lines:
            buffer.write(line)
            if buffer.tell() > 8_000_000:
                copy.write(buffer.getvalue())
                buffer = io.StringIO()
        copy.write(buffer.getvalue())


def _load(run: Any, attempt: Any, steps: int, trajectories: int) -> None:
    from django.utils import timezone

    from console.runs import rollup
    from console.runs.models import Run
    from console.runs.sink import TRAJECTORY_COLUMNS

    now = timezone.now().isoformat()
    rng = random.Random(run.pk)
    keys = metric_keys()

    def metric_lines() -> Any:
        for step in range(1, steps + 1):
            values = {k: round(rng.random(), 6) for k in keys}
            yield f"{run.pk}\t{step}\t{json.dumps(values)}\t{now}\n"

    _copy("runs_metric", ["run_id", "step", "values", "updated_at"], metric_lines())

    completion = "Let me think step by step. 17 * 23 = 391, so the answer is 391. " * 8
    per_step = max(trajectories // steps, 1)

    def trajectory_lines() -> Any:
        for n in range(trajectories):
            step, index = 1 + n // per_step, n % per_step
            group = index // 8
            domain = DOMAINS[group % len(DOMAINS)]
            reward = rng.random()
            discarded = "zero_variance" if group % 5 == 4 else ""
            data = {
                "messages": [{"role": "user", "content": "What is 17 * 23?"},
                             {"role": "assistant", "content": completion}],
                "prompt": "What is 17 * 23?", "completion": completion, "observations": [],
                "reward": {"total": reward, "breakdown": {"answer": reward}, "details": {}},
                "finish_reason": "stop", "response_tokens": 120, "task_id": str(group),
                "discarded": discarded or None,
                "provenance": {"run": run.name, "step": step, "policy_version": step - 1,
                               "domain": domain, "group": group, "rubric_version": 1,
                               "rubric_digest": "1:abcdef", "sandbox_image": None},
            }  # fmt: skip
            row = (run.pk, attempt.pk, step, index, domain, reward, step - 1, group, 1, "stop",
                   120, discarded, json.dumps(data), now)  # fmt: skip
            yield "\t".join(str(v) for v in row) + "\n"

    _copy("runs_trajectory", list(TRAJECTORY_COLUMNS), trajectory_lines())

    def event_lines() -> Any:
        for step in range(1, steps + 1):
            stages = [
                {"stage": stage, "start_s": i * 0.5, "end_s": i * 0.5 + 0.4, "rank": rank}
                for rank in range(2)
                for i, stage in enumerate(("rollout", "reward", "train", "weight_sync"))
            ]
            data = {"step": step, "step_s": 2.0 + rng.random(), "stages": stages}
            yield f"{run.pk}\t{attempt.pk}\tstep.timeline\t{step}\t{json.dumps(data)}\t{now}\n"
            if step % 1000 == 0:
                data = {"from": "running", "to": "running", "reason": f"step {step}"}
                yield f"{run.pk}\t{attempt.pk}\trun.state\t{step}\t{json.dumps(data)}\t{now}\n"

    _copy(
        "runs_runevent",
        ["run_id", "attempt_id", "kind", "step", "data", "created_at"],
        event_lines(),
    )

    def checkpoint_lines() -> Any:
        for step in range(1000, steps + 1, 1000):
            yield f"{run.pk}\t{attempt.pk}\t{step}\t/ckpt/{step}\tperiodic\t{step}\t{now}\n"

    _copy(
        "runs_checkpoint",
        ["run_id", "attempt_id", "step", "path", "reason", "policy_version", "created_at"],
        checkpoint_lines(),
    )
    # What the migration does for runs stored before the sink kept these (the sink keeps them
    # as it writes): the chart buckets and the trajectory count.
    rollup.rebuild(run.pk)
    Run.objects.filter(pk=run.pk).update(
        last_step=steps, max_steps=steps * 2, trajectories_stored=trajectories
    )


def _timed(call: Callable[[], Any], repeats: int) -> tuple[float, float, int]:
    """p50 and p95 in milliseconds, and the queries of one call."""
    from django.db import connection

    call()  # warm: templates compiled, plans cached
    queries: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        call()
    if os.environ.get("BENCH_QUERIES"):
        for sql in queries:
            print(f"  {' '.join(sql.split())[:150]}")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return statistics.median(times), p95, len(queries)


def _bench(args: argparse.Namespace) -> int:
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from bench._console import fixture, running_attempt
    from console.runs import live
    from console.runs.models import Run

    settings.ALLOWED_HOSTS = ["*"]
    fx = fixture(host="bench-host", role="researcher")
    user = fx.user
    keys = len(metric_keys())
    sizes = {
        "small": (args.points // args.small, args.trajectories // args.small),
        "large": (args.points, args.trajectories),
    }
    runs = {}
    for label, (points, trajectories) in sizes.items():
        attempt = running_attempt(
            fx, name=f"bench-{label}",
            pins={"domains": [{"slug": d, "domain_id": i + 1, "weight": 1.0,
                               "rubric_version": 1, "taskset_version": 1}
                              for i, d in enumerate(DOMAINS)]},
            state="running", started_at=timezone.now(),
        )  # fmt: skip
        run = attempt.run
        start = time.perf_counter()
        steps = max(points // keys, 1)
        _load(run, attempt, steps, trajectories)
        print(
            f"{label}: {steps:,} steps x {keys} keys = {steps * keys:,} metric points, "
            f"{trajectories:,} trajectories, {steps:,} timelines; "
            f"loaded in {time.perf_counter() - start:.0f} s",
            flush=True,
        )
        runs[label] = run
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")

    client = Client()
    client.force_login(user)
    if os.environ.get("BENCH_PROFILE"):
        import cProfile
        import pstats

        for label, run in runs.items():
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(5):
                client.get(f"/runs/{run.pk}/")
            profile.disable()
            print(f"--- run page, {label} run, 5 requests")
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)

    def get(url: str, **headers: str) -> Callable[[], Any]:
        def call() -> Any:
            response = client.get(url, **headers)
            assert response.status_code == 200, (url, response.status_code)
            b"".join(response) if response.streaming else response.content  # noqa: B018
            return response

        return call

    htmx = {"HTTP_HX_REQUEST": "true"}
    targets: dict[str, Callable[[Run], Callable[[], Any]]] = {
        "run page": lambda run: get(f"/runs/{run.pk}/"),
        "live part (htmx poll)": lambda run: get(f"/runs/{run.pk}/?part=live", **htmx),
        "steps card (htmx)": lambda run: get(f"/runs/{run.pk}/steps/", **htmx),
        "websocket snapshot": lambda run: lambda: live.snapshot(run.pk),
    }
    results: dict[tuple[str, str], tuple[float, float, int]] = {}
    for name, make in targets.items():
        for label, run in runs.items():
            results[(name, label)] = _timed(make(run), args.repeats)
    print(f"\n{'':24} {'small p50':>10} {'p95':>8} {'q':>3}   {'large p50':>10} {'p95':>8} "
          f"{'q':>3}   large/small p95")  # fmt: skip
    for name in targets:
        s50, s95, sq = results[(name, "small")]
        l50, l95, lq = results[(name, "large")]
        print(f"{name:24} {s50:8.1f}ms {s95:6.1f}ms {sq:3d}   {l50:8.1f}ms {l95:6.1f}ms {lq:3d}"
              f"   {l95 / max(s95, 1e-9):5.2f}x")  # fmt: skip
    page95 = results[("run page", "large")][1]
    print(
        f"\nrun page p95 with the large run: {page95:.1f} ms (aim <= 200 ms); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
