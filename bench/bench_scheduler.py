"""The scheduler's policy in a discrete-event simulation, against FIFO and strict-priority
baselines run through the same simulator in the same run.

    .venv/bin/python bench/bench_scheduler.py [--jobs 10000] [--seed 14] [--load 0.97]
                                              [--repeat 3] [--conservative]
    .venv/bin/python bench/bench_scheduler.py --seeds 14-19   # the policy with and without
                                                              # loans, across seeds

Fleet: 1,000 GPUs on 125 hosts of 8 GPUs in three pools (h200 64 hosts, h100 40, a100 21).
Work: 10,000 jobs from 500 domains and 20 teams (domains Zipf-distributed over teams); sizes
(GPUs per host, gang width), durations and inter-arrival gaps drawn from heavy-tailed
distributions (seeded); 60 % of jobs name their team's pool, the rest take any pool. Each team
has a quota (guaranteed GPUs) in its home pool; the quotas of a pool add up to the pool.
Classes: prod (may preempt, never preempted), standard and batch (preemptible, auto-approved
when the victim checkpointed less than 30 / 60 minutes ago, otherwise an admin approves after
10 simulated minutes; they reclaim their team's quota from borrowers only after a 15-minute
wait). Jobs checkpoint every 30 minutes of running and a step takes 20 s. A preempted job goes
back to the queue at its old place; it checkpoints on its way out as the console's jobs do (an
approved preemption tells the victim's Control to save a checkpoint at its next step boundary
and stop; it loses the step in flight), or with `--conservative` it loses the work since its
last periodic checkpoint (the count when a victim does not save in its grace period). Either
way the work "at risk" (not in a periodic checkpoint at the stop) is printed, and a price for
restarts (RESTART_S each, not simulated). The scheduler sees each running
job's remaining time as the console estimates it (step rate x steps left), off by a per-job
lognormal factor (sigma 0.3).

At every arrival, finish and preemption stop the simulator calls the policy with the whole
fleet and queue and applies its decisions; the decision time is the time inside that call (wall
and CPU time of the call applied, and the best wall time of `--repeat` calls on the same input:
the pass's own time, with most of the other tenants' share of this machine taken out). After
each pass the simulator notes where its idle GPUs are while work that may run there is queued:
fragments smaller than any queued job asks, capacity a queued one-host job would fit (held for
the head of the queue), whole hosts only wider gangs wait for, capacity around a requester
waiting for its victims to stop.
The policy runs twice, with loans of a gathering head's reserved capacity (preemptible
backfill: jobs that agree to stop when the head can start) and without, so what loans gain
and what they cost (stops, work lost, restarts) are read from the same run.
Baselines, same simulator, same jobs: FIFO (arrival order, no backfill, no preemption, a pool's
first job that does not fit blocks that pool) and strict priority (class, priority, age; same
blocking rule; this module's own code, not the policy's).
"""

from __future__ import annotations

import argparse
import functools
import gc
import heapq
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _load_policy():  # type: ignore[no-untyped-def]
    """The policy module by its path: it is pure Python, and importing the `console` package
    would start Celery's and Django's imports for nothing (and needs the virtualenv)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "console" / "scheduling" / "policy.py"
    spec = importlib.util.spec_from_file_location("scheduling_policy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


_policy = _load_policy()
Allocation = _policy.Allocation
Decisions = _policy.Decisions
HostView = _policy.HostView
JobView = _policy.JobView
Placement = _policy.Placement
PriorityClass = _policy.PriorityClass
Quota = _policy.Quota
schedule = _policy.schedule

POOLS = {"h200": 64, "h100": 40, "a100": 21}
GPUS_PER_HOST = 8
TEAMS = 20
DOMAINS = 500
CHECKPOINT_EVERY_S = 1800.0
STEP_S = 20.0  # a training step (the impact preview's steps_since_checkpoint counts these)
# Not simulated, priced after the run: what a restart might cost the restarted job's GPUs
# (load the model and the checkpoint, warm up) in the printed "restart overhead" figure.
RESTART_S = 120.0
ADMIN_DELAY_S = 600.0
PREEMPT_AFTER_WAIT_S = 900.0  # standard and batch reclaim quota only after a 15-minute wait
CLASSES = {
    "prod": PriorityClass("prod", 100, can_preempt=True, preemptible=False, approval="never"),
    "standard": PriorityClass(
        "standard",
        50,
        False,
        True,
        "auto_recent_checkpoint",
        auto_approve_minutes=30,
        preempt_after_wait_s=PREEMPT_AFTER_WAIT_S,
    ),
    "batch": PriorityClass(
        "batch",
        10,
        False,
        True,
        "auto_recent_checkpoint",
        auto_approve_minutes=60,
        preempt_after_wait_s=PREEMPT_AFTER_WAIT_S,
    ),
}
CLASS_MIX = [("prod", 0.1), ("standard", 0.45), ("batch", 0.45)]

Scheduler = Callable[..., Decisions]
IDLE_KINDS = (
    "fragment",  # 1-7 free GPUs on a host, fewer than any queued job that may run there asks
    "a one-host job fits: held for the head",  # free capacity a queued one-host job fits,
    # kept for the head of the queue (EASY backfill: the job would end after its start)
    "gathering hosts for a gang",  # whole hosts, only gangs wider than what is free wait
    "held while a requester's victims stop",
    "whole host, no queued job fits",
)


@dataclass
class SimJob:
    view: JobView
    arrival: float
    work_s: float  # running time it needs in all
    est_factor: float  # its runtime estimate / the truth (the console's estimate is the
    # measured step rate x the steps left, off by this factor for the whole run)
    done_s: float = 0.0  # work saved at its last checkpoint
    started_at: float | None = None
    first_start: float | None = None
    epoch: int = 0  # bumped at every start/stop, so stale finish events are ignored
    preemptions: int = 0
    lost_gpu_h: float = 0.0
    moving: bool = False  # stopping to be moved (a defragmentation plan), not preempted
    ending_loan: bool = False  # stopping at the end of a loan of a head's capacity
    finished_at: float | None = None
    victims_of_plan: list[int] = field(default_factory=list)


def make_workload(n_jobs: int, seed: int, load: float) -> tuple[list[dict], list[Quota]]:
    rng = random.Random(seed)
    teams = [f"team-{i:02d}" for i in range(TEAMS)]
    # team weights: Zipf-like (a few big teams), domains land on teams by weight
    weights = [1.0 / (i + 1) ** 0.8 for i in range(TEAMS)]
    home = {t: list(POOLS)[i % len(POOLS)] for i, t in enumerate(teams)}
    domain_team = rng.choices(teams, weights=weights, k=DOMAINS)
    quotas = []
    for pool, n_hosts in POOLS.items():
        members = [t for t in teams if home[t] == pool]
        total_w = sum(weights[teams.index(t)] for t in members)
        capacity = n_hosts * GPUS_PER_HOST
        given = 0
        for k, t in enumerate(members):
            share = (
                capacity - given
                if k == len(members) - 1
                else round(capacity * weights[teams.index(t)] / total_w)
            )
            given += share
            quotas.append(Quota(t, pool, share))
    jobs = []
    for i in range(n_jobs):
        domain = rng.randrange(DOMAINS)
        team = domain_team[domain]
        cls = rng.choices([c for c, _ in CLASS_MIX], weights=[w for _, w in CLASS_MIX])[0]
        # sizes: mostly single-host jobs of 1-8 GPUs, a heavy tail of multi-host gangs
        width = min(16, int(rng.paretovariate(1.6))) if rng.random() < 0.25 else 1
        gpus = GPUS_PER_HOST if width > 1 else rng.choices([1, 2, 4, 8], [0.35, 0.25, 0.2, 0.2])[0]
        # durations: lognormal body (median 40 min) with a Pareto tail, 2 min .. 48 h
        if rng.random() < 0.9:
            work = rng.lognormvariate(math.log(2400), 1.0)
        else:
            work = 3600 * rng.paretovariate(1.3)
        work = min(max(work, 120.0), 48 * 3600.0)
        est = work * rng.lognormvariate(0.0, 0.3)
        pool = home[team] if rng.random() < 0.6 else None
        jobs.append(
            {
                "run_id": i + 1,
                "team": team,
                "domain": domain,
                "class_name": cls,
                "priority": rng.randrange(3),
                "gpus": gpus,
                "hosts": width,
                "pool": pool,
                "work": work,
                "est": est,
            }
        )
    # arrivals: bursty (heavy-tailed gaps) at a mean rate that offers `load` x the fleet
    gpu_s = sum(j["gpus"] * j["hosts"] * j["work"] for j in jobs)
    capacity = sum(POOLS.values()) * GPUS_PER_HOST
    mean_gap = gpu_s / (capacity * load) / n_jobs
    t = 0.0
    alpha = 1.5  # Pareto gaps with the right mean: scale = mean * (alpha - 1) / alpha
    for j in jobs:
        t += mean_gap * (alpha - 1) / alpha * rng.paretovariate(alpha)
        j["arrival"] = t
    return jobs, quotas


class Simulation:
    def __init__(
        self,
        workload: list[dict],
        quotas: list[Quota],
        scheduler: Scheduler,
        repeat: int = 1,
        checkpoint_on_stop: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.repeat = repeat  # calls per pass, for the best-of wall time
        # False (the conservative count): a victim loses everything since its last periodic
        # checkpoint. True: as the console does, an approved preemption has the victim save a
        # checkpoint through its Control at its next step boundary before it stops (it loses
        # the step in flight, STEP_S at most).
        self.checkpoint_on_stop = checkpoint_on_stop
        self.quotas = quotas
        self.hosts: list[HostView] = []
        for pool, n in POOLS.items():
            for k in range(n):
                self.hosts.append(
                    HostView(f"{pool}-{k:02d}", pool, GPUS_PER_HOST, 32, GPUS_PER_HOST, 32)
                )
        self.host = {h.name: h for h in self.hosts}
        self.by_pool: dict[str, list[HostView]] = {}
        for h in self.hosts:
            self.by_pool.setdefault(h.pool, []).append(h)
        self.jobs: dict[int, SimJob] = {}
        self.events: list[tuple[float, int, str, int, int]] = []  # (t, seq, kind, run, epoch)
        self.seq = 0
        for w in workload:
            view = JobView(
                run_id=w["run_id"],
                team=w["team"],
                class_name=w["class_name"],
                priority=w["priority"],
                gpus=w["gpus"],
                cpu_slots=0,
                hosts=w["hosts"],
                queued_at=w["arrival"],
                pool=w["pool"],
                est_remaining_s=w["est"],
            )
            self.jobs[w["run_id"]] = SimJob(view, w["arrival"], w["work"], w["est"] / w["work"])
            self.push(w["arrival"], "arrive", w["run_id"], 0)
        self.queued: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.decision_s: list[float] = []  # wall time of each call
        self.decision_cpu_s: list[float] = []  # its CPU time (blind to the other tenants)
        # the shortest wall time of `repeat` calls on the same input (a pass does not change
        # its input): what the pass itself takes, with the other tenants' share mostly removed
        self.decision_best_s: list[float] = []
        self.busy = 0
        self.busy_queued_gpu_s = 0.0
        self.queued_s = 0.0
        self.busy_gpu_s = 0.0
        self.pool_free = {p: n * GPUS_PER_HOST for p, n in POOLS.items()}
        self.pool_busy_gpu_s = 0.0
        self.demand: dict[str | None, int] = {None: 0, **{p: 0 for p in POOLS}}  # queued jobs
        self.pool_cap_gpu_s = 0.0
        self.last_t = 0.0
        self.preemptions = 0
        self.plans = 0
        self.moves = 0  # plans that move runs to free whole hosts
        self.moved = 0  # runs stopped by them
        self.lost_moving_gpu_h = 0.0
        self.loans = 0  # placements lent a head's reserved capacity (preemptible backfill)
        self.loan_gpu_s = 0.0  # GPU-seconds those placements ran
        self.loans_ended = 0  # lent runs stopped for a head
        self.lost_loans_gpu_h = 0.0
        self.loan_plans = 0
        # what the victims had not saved in a periodic checkpoint: the loss when a victim does
        # not checkpoint on its way out (the conservative count), in either mode
        self.at_risk_gpu_h = 0.0
        self.restarts_gpu = 0  # GPUs restarted after a stop (sum of the stopped jobs' widths)
        # where idle GPUs are while work that may run in their pool is queued (GPU-seconds):
        # read from the simulator's own state after each pass, so it holds for any scheduler
        self.idle: dict[str, float] = dict.fromkeys(IDLE_KINDS, 0.0)
        self.pool_state: dict[str, tuple[int, int, bool]] = {}  # see note_queue

    def push(self, t: float, kind: str, run_id: int, epoch: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, run_id, epoch))

    def enqueue(self, job: SimJob) -> None:
        self.queued[job.view.run_id] = job
        self.demand[job.view.pool] += 1

    def advance(self, t: float) -> None:
        dt = t - self.last_t
        if dt > 0:
            self.busy_gpu_s += self.busy * dt
            if self.queued:
                self.busy_queued_gpu_s += self.busy * dt
                self.queued_s += dt
                # per pool: only while something that may run in that pool waits
                for pool in POOLS if self.demand[None] else [p for p in POOLS if self.demand[p]]:
                    cap = POOLS[pool] * GPUS_PER_HOST
                    self.pool_busy_gpu_s += (cap - self.pool_free[pool]) * dt
                    self.pool_cap_gpu_s += cap * dt
                    if self.pool_free[pool]:
                        self.account_idle(pool, dt)
        self.last_t = t

    def account_idle(self, pool: str, dt: float) -> None:
        smallest, single, requester = self.pool_state.get(pool, (0, 0, False))
        idle = self.idle
        for h in self.by_pool[pool]:
            free = h.gpus_free
            if not free:
                continue
            if not smallest or free < smallest:
                kind = "fragment" if free < h.gpus_total else "whole host, no queued job fits"
            elif requester:
                kind = "held while a requester's victims stop"
            elif single and free >= single:
                kind = "a one-host job fits: held for the head"
            else:
                kind = "gathering hosts for a gang"
            idle[kind] += free * dt

    def note_queue(self) -> None:
        """After a pass, per pool: the fewest GPUs per host that a queued job that may run
        there asks for, the same for one-host jobs, and whether a requester of a preemption
        plan waits for its victims there."""
        none = 1 << 30  # no such job queued
        smallest: dict[str | None, int] = {}
        single: dict[str | None, int] = {}
        requester: set[str | None] = set()
        for job in self.queued.values():
            v = job.view
            if v.gpus < smallest.get(v.pool, none):
                smallest[v.pool] = v.gpus
            if v.hosts == 1 and v.gpus < single.get(v.pool, none):
                single[v.pool] = v.gpus
            if v.preemption_requested:
                requester.add(v.pool)
        for pool in POOLS:
            least = min(smallest.get(pool, none), smallest.get(None, none))
            least_single = min(single.get(pool, none), single.get(None, none))
            self.pool_state[pool] = (
                0 if least == none else least,
                0 if least_single == none else least_single,
                pool in requester or None in requester,
            )

    def run(self) -> None:
        while self.events:
            t = self.events[0][0]
            self.advance(t)
            while self.events and self.events[0][0] == t:
                _, _, kind, run_id, epoch = heapq.heappop(self.events)
                job = self.jobs[run_id]
                if kind == "arrive":
                    self.enqueue(job)
                elif kind == "finish" and job.epoch == epoch and run_id in self.running:
                    self.stop(job, t, finished=True)
                elif kind == "preempt" and job.epoch == epoch and run_id in self.running:
                    self.stop(job, t, finished=False)
            self.decide(t)

    def stop(self, job: SimJob, t: float, *, finished: bool) -> None:
        assert job.started_at is not None
        elapsed = t - job.started_at
        width = job.view.gpus * job.view.hosts
        for a in job.view.running_on:
            self.host[a.host].gpus_free += a.gpus
            self.pool_free[self.host[a.host].pool] += a.gpus
        self.busy -= width
        job.view.running_on = []
        job.view.preemption_pending = False
        if job.view.lent:
            self.loan_gpu_s += width * elapsed
            job.view.lent = False
        job.epoch += 1
        del self.running[job.view.run_id]
        if finished:
            job.finished_at = t
            return
        periodic = math.floor(elapsed / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        self.at_risk_gpu_h += width * (elapsed - periodic) / 3600.0
        self.restarts_gpu += width
        every = STEP_S if self.checkpoint_on_stop else CHECKPOINT_EVERY_S
        saved = math.floor(elapsed / every) * every
        job.done_s += saved
        lost = width * (elapsed - saved) / 3600.0
        job.lost_gpu_h += lost
        if job.moving:
            self.moved += 1
            self.lost_moving_gpu_h += lost
            job.moving = False
        if job.ending_loan:
            self.loans_ended += 1
            self.lost_loans_gpu_h += lost
            job.view.lent_stops += 1
            job.ending_loan = False
        job.view.est_remaining_s = max(60.0, (job.work_s - job.done_s) * job.est_factor)
        job.preemptions += 1
        self.preemptions += 1
        self.enqueue(job)  # keeps its queued_at: back at its old place

    def refresh(self, t: float) -> None:
        for job in self.running.values():
            assert job.started_at is not None
            elapsed = t - job.started_at
            v = job.view
            v.est_remaining_s = max(60.0, (job.work_s - job.done_s - elapsed) * job.est_factor)
            age = elapsed % CHECKPOINT_EVERY_S
            v.last_checkpoint_age_s = age
            v.next_checkpoint_in_s = CHECKPOINT_EVERY_S - age
            v.steps_since_checkpoint = int(age // STEP_S)
            v.running_for_s = elapsed

    def decide(self, t: float) -> None:
        if not self.queued:
            self.pool_state.clear()
            return
        self.refresh(t)
        views = [j.view for j in self.running.values()] + [j.view for j in self.queued.values()]
        started, cpu = time.perf_counter(), time.thread_time()
        decisions = self.scheduler(
            hosts=self.hosts, jobs=views, classes=CLASSES, quotas=self.quotas, now=t
        )
        self.decision_cpu_s.append(time.thread_time() - cpu)
        best = wall = time.perf_counter() - started
        self.decision_s.append(wall)
        for _ in range(self.repeat - 1):
            started = time.perf_counter()
            self.scheduler(hosts=self.hosts, jobs=views, classes=CLASSES, quotas=self.quotas, now=t)
            best = min(best, time.perf_counter() - started)
        self.decision_best_s.append(best)
        for p in decisions.placements:
            self.start(self.jobs[p.run_id], p, t)
        for plan in decisions.preemptions:
            self.plans += 1
            requester = self.jobs[plan.requester_run_id]
            requester.view.preemption_requested = True
            delay = 0.0 if plan.auto_approved else ADMIN_DELAY_S
            moving = plan.kind == "move"
            self.moves += moving
            self.loan_plans += plan.kind == "backfill"
            for impact in plan.victims:
                victim = self.jobs[impact.run_id]
                victim.view.preemption_pending = True
                victim.moving = moving
                victim.ending_loan = plan.kind == "backfill"
                grace = CLASSES[victim.view.class_name].grace_s
                self.push(t + delay + grace, "preempt", impact.run_id, victim.epoch)
        self.note_queue()

    def start(self, job: SimJob, placement: Placement, t: float) -> None:
        v = job.view
        assert not v.running_on and v.run_id in self.queued, v.run_id
        for a in placement.allocations:
            h = self.host[a.host]
            assert h.schedulable and h.gpus_free >= a.gpus, (h, a)
            h.gpus_free -= a.gpus
            self.pool_free[h.pool] -= a.gpus
        assert len({a.host for a in placement.allocations}) == v.hosts
        v.running_on = list(placement.allocations)
        v.lent = placement.lent_to is not None
        self.loans += v.lent
        del self.queued[v.run_id]
        self.demand[v.pool] -= 1
        self.running[v.run_id] = job
        job.started_at = t
        v.preemption_requested = False  # its request is done once it runs
        if job.first_start is None:
            job.first_start = t
        job.epoch += 1
        self.busy += v.gpus * v.hosts
        self.push(t + job.work_s - job.done_s, "finish", v.run_id, job.epoch)


def blocking_baseline(order: Callable[[JobView], tuple]) -> Scheduler:
    """A baseline: jobs in `order`, best fit, the first job of a pool that does not fit blocks
    that pool (a job for any pool blocks every pool); no backfill, quotas or preemption."""

    def baseline(
        *,
        hosts: list[HostView],
        jobs: list[JobView],
        classes: dict[str, PriorityClass],
        quotas: list[Quota],
        now: float,
    ) -> Decisions:
        d = Decisions()
        free = {h.name: h.gpus_free for h in hosts if h.schedulable}
        by_pool: dict[str, list[str]] = {}
        for h in hosts:
            if h.schedulable:
                by_pool.setdefault(h.pool, []).append(h.name)
        blocked: set[str] = set()
        queue = sorted((j for j in jobs if not j.running_on), key=order)
        for n, job in enumerate(queue):
            if len(blocked) == len(by_pool):  # every pool blocked: the rest all wait
                d.waiting.update((j.run_id, "waiting: pool blocked") for j in queue[n:])
                break
            pools = [job.pool] if job.pool else list(by_pool)
            if any(p in blocked for p in pools):
                d.waiting[job.run_id] = "waiting: pool blocked"
                if job.pool is None:
                    blocked.update(pools)
                continue
            for p in pools:
                fits = sorted((free[h], h) for h in by_pool[p] if free[h] >= job.gpus)
                if len(fits) >= job.hosts:
                    chosen = [h for _, h in fits[: job.hosts]]
                    for h in chosen:
                        free[h] -= job.gpus
                    d.placements.append(
                        Placement(job.run_id, [Allocation(h, job.gpus, 0) for h in chosen], "")
                    )
                    break
            else:
                d.waiting[job.run_id] = "waiting: does not fit"
                blocked.update(pools)
        return d

    return baseline


def full_fleet_pass(n_queued: int, seed: int, repeats: int = 30) -> tuple[float, float, int]:
    """The worst case for one pass: every GPU busy (1,000 one-GPU runs of every team) and
    `n_queued` runs waiting (1/2/4/8 GPUs, 10 % prod). CPU ms of one pass: median, max; and
    how many requests a pass files."""
    rng = random.Random(seed)
    hosts = [
        HostView(f"{pool}-{k:02d}", pool, GPUS_PER_HOST, 32, 0, 32)
        for pool, n in POOLS.items()
        for k in range(n)
    ]
    teams = [f"team-{i:02d}" for i in range(TEAMS)]
    quotas = [
        Quota(t, pool, n * GPUS_PER_HOST // TEAMS) for pool, n in POOLS.items() for t in teams
    ]
    jobs = []
    for h in hosts:
        for _ in range(GPUS_PER_HOST):
            jobs.append(
                JobView(
                    len(jobs) + 1,
                    rng.choice(teams),
                    rng.choice(["standard", "batch"]),
                    0,
                    1,
                    0,
                    1,
                    0.0,
                    pool=h.pool,
                    est_remaining_s=rng.uniform(60, 7200),
                    running_on=[Allocation(h.name, 1, 0)],
                    last_checkpoint_age_s=rng.uniform(0, 1800),
                )
            )
    for i in range(n_queued):
        jobs.append(
            JobView(
                len(jobs) + 1,
                rng.choice(teams),
                rng.choices(["prod", "standard", "batch"], [1, 4.5, 4.5])[0],
                rng.randrange(3),
                rng.choice([1, 2, 4, 8]),
                0,
                1,
                float(i),
                pool=rng.choice([*POOLS, None]),
            )
        )
    times = []
    plans = 0
    for _ in range(repeats):
        cpu = time.thread_time()
        d = schedule(hosts=hosts, jobs=jobs, classes=CLASSES, quotas=quotas, now=0.0)
        times.append((time.thread_time() - cpu) * 1000)
        plans = len(d.preemptions)
    return statistics.median(times), max(times), plans


def summarize(sim: Simulation, name: str) -> dict:
    n_gpus = sum(POOLS.values()) * GPUS_PER_HOST
    jobs = list(sim.jobs.values())
    assert all(j.finished_at is not None for j in jobs), f"{name}: unfinished jobs"
    waits = {c: [] for c in CLASSES}
    team_waits: dict[str, list[float]] = {}
    for j in jobs:
        assert j.first_start is not None
        w = (j.first_start - j.arrival) / 60.0
        waits[j.view.class_name].append(w)
        team_waits.setdefault(j.view.team, []).append(w)
    team_means = [statistics.fmean(v) for v in team_waits.values()]
    gang_waits = [(j.first_start or 0.0) - j.arrival for j in jobs if j.view.hosts > 1]
    gang_waits = [w / 3600.0 for w in gang_waits]
    end = max(j.finished_at or 0.0 for j in jobs)
    return {
        "passes": len(sim.decision_s),
        "p50": pct(sim.decision_s, 0.5) * 1000,
        "p99": pct(sim.decision_s, 0.99) * 1000,
        "cpu50": pct(sim.decision_cpu_s, 0.5) * 1000,
        "cpu99": pct(sim.decision_cpu_s, 0.99) * 1000,
        "best50": pct(sim.decision_best_s, 0.5) * 1000,
        "best99": pct(sim.decision_best_s, 0.99) * 1000,
        "util_queued": sim.busy_queued_gpu_s / (n_gpus * sim.queued_s) * 100,
        "util": sim.busy_gpu_s / (n_gpus * end) * 100,
        "util_pool": sim.pool_busy_gpu_s / sim.pool_cap_gpu_s * 100,
        "idle": {k: v / sim.pool_cap_gpu_s * 100 for k, v in sim.idle.items()},
        "work_gpu_h": sum(j.view.gpus * j.view.hosts * j.work_s for j in jobs) / 3600.0,
        "waits": {c: (statistics.fmean(v), pct(v, 0.95)) for c, v in waits.items()},
        "team_best": min(team_means),
        "team_worst": max(team_means),
        "jain": jain(team_means),
        "lost": sum(j.lost_gpu_h for j in jobs),
        "preemptions": sim.preemptions,
        "plans": sim.plans,
        "makespan_h": end / 3600.0,
        "moves": sim.moves,
        "moved": sim.moved,
        "lost_moving": sim.lost_moving_gpu_h,
        "loans": sim.loans,
        "loan_gpu_h": sim.loan_gpu_s / 3600.0,
        "loans_ended": sim.loans_ended,
        "loan_plans": sim.loan_plans,
        "lost_loans": sim.lost_loans_gpu_h,
        # how often a job was stopped at the end of a loan: the most, and how many jobs were
        # stopped more than once (thrashing, if any, shows here)
        "loan_stops_max": max((j.view.lent_stops for j in jobs), default=0),
        "at_risk": sim.at_risk_gpu_h,
        "restart_gpu_h": sim.restarts_gpu * RESTART_S / 3600.0,
        "stopped_twice": sum(1 for j in jobs if j.view.lent_stops >= 2),
        # gangs wait longest (they gather hosts): their tail shows starvation, if any
        "gang_wait_h": (pct(gang_waits, 0.95), max(gang_waits, default=0.0)),
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 1.0


def one_seed(
    seed: int, n_jobs: int, load: float, moves: bool = True, lend: bool = True, ckpt: bool = True
) -> dict:
    workload, quotas = make_workload(n_jobs, seed, load)
    scheduler = functools.partial(schedule, moves=moves, lend=lend)
    sim = Simulation(workload, quotas, scheduler, checkpoint_on_stop=ckpt)
    sim.run()
    return summarize(sim, f"seed {seed}")


def across_seeds(args: argparse.Namespace) -> int:
    """Utilisation per pool while queued (the aim), the policy without and with loans of a
    head's capacity (preemptible backfill), over seeds; with victims that checkpoint on their
    way out (as the console's do) and, conservatively, with victims that lose the work since
    their last periodic checkpoint."""
    import concurrent.futures

    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    load_before = os.getloadavg()
    modes = [(lend, ckpt) for ckpt in (True, False) for lend in (False, True)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        runs = {
            (seed, lend, ckpt): pool.submit(one_seed, seed, args.jobs, args.load, True, lend, ckpt)
            for seed in seeds
            for lend, ckpt in modes
        }
        results = {key: future.result() for key, future in runs.items()}
    print(f"{args.jobs} jobs, offered load {args.load}; the policy without / with loans")
    for ckpt in (True, False):
        print(
            "\nvictims "
            + (
                "checkpoint on their way out (as the console's do)"
                if ckpt
                else "lose the work since their last periodic checkpoint (conservative)"
            )
        )
        print(
            "seed | per pool while queued | fleet while queued | lost GPU-h (by ended loans) | "
            "at risk GPU-h | loans / ended / most per job | lent GPU-h | "
            "wait batch / standard mean | gang wait p95 / max"
        )
        for seed in seeds:
            off, on = results[(seed, False, ckpt)], results[(seed, True, ckpt)]
            print(
                f"{seed} | {off['util_pool']:.1f} / {on['util_pool']:.1f} % | "
                f"{off['util_queued']:.1f} / {on['util_queued']:.1f} % | "
                f"{off['lost']:.0f} / {on['lost']:.0f} ({on['lost_loans']:.0f}) | "
                f"{off['at_risk']:.0f} / {on['at_risk']:.0f} | "
                f"{on['loans']} / {on['loans_ended']} / {on['loan_stops_max']} | "
                f"{on['loan_gpu_h']:.0f} | "
                f"{off['waits']['batch'][0]:.0f} / {off['waits']['standard'][0]:.0f}, "
                f"{on['waits']['batch'][0]:.0f} / {on['waits']['standard'][0]:.0f} min | "
                f"{off['gang_wait_h'][0]:.1f} / {off['gang_wait_h'][1]:.1f} h, "
                f"{on['gang_wait_h'][0]:.1f} / {on['gang_wait_h'][1]:.1f} h"
            )
        for label, key in (("per pool", "util_pool"), ("fleet", "util_queued")):
            for lend in (False, True):
                values = [results[(seed, lend, ckpt)][key] for seed in seeds]
                print(
                    f"{label}, {'with' if lend else 'without'} loans: mean "
                    f"{statistics.fmean(values):.2f} %, min {min(values):.2f} %"
                )
        for lend in (False, True):
            rs = [results[(seed, lend, ckpt)] for seed in seeds]
            work = sum(r["work_gpu_h"] for r in rs)
            lost, risk = sum(r["lost"] for r in rs), sum(r["at_risk"] for r in rs)
            print(
                f"{'with' if lend else 'without'} loans: lost {lost:.0f} GPU-h "
                f"({lost / work * 100:.2f} % of the work), at risk {risk:.0f} "
                f"({risk / work * 100:.2f} %), restart overhead at {RESTART_S:.0f} s each "
                f"{sum(r['restart_gpu_h'] for r in rs):.0f} GPU-h, "
                f"jobs stopped at the end of 2+ loans {sum(r['stopped_twice'] for r in rs)}"
            )
    print(
        "load average (1 / 5 / 15 min) at the start: "
        + " / ".join(f"{x:.2f}" for x in load_before)
        + ", at the end: "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--load", type=float, default=0.97, help="offered load / fleet")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="calls of each pass (same input) for the best-of wall time; the first is the one "
        "applied and the one the plain wall and CPU figures time",
    )
    parser.add_argument(
        "--seeds",
        help="e.g. 14-19: only the policy with and without loans (preemptible backfill), with "
        "victims that checkpoint on stop and with the conservative count, one run per seed "
        "(two at a time), and the utilisation table across seeds",
    )
    parser.add_argument(
        "--conservative",
        action="store_true",
        help="victims lose the work since their last periodic checkpoint (default: they "
        "checkpoint on their way out, as the console's do on an approved preemption)",
    )
    args = parser.parse_args()
    if args.seeds:
        return across_seeds(args)
    load_before = os.getloadavg()

    workload, quotas = make_workload(args.jobs, args.seed, args.load)
    # the workload lives for the whole run: keep the collector from rescanning it in every
    # timed call (a long-lived scheduler process would do the same with its own state)
    gc.collect()
    gc.freeze()
    classes = CLASSES

    def strict_key(j: JobView) -> tuple:
        return (-classes[j.class_name].value, -j.priority, j.queued_at, j.run_id)

    contenders: list[tuple[str, Scheduler]] = [
        ("FIFO", blocking_baseline(lambda j: (j.queued_at, j.run_id))),
        ("strict priority", blocking_baseline(strict_key)),
        # the same policy without loans of a head's capacity (preemptible backfill): what
        # they gain, and cost
        ("policy, no loans", functools.partial(schedule, lend=False)),
        ("policy", schedule),
    ]
    n_gpus = sum(POOLS.values()) * GPUS_PER_HOST
    print(
        f"{args.jobs} jobs, {len(set(w['domain'] for w in workload))} domains, {TEAMS} teams, "
        f"{n_gpus} GPUs on {sum(POOLS.values())} hosts, offered load {args.load}, "
        f"seed {args.seed}; "
        + (
            "victims lose the work since their last periodic checkpoint (--conservative)"
            if args.conservative
            else "victims checkpoint on their way out, as the console's do"
        )
    )
    results = {}
    for name, scheduler in contenders:
        sim = Simulation(workload, quotas, scheduler, args.repeat, not args.conservative)
        wall = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - wall
        results[name] = summarize(sim, name)
        results[name]["wall"] = wall
        print(f"  {name}: simulated in {wall:.1f} s", flush=True)

    names = [n for n, _ in contenders]
    rows = [
        ("scheduling passes", lambda r: f"{r['passes']}"),
        ("decision time p50", lambda r: f"{r['p50']:.2f} ms"),
        ("decision time p99", lambda r: f"{r['p99']:.2f} ms"),
        ("decision CPU time p50 / p99", lambda r: f"{r['cpu50']:.2f} / {r['cpu99']:.2f} ms"),
        (
            f"decision time p50 / p99, best of {args.repeat}",
            lambda r: f"{r['best50']:.2f} / {r['best99']:.2f} ms",
        ),
        ("GPU utilisation while work is queued", lambda r: f"{r['util_queued']:.1f} %"),
        (
            "GPU utilisation of pools their queued work may use",
            lambda r: f"{r['util_pool']:.1f} %",
        ),
        ("GPU utilisation overall (to last finish)", lambda r: f"{r['util']:.1f} %"),
        ("makespan", lambda r: f"{r['makespan_h']:.1f} h"),
    ]
    for c in CLASSES:
        rows.append(
            (
                f"wait {c}: mean / p95",
                lambda r, c=c: f"{r['waits'][c][0]:.0f} / {r['waits'][c][1]:.0f} min",
            )
        )
    rows += [
        (
            "team mean wait: best / worst",
            lambda r: f"{r['team_best']:.0f} / {r['team_worst']:.0f} min",
        ),
        ("Jain fairness of team mean waits", lambda r: f"{r['jain']:.2f}"),
        ("preemption plans / victims stopped", lambda r: f"{r['plans']} / {r['preemptions']}"),
        ("of them moves / runs moved", lambda r: f"{r['moves']} / {r['moved']}"),
        (
            "GPU-hours lost to preemption",
            lambda r: f"{r['lost']:.0f} ({r['lost'] / r['work_gpu_h'] * 100:.2f} % of the work)",
        ),
        ("of them by moved runs", lambda r: f"{r['lost_moving']:.0f}"),
        ("of them by runs stopped at the end of a loan", lambda r: f"{r['lost_loans']:.0f}"),
        (
            "at risk: not in a periodic checkpoint when stopped",
            lambda r: f"{r['at_risk']:.0f} ({r['at_risk'] / r['work_gpu_h'] * 100:.2f} %)",
        ),
        (
            f"restart overhead at {RESTART_S:.0f} s a restart (not simulated)",
            lambda r: f"{r['restart_gpu_h']:.0f} GPU-h",
        ),
        (
            "loans / ended (stopped) / most per job",
            lambda r: f"{r['loans']} / {r['loans_ended']} / {r['loan_stops_max']}",
        ),
        ("GPU-hours run on lent capacity", lambda r: f"{r['loan_gpu_h']:.0f}"),
        (
            "gang wait p95 / max",
            lambda r: f"{r['gang_wait_h'][0]:.1f} / {r['gang_wait_h'][1]:.1f} h",
        ),
    ]
    widths = [max(len(label) for label, _ in rows)] + [max(16, len(n)) for n in names]
    print()
    print(
        " | ".join(
            ["what".ljust(widths[0])] + [n.ljust(w) for n, w in zip(names, widths[1:], strict=True)]
        )
    )
    for label, fmt in rows:
        cells = [fmt(results[n]).ljust(w) for n, w in zip(names, widths[1:], strict=True)]
        print(" | ".join([label.ljust(widths[0])] + cells))
    print(
        "\nidle GPUs of pools their queued work may use, by kind "
        "(% of those pools' capacity; after each pass):"
    )
    for kind in IDLE_KINDS:
        cells = [
            f"{results[n]['idle'][kind]:.1f} %".ljust(w)
            for n, w in zip(names, widths[1:], strict=True)
        ]
        print(" | ".join([kind.ljust(widths[0])] + cells))
    base = results["strict priority"]
    pol = results["policy"]
    print(
        f"\npolicy decision time vs strict-priority baseline (same run): "
        f"p50 {pol['p50'] / base['p50']:.1f}x, p99 {pol['p99'] / base['p99']:.1f}x; "
        f"aim p99 <= 5 ms: {'met' if pol['p99'] <= 5 else 'not met'} "
        f"(best of {args.repeat} p99 {pol['best99']:.2f} ms: "
        f"{'met' if pol['best99'] <= 5 else 'not met'}; "
        f"CPU time p99 {pol['cpu99']:.2f} ms: {'met' if pol['cpu99'] <= 5 else 'not met'}); "
        f"aim utilisation while queued >= 95 %: "
        f"{'met' if pol['util_queued'] >= 95 else 'not met'} for the fleet, "
        f"{'met' if pol['util_pool'] >= 95 else 'not met'} per pool"
    )
    print(
        "load average (1 / 5 / 15 min) at the start: "
        + " / ".join(f"{x:.2f}" for x in load_before)
        + ", after the simulations: "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print("\none pass on a full fleet (every GPU busy), CPU time over 30 passes:")
    for n_queued in (200, 2000):
        median, worst, plans = full_fleet_pass(n_queued, args.seed)
        print(
            f"  {n_queued:>5} queued: median {median:.1f} ms, max {worst:.1f} ms, "
            f"{plans} preemption request(s) per pass"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
