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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    from console.devservers import PrivateServices

    root = Path(tempfile.mkdtemp(prefix="bench-list-", dir=Path(__file__).parents[1] / "var"))
    services = PrivateServices(root, persistent=False)
    os.environ.update(services.start(dict(os.environ)))
    try:
        return _bench(args.steps, args.keys, args.repeat)
    finally:
        services.stop()


def _median_ms(fn: object, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def _bench(steps: int, keys: int, repeat: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    import json

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from console.accounts.models import Team
    from console.runs import selectors
    from console.runs.models import Attempt, Host, ModelVersion, RegisteredModel, Run

    user = get_user_model().objects.create(username="bench")
    team = Team.objects.create(slug="bench", name="Bench")
    model = RegisteredModel.objects.create(team=team, slug="m", title="m", created_by=user)
    version = ModelVersion.objects.create(
        model=model, number=1, path="/m", status="published", created_by=user,
        published_at=timezone.now(), published_by=user,
    )  # fmt: skip
    host = Host.objects.create(name="bench")
    started = timezone.now() - timezone.timedelta(days=2)
    other = {f"metric/{i}": 0.5 for i in range(keys - 1)}

    def run_with(n: int) -> Run:
        run = Run.objects.create(
            team=team, created_by=user, name=f"r{n}", request={}, spec={}, pins={},
            model_version=version, state="running", max_steps=2 * n, last_step=n,
        )  # fmt: skip
        Attempt.objects.create(run=run, number=1, host=host, state="running", started_at=started)
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
