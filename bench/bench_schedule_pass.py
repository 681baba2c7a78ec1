"""One scheduler pass on the real database: `console.scheduling.services.schedule_pass()` (the
advisory lock, reading the fleet and the queue into the policy's views, the policy, writing
the decisions back) against the policy alone on the same views, in the same run, on a private
PostgreSQL.

    .venv/bin/python bench/bench_schedule_pass.py [--hosts 125] [--gpus 8] [--queued 2000]
                                                   [--passes 20]

The fleet is full (one 1-GPU run per GPU, running), with `--queued` runs waiting in three
classes from 20 teams; the first pass records every waiting reason and files the high class's
preemption requests, later passes find nothing changed (the steady state of a busy fleet,
what the periodic tick costs). The policy's own speed on a larger simulated fleet is
`bench/bench_scheduler.py`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()

    from bench._console import console

    with console("bench-sched-"):
        return _bench(args.hosts, args.gpus, args.queued, args.passes)


def _bench(hosts: int, gpus: int, queued: int, passes: int) -> int:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from console.accounts.models import Team
    from console.runs.models import (
        Allocation,
        Attempt,
        Host,
        ModelVersion,
        RegisteredModel,
        Run,
    )
    from console.scheduling import policy
    from console.scheduling import services as scheduling
    from console.scheduling.models import (
        DecisionKind,
        PriorityClass,
        SchedulingDecision,
        TeamQuota,
    )

    rng = random.Random(0)
    now = timezone.now()
    user = get_user_model().objects.create(username="bench")
    teams = [Team.objects.create(slug=f"team-{i}", name=f"Team {i}") for i in range(20)]
    model = RegisteredModel.objects.create(team=teams[0], slug="m", title="m", created_by=user)
    version = ModelVersion.objects.create(
        model=model, number=1, path="/m", status="published", created_by=user,
        published_at=now, published_by=user,
    )  # fmt: skip
    normal = scheduling.default_class()
    low = PriorityClass.objects.create(name="batch", value=10)
    high = PriorityClass.objects.create(name="urgent", value=1000, can_preempt=True,
                                        preemptible=False)  # fmt: skip
    pool = scheduling.default_pool()
    for team in teams:
        TeamQuota.objects.create(team=team, pool=pool, gpus=hosts * gpus // len(teams))
    fleet = Host.objects.bulk_create(
        Host(name=f"h{i:03d}", gpu_slots=gpus, heartbeat_at=now, pool=pool) for i in range(hosts)
    )

    def run(state: str, cls: PriorityClass, team: Team, size: int, **fields: object) -> Run:
        return Run(team=team, created_by=user, name=f"r-{state}", request={}, pins={},
                   spec={"batch": {"prompts_per_step": 8, "group_size": 4}},
                   model_version=version, gpus=size, state=state, priority_class=cls,
                   queued_at=now, max_steps=1000, **fields)  # type: ignore[arg-type]  # fmt: skip

    running = Run.objects.bulk_create(
        run("running", rng.choice([normal, low]), rng.choice(teams), 1, last_step=50)
        for _ in range(hosts * gpus)
    )
    attempts = Attempt.objects.bulk_create(
        Attempt(run=r, number=1, host=fleet[i // gpus], state="running", started_at=now)
        for i, r in enumerate(running)
    )
    # What the scheduler counts as in use: each attempt's allocation (one host each here).
    Allocation.objects.bulk_create(
        Allocation(attempt=a, run=a.run, host=a.host, node_rank=0, gpus=1, state="running")
        for a in attempts
    )
    # each running run's placement decision, which preemptible backfill's reads look up
    SchedulingDecision.objects.bulk_create(
        SchedulingDecision(run=a.run, kind=DecisionKind.PLACED, reason=f"placed on {a.host.name}")
        for a in attempts
    )
    classes = [low] * 6 + [normal] * 3 + [high]
    Run.objects.bulk_create(
        run("queued", rng.choice(classes), rng.choice(teams), rng.choice([1, 1, 2, 4, 8]))
        for _ in range(queued)
    )
    print(f"{hosts} hosts x {gpus} GPUs, all busy ({len(running)} running runs), {queued} queued")

    policy_s: list[float] = []
    real_schedule = policy.schedule

    def timed_schedule(**kwargs: object) -> policy.Decisions:
        start = time.perf_counter()
        try:
            return real_schedule(**kwargs)  # type: ignore[arg-type]
        finally:
            policy_s.append(time.perf_counter() - start)

    scheduling.policy.schedule = timed_schedule  # type: ignore[assignment]
    loans_s: list[float] = []
    real_loans = scheduling._loans

    def timed_loans(*args: object) -> tuple[set[int], dict[int, int]]:
        start = time.perf_counter()
        try:
            return real_loans(*args)  # type: ignore[arg-type]
        finally:
            loans_s.append(time.perf_counter() - start)

    scheduling._loans = timed_loans  # type: ignore[assignment]
    pass_s = []
    first = None
    profile = None
    if os.environ.get("BENCH_PROFILE"):
        import cProfile

        profile = cProfile.Profile()
    for index in range(passes + 1):
        if profile is not None and index == 1:
            profile.enable()
        start = time.perf_counter()
        result = scheduling.schedule_pass()
        elapsed = time.perf_counter() - start
        if index == 0:
            first = (elapsed, result)
        else:
            pass_s.append(elapsed)
    from console.broadcast import flush_soon

    flush_soon(timeout=120)  # the pages' notices, before Redis stops
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    assert first is not None
    elapsed, result = first
    print(
        f"first pass: {elapsed * 1000:.0f} ms (policy {policy_s[0] * 1000:.0f} ms): "
        f"{len(result.placed)} placed, {result.waiting} reasons recorded, "
        f"{len(result.filed)} preemption requests filed"
    )
    steady = policy_s[1:]
    p50, p50_policy = statistics.median(pass_s), statistics.median(steady)
    p99 = sorted(pass_s)[max(0, int(len(pass_s) * 0.99) - 1)]
    print(f"| what | p50 | max of {passes} |")
    print("|---|---|---|")
    print(f"| policy alone (same views, same pass) | {p50_policy * 1000:.1f} ms | "
          f"{max(steady) * 1000:.1f} ms |")  # fmt: skip
    print(
        f"| whole pass (lock, reads, policy, writes) | {p50 * 1000:.1f} ms | {p99 * 1000:.1f} ms |"
    )
    print(
        f"| of it, preemptible backfill's reads (`_loans`) | "
        f"{statistics.median(loans_s[1:]) * 1000:.1f} ms | {max(loans_s[1:]) * 1000:.1f} ms |"
    )
    print(f"whole pass / policy alone: {p50 / p50_policy:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
