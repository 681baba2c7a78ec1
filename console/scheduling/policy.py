"""The scheduler's policy: pure Python over an in-memory view of the fleet and the queue.

No Django import here: the console's scheduler service (`console.scheduling.services`) reads
the database into these views under a PostgreSQL advisory lock, calls `schedule()`, and
writes the decisions back; the unit tests and `bench/bench_scheduler.py` call `schedule()` on
views they build themselves.

The dataclasses below are the interface agreed with the console side (fields may be added
with defaults; names and meanings stay). The algorithm follows them; it is measured by
`python -m bench scheduler`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

Approval = Literal["ask", "auto_recent_checkpoint", "never"]


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int  # higher runs first
    can_preempt: bool  # its runs may preempt runs of lower classes
    preemptible: bool  # its runs may be preempted
    approval: Approval  # how a preemption of this class's runs is approved
    auto_approve_minutes: float = 0.0  # with "auto_recent_checkpoint": victim saved < N min ago
    grace_s: float = 60.0  # SIGTERM -> SIGKILL grace on preemption
    # Added by the policy: its runs ask for a preemption only when, without one, they would
    # wait longer than this (judged from the running jobs' est_remaining_s); 0: at once.
    preempt_after_wait_s: float = 0.0


@dataclass(frozen=True)
class Quota:
    team: str
    pool: str
    gpus: int  # guaranteed GPUs (CPU-only pools: slots) in that pool; weight for fair share


@dataclass
class HostView:
    name: str
    pool: str
    gpus_total: int
    cpu_total: int
    gpus_free: int
    cpu_free: int
    schedulable: bool = True  # False when cordoned, draining, or offline


@dataclass
class Allocation:
    host: str
    gpus: int
    cpu_slots: int


@dataclass
class JobView:
    run_id: int
    team: str
    class_name: str
    priority: int  # within the class; higher first
    gpus: int  # GPUs per host (0: a CPU job using cpu_slots per host)
    cpu_slots: int
    hosts: int  # gang: starts on exactly this many hosts at once, or not at all
    queued_at: float  # seconds (any epoch); FIFO tie-break
    pool: str | None = None  # None: any pool
    est_remaining_s: float = 3600.0  # for backfill and the resume estimate
    running_on: list[Allocation] = field(default_factory=list)  # empty: queued
    # Impact preview inputs (running jobs only):
    last_checkpoint_age_s: float | None = None  # since what a restart resumes (None: running_for_s)
    steps_since_checkpoint: int = 0
    next_checkpoint_in_s: float | None = None
    rollouts_in_flight: int = 0
    preemption_pending: bool = False  # already a victim of an open request
    # Added by the policy (defaults keep older callers working):
    # A queued job whose own preemption request is open or approved and that has not started
    # yet (the console clears it when the job starts, or the request is rejected or expires):
    # it gets no second request, and goes first in its class to take what its victims free.
    preemption_requested: bool = False
    running_for_s: float = 0.0  # since it last started; the loss when it never checkpointed
    # Added for preemptible backfill (`Placement.lent_to`): a running job placed on capacity
    # held for the head of its pool's queue, on the terms that it is stopped (through a
    # preemption request like any other) once a head of its class or a higher one could start
    # there without it. The console reads it from the run's placement decision.
    lent: bool = False
    # How often this job was stopped on those terms; it is lent capacity again only while this
    # is below LEND_MAX_STOPS, so a job is not started and stopped over and over.
    lent_stops: int = 0


@dataclass
class Placement:
    run_id: int
    allocations: list[Allocation]
    reason: str  # "placed on host-3", "placed on host-3 by backfill", ...
    # Preemptible backfill: the head of the queue whose reserved capacity this job is lent; it
    # is stopped when a head can start there (the console marks the job `lent` from then on).
    lent_to: int | None = None


# Why a preemption plan stops its victims (`PreemptionPlan.kind`).
PlanKind = Literal["preempt", "move", "backfill"]
PLAN_KINDS: tuple[PlanKind, ...] = ("preempt", "move", "backfill")


@dataclass
class VictimImpact:
    run_id: int
    gpu_hours_since_checkpoint: float
    steps_lost: int
    next_checkpoint_in_s: float | None
    rollouts_in_flight: int
    expected_resume_s: float | None  # seconds from now until it is expected to run again


@dataclass
class PreemptionPlan:
    requester_run_id: int
    victims: list[VictimImpact]
    auto_approved: bool  # the victims' classes' policy approves without a person
    reason: str  # for people: the console reads the plan's purpose from `kind`, never from this
    # "preempt" (a class preempts, or a team reclaims its quota), "move" (runs moved to free
    # whole hosts) or "backfill" (runs lent a head's capacity, stopped now that it can start);
    # the console stores it as the request's `purpose`
    kind: PlanKind = "preempt"


@dataclass
class Decisions:
    placements: list[Placement] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # run_id -> reason it waits
    preemptions: list[PreemptionPlan] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# The algorithm.
#
# Order: classes by value; within a class, teams by fair share (usage in each pool relative to
# their quota there, the dominant pool counting), re-ranked after every placement; within a
# team, priority then age. Each job is tried against the free-capacity index of its pool's
# lane (one lane per pool and resource: GPUs, or CPU slots for CPU jobs). The first job in a
# lane that does not fit becomes that lane's head: it gets a reservation at the earliest time
# its gang fits (from the running jobs' est_remaining_s), and later jobs start only if they end
# before that time or leave the reserved hosts what the head needs (EASY backfill). A blocked
# job whose class may preempt, or whose team is under its quota while others borrow in the
# pool (Kueue's reclaimWithinCohort), gets a preemption plan instead; it starts in a later pass
# once the victims have stopped.
#
# Victims: preemptible classes whose approval is not "never", not already stopping; for a class
# preemption any lower class, for a reclaim the borrowers (teams over their quota in the pool)
# of the same or a lower class. Per host the cheapest set that frees enough (borrowers first,
# then lower class, then GPU-hours since the last checkpoint); of the hosts, those whose sets
# hold the fewest non-borrowers, then cost least, then have fewest victims. Only a team's first
# blocked job per lane searches in a pass, and a failed search is remembered for jobs it
# dominates, so a long queue behind a full pool costs little.
#
# Moves: a blocked job that no preemption serves may have one-host runs moved (checkpointed,
# stopped, restarted at once in other hosts' free units) to empty the hosts it needs, when the
# free units are there but in fragments; the moved runs' class policy must auto-approve it
# (`_Pass.try_move`). It is filed as a preemption plan and goes through the same approval path.
#
# Loans (preemptible backfill): a job that would run past the head's start may still take the
# head's reserved units, when its class may be preempted with auto-approval and is not above
# the head's; it is placed "by backfill until run N can start". The head's reservation counts
# such jobs as gone once stopped, and when the rest of its hosts are about to be free, it files
# a "backfill" plan that stops them (`_Pass.try_end_loans`), through the same approval path.

_INF = float("inf")
PREEMPTION_SEARCHES = 4  # per lane (pool and resource) and pass
AHEAD_IN_ESTIMATE = 8  # queued jobs a victim's resume estimate plays out before it
MOVE_SEARCHES = 2  # searches for runs to move, per lane and pass
# Preemptible backfill: a job is lent a head's reserved capacity only when the head starts at
# least this far ahead (a shorter loan costs a stop and a restart for little use), and only
# while it has been stopped at the end of a loan fewer than LEND_MAX_STOPS times.
LEND_MIN_S = 600.0
LEND_MAX_STOPS = 4
# Lent jobs are stopped this long before the head's other hosts are expected to be free (the
# time a job takes to save a checkpoint at its next step and exit, roughly; at most its grace).
LOAN_END_LEAD_S = 60.0
# How a lent job's placement reason says so, for people ("placed on host-3 by backfill until
# run 12 can start (then stopped for it)"). The console never reads state back from reasons:
# it stores `Placement.lent_to` and `PreemptionPlan.kind` as fields, so rewording these is safe.
LENT_MARK = " by backfill until run "
# How the reason of a plan that ends loans says so (for people, as LENT_MARK).
LOAN_END_MARK = ": stopping backfilled run(s) "


class _Index:
    """Free units per host, bucketed by how many are free, so "H hosts with N free?" is a few
    dict lookups instead of a scan of the pool."""

    __slots__ = ("free", "buckets", "total")

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.buckets: dict[int, dict[str, None]] = {}
        self.total = 0  # free units over all hosts

    def set(self, host: str, units: int) -> None:
        old = self.free.get(host)
        if old is not None:
            if old == units:
                return
            bucket = self.buckets[old]
            del bucket[host]
            if not bucket:
                del self.buckets[old]
            self.total -= old
        self.total += units
        self.free[host] = units
        self.buckets.setdefault(units, {})[host] = None

    def count(self, need: int) -> int:
        return sum(len(b) for units, b in self.buckets.items() if units >= need)

    def pick(
        self,
        need: int,
        n: int,
        ends: dict[str, float] | None = None,
        end: float = 0.0,
        prefer: dict[str, int] | None = None,
    ) -> list[str] | None:
        """Best fit: the n fullest hosts that still have `need` free, or None.

        With `prefer` (the hosts reserved for the head of the queue, given for a job that
        ends before the head starts), those hosts come first: they would idle until the head
        starts, while the others can take the jobs that run past it.

        With `ends` (per host, when the last of its jobs ends), a one-host job goes, before
        best fit, to a host it does not keep busy longer (its jobs end after this job does);
        among those the fullest, then the one whose jobs end closest to its own `end`. A host
        then frees whole, not in fragments that the jobs wanting a whole host cannot use."""
        if n == 1 and ends is not None:
            best: tuple[bool, bool, int, float, str] | None = None
            for units in sorted(u for u in self.buckets if u >= need):
                for host in self.buckets[units]:
                    last = ends.get(host, 0.0)
                    key = (
                        prefer is not None and host not in prefer,
                        last < end or last <= 0.0,  # it would outlast the host's jobs
                        units,
                        abs(last - end),
                        host,
                    )
                    if best is None or key < best:
                        best = key
            return None if best is None else [best[-1]]
        chosen: list[str] = []
        for first in (True, False) if prefer else (False,):
            for units in sorted(u for u in self.buckets if u >= need):
                for host in self.buckets[units]:
                    if prefer and (host in prefer) != first:
                        continue
                    chosen.append(host)
                    if len(chosen) == n:
                        return chosen
        return None


@dataclass
class _Reservation:
    run_id: int
    value: int  # the head's class value: jobs of its class or a lower one may be lent
    start: float  # the head's earliest start (absolute, same epoch as `now`)
    slack: dict[str, int]  # reserved host -> units a job running past `start` may still use
    long: _Index  # free units usable by jobs that run past `start`


class _Lane:
    """One pool's capacity of one resource (GPUs, or CPU slots) on its schedulable hosts."""

    def __init__(self, pool: str, gpu: bool, now: float, classes: dict[str, PriorityClass]) -> None:
        self.pool = pool
        self.gpu = gpu
        self.unit = "GPUs" if gpu else "CPU slots"
        self.now = _Index()
        self.total: dict[str, int] = {}
        self.jobs: list[JobView] = []  # running jobs with an allocation on this lane
        self.placed: list[tuple[float, str, int, int]] = []  # this pass's placements
        self.reservation: _Reservation | None = None
        self.failed_preemptions: list[tuple[int, int, int, bool]] = []
        self.preempt_tried: set[str] = set()  # teams that tried a preemption here this pass
        self.moves_tried = 0  # searches for runs to move in this lane in this pass
        self.unmovable: set[tuple[int, int]] = set()  # shapes no move can free in this pass
        self.unfit: set[tuple[int, int, bool]] = set()  # (units, hosts, past the head's start)
        self.unfit_lent: set[tuple[int, int]] = set()  # shapes no loan of reserved units fits
        self._t = now
        self._classes = classes
        self._releases: list[tuple[float, str, int, int]] | None = None
        self._running: dict[str, list[JobView]] | None = None
        self._victims: dict[str, list[tuple[int, float, int, JobView]]] | None = None
        self._fit_hosts: dict[int, int] = {}
        self._ends: dict[str, float] | None = None
        self._sorted: tuple[int, list[tuple[float, str, int, int]]] | None = None
        self._lent: list[JobView] | None = None  # running jobs lent a head's capacity
        self._head: dict[tuple[int, bool, int], list[tuple[float, str, int, int]]] = {}

    def sorted_releases(self) -> list[tuple[float, str, int, int]]:
        """`releases` sorted by end; sorted again only after this pass placed more jobs."""
        if self._sorted is None or self._sorted[0] != len(self.placed):
            self._sorted = (len(self.placed), sorted(self.releases))
        return self._sorted[1]

    def lent_jobs(self) -> list[JobView]:
        """The lane's running jobs lent a head's capacity (listed once per pass)."""
        if self._lent is None:
            self._lent = [j for j in self.jobs if j.lent]
        return self._lent

    def head_releases(self, value: int, stopped: bool = True) -> list[tuple[float, str, int, int]]:
        """`sorted_releases` as a head of class `value` sees them: the lent jobs of its class
        or a lower one end as soon as they can be stopped for it (their class's grace), or
        with `stopped=False` at once (as if they were not there)."""
        if not self.lent_jobs():
            return self.sorted_releases()
        key = (value, stopped, len(self.placed))
        cached = self._head.get(key)
        if cached is not None:
            return cached
        ends: dict[int, float] = {}
        for job in self.lent_jobs():
            cls = self._classes.get(job.class_name)
            if cls is not None and cls.value <= value:
                ends[job.run_id] = self._t + (cls.grace_s if stopped else 0.0)
        base = self.sorted_releases()
        if ends:  # few: merged into the sorted list, not sorted again with it
            moved = sorted((min(e, ends[r]), h, u, r) for e, h, u, r in base if r in ends)
            base = list(heapq.merge(moved, (x for x in base if x[3] not in ends)))
        self._head[key] = base
        return base

    def lent_table(self, value: int) -> dict[str, list[tuple[int, float, JobView]]]:
        """Per host, the lent jobs a head of class `value` may have stopped (not already
        stopping) as (units here, cost, job)."""
        table: dict[str, list[tuple[int, float, JobView]]] = {}
        for job in self.lent_jobs():
            cls = self._classes.get(job.class_name)
            if job.preemption_pending or cls is None or cls.value > value:
                continue
            cost = _victim_cost(job)
            for a in job.running_on:
                if a.host in self.total:
                    units = a.gpus if self.gpu else a.cpu_slots
                    table.setdefault(a.host, []).append((units, cost, job))
        return table

    @property
    def ends(self) -> dict[str, float]:
        """Per host, when the last of its running jobs (and this pass's placements) ends."""
        if self._ends is None:
            self._ends = {}
            for end, h, _, _ in self.releases:
                if end > self._ends.get(h, 0.0):
                    self._ends[h] = end
        return self._ends

    def fits_ever(self, need: int, n: int) -> bool:
        count = self._fit_hosts.get(need)
        if count is None:
            count = self._fit_hosts[need] = sum(1 for t in self.total.values() if t >= need)
        return count >= n

    @property
    def releases(self) -> list[tuple[float, str, int, int]]:
        """(end, host, units, run_id) of every running job and this pass's placements; a
        victim of an open request ends after its class's grace period."""
        if self._releases is None:
            self._releases = []
            for job in self.jobs:
                end = self._t + max(0.0, job.est_remaining_s)
                if job.preemption_pending:
                    cls = self._classes.get(job.class_name)
                    end = min(end, self._t + (cls.grace_s if cls else 60.0))
                for a in job.running_on:
                    if a.host in self.total:
                        units = a.gpus if self.gpu else a.cpu_slots
                        self._releases.append((end, a.host, units, job.run_id))
        return self._releases + self.placed

    def victim_table(
        self, classes: dict[str, PriorityClass]
    ) -> dict[str, list[tuple[int, float, int, JobView]]]:
        """Per host, the running jobs a preemption may stop at all (class preemptible, approval
        not "never", not already stopping) as (class value, cost, units here, job), cheapest
        first; built once per pass, shared by every search."""
        if self._victims is None:
            self._victims = {}
            for host, jobs in self.running.items():
                rows = []
                for v in jobs:
                    vcls = classes.get(v.class_name)
                    if (
                        vcls is None
                        or not vcls.preemptible
                        or vcls.approval == "never"
                        or v.preemption_pending
                    ):
                        continue
                    units = sum(
                        a.gpus if self.gpu else a.cpu_slots for a in v.running_on if a.host == host
                    )
                    rows.append((vcls.value, _victim_cost(v), units, v))
                rows.sort(key=lambda r: (r[0], r[1], r[3].run_id))
                self._victims[host] = rows
        return self._victims

    @property
    def running(self) -> dict[str, list[JobView]]:
        if self._running is None:
            self._running = {}
            for job in self.jobs:
                for a in job.running_on:
                    if a.host in self.total:
                        self._running.setdefault(a.host, []).append(job)
        return self._running

    def take(self, hosts: list[str], need: int, end: float, run_id: int) -> None:
        res = self.reservation
        for h in hosts:
            self.now.set(h, self.now.free[h] - need)
            self.placed.append((end, h, need, run_id))
            if self._ends is not None and end > self._ends.get(h, 0.0):
                self._ends[h] = end
            if res is not None:
                if end > res.start and h in res.slack:
                    res.slack[h] -= need
                res.long.set(h, max(0, min(self.now.free[h], res.slack.get(h, 1 << 30))))

    def hold(self, hosts: list[str], need: int) -> None:
        """Keep free units on these hosts for a requester waiting on its victims."""
        for h in hosts:
            kept = min(self.now.free[h], need)
            self.now.set(h, self.now.free[h] - kept)
            if self.reservation is not None:
                r = self.reservation
                r.long.set(h, max(0, min(self.now.free[h], r.slack.get(h, 1 << 30))))

    def earliest(
        self,
        need: int,
        n: int,
        now: float,
        free: dict[str, int] | None = None,
        releases: list[tuple[float, str, int, int]] | None = None,
    ) -> tuple[float, list[str], dict[str, int]] | None:
        """When `n` hosts first have `need` free as running jobs end: (time, the hosts, free
        units per host at that time), or None when it never fits. `releases`, when given, are
        sorted by end."""
        free = dict(self.now.free if free is None else free)
        fitting = [h for h, u in free.items() if u >= need]
        if len(fitting) >= n:
            return now, fitting[:n], free
        if releases is None:
            releases = self.sorted_releases()
        for end, h, units, _ in releases:
            before = free[h]
            free[h] = before + units
            if before < need <= free[h]:
                fitting.append(h)
                if len(fitting) >= n:
                    return max(end, now), fitting[:n], free
        return None


def _units(job: JobView) -> int:
    return job.gpus if job.gpus > 0 else job.cpu_slots


def _victim_cost(job: JobView) -> float:
    age = job.last_checkpoint_age_s if job.last_checkpoint_age_s is not None else job.running_for_s
    return job.gpus * max(1, len(job.running_on)) * age / 3600.0


def _auto_approves(cls: PriorityClass, job: JobView) -> bool:
    return (
        cls.approval == "auto_recent_checkpoint"
        and job.last_checkpoint_age_s is not None
        and job.last_checkpoint_age_s < cls.auto_approve_minutes * 60.0
    )


class _Pass:
    def __init__(
        self,
        hosts: list[HostView],
        jobs: list[JobView],
        classes: dict[str, PriorityClass],
        quotas: list[Quota],
        now: float,
        moves: bool = True,
        lend: bool = True,
    ) -> None:
        self.now = now
        self.moves = moves
        self.lend = lend
        self.classes = classes
        self.decisions = Decisions()
        self.queued: list[JobView] = []
        running: list[JobView] = []
        want_gpu = want_cpu = False  # the lanes this pass needs
        for job in jobs:
            if job.running_on:
                running.append(job)
            elif job.gpus > 0:
                self.queued.append(job)
                want_gpu = True
            else:
                self.queued.append(job)
                want_cpu = True
        self.lanes: dict[tuple[str, bool], _Lane] = {}
        self.pool_of: dict[str, str] = {}
        gpu_pools: set[str] = set()
        lanes = self.lanes
        for h in hosts:
            name, pool = h.name, h.pool
            self.pool_of[name] = pool
            if h.gpus_total > 0:
                gpu_pools.add(pool)
            if not h.schedulable:
                continue
            for gpu, total, free in (
                (True, h.gpus_total, h.gpus_free) if want_gpu else (False, 0, 0),
                (False, h.cpu_total, h.cpu_free) if want_cpu else (False, 0, 0),
            ):
                if total <= 0:
                    continue
                lane = lanes.get((pool, gpu))
                if lane is None:
                    lane = lanes[(pool, gpu)] = _Lane(pool, gpu, now, classes)
                index = lane.now
                if free < 0:
                    free = 0
                index.free[name] = free
                index.total += free
                bucket = index.buckets.get(free)
                if bucket is None:
                    bucket = index.buckets[free] = {}
                bucket[name] = None
                lane.total[name] = total
        self.pools = sorted(set(self.pool_of.values()))
        # quota in units of the pool's quota resource: GPUs where the pool has GPUs, else slots
        self.quota: dict[tuple[str, str], int] = {(q.team, q.pool): q.gpus for q in quotas}
        self.quota_pools = {q.pool for q in quotas}
        self.quota_gpu = {p: p in gpu_pools for p in self.pools}
        self.usage: dict[tuple[str, str], int] = {}
        self.team_usage: dict[str, int] = {}
        self.victims: set[int] = set()
        self._shares: dict[str, tuple[float, int]] = {}
        self._waiting: dict[tuple[str, bool], list[tuple[tuple[int, int, float, int], JobView]]]
        self._waiting = {}
        self._pinned: dict[tuple[str, bool], int] = {}
        # the same shape of job in the same state of a lane waits for the same reason
        self._reasons: dict[tuple[str, bool, int, int, str, int, bool, bool], str] = {}
        # per host once: its pool, whether that pool's quota counts GPUs, and its lanes; so
        # each running allocation below costs one lookup
        quota_gpu = self.quota_gpu
        where_of: dict[str, tuple[str, bool, _Lane | None, _Lane | None]] = {
            name: (pool, quota_gpu[pool], lanes.get((pool, True)), lanes.get((pool, False)))
            for name, pool in self.pool_of.items()
        }
        usage, team_usage = self.usage, self.team_usage
        for job in running:
            gpu = job.gpus > 0
            seen: _Lane | None = None
            team = job.team
            for a in job.running_on:
                info = where_of.get(a.host)
                if info is None:
                    continue
                where, counts_gpus, gpu_lane, cpu_lane = info
                if counts_gpus == gpu:
                    units = a.gpus if gpu else a.cpu_slots
                    key = (team, where)
                    usage[key] = usage.get(key, 0) + units
                    team_usage[team] = team_usage.get(team, 0) + units
                lane = gpu_lane if gpu else cpu_lane
                if lane is not None and lane is not seen:
                    lane.jobs.append(job)
                    seen = lane

    # -- order ----------------------------------------------------------------------------

    def share(self, team: str) -> tuple[float, int]:
        """Fair-share key: the team's dominant usage/quota over pools (no quota: infinite once
        it uses anything), then its total usage."""
        cached = self._shares.get(team)
        if cached is not None:
            return cached
        worst = 0.0
        for pool in self.quota_pools:
            used = self.usage.get((team, pool), 0)
            if used:
                q = self.quota.get((team, pool), 0)
                worst = max(worst, used / q if q > 0 else _INF)
        share = self._shares[team] = (worst, self.team_usage.get(team, 0))
        return share

    def order(self) -> list[tuple[list[JobView], list[list[JobView]]]]:
        """Queued jobs grouped by class (highest value first); in each class the requesters of
        open preemption requests first (their victims were stopped for them), then the others
        by team, each team's jobs by priority then age."""
        by_class: dict[int, tuple[list[JobView], dict[str, list[JobView]]]] = {}
        for job in self.queued:
            cls = self.classes.get(job.class_name)
            value = cls.value if cls else 0
            group = by_class.get(value)
            if group is None:
                group = by_class[value] = ([], {})
            if job.preemption_requested:
                group[0].append(job)
            else:
                group[1].setdefault(job.team, []).append(job)
        groups = []
        for value in sorted(by_class, reverse=True):
            requesters, teams = by_class[value]
            requesters.sort(key=lambda j: (j.queued_at, j.run_id))
            for team_jobs in teams.values():
                team_jobs.sort(key=lambda j: (-j.priority, j.queued_at, j.run_id))
            groups.append((requesters, list(teams.values())))
        return groups

    def run(self) -> Decisions:
        for requesters, team_lists in self.order():
            for job in requesters:
                self.consider(job)
            if len(team_lists) == 1:
                for job in team_lists[0]:
                    self.consider(job)
                continue
            # fair share: the team furthest below its quota next, re-ranked after each job
            heap = [
                (self.share(jobs[0].team), jobs[0].team, i, 0) for i, jobs in enumerate(team_lists)
            ]
            heapq.heapify(heap)
            while heap:
                _, team, i, k = heapq.heappop(heap)
                self.consider(team_lists[i][k])
                if k + 1 < len(team_lists[i]):
                    heapq.heappush(heap, (self.share(team), team, i, k + 1))
        return self.decisions

    # -- one job --------------------------------------------------------------------------

    def consider(self, job: JobView) -> None:
        gpu = job.gpus > 0
        need = _units(job)
        if need < 1 or job.hosts < 1:
            self.wait(job, "waiting: asks for no GPUs or CPU slots, or for no hosts")
            return
        pools = [job.pool] if job.pool is not None else self.pools
        lanes = [self.lanes[(p, gpu)] for p in pools if (p, gpu) in self.lanes]
        if not lanes:
            where = f"pool {job.pool}" if job.pool else "the fleet"
            self.wait(
                job,
                f"waiting: no schedulable host with {'GPUs' if gpu else 'CPU slots'} in {where}",
            )
            return
        end = self.now + max(0.0, job.est_remaining_s)
        lend = self.lendable(job)
        if len(lanes) == 1:
            hosts, backfill, lent_to = self.try_place(lanes[0], need, job.hosts, end, lend)
            if hosts is not None:
                self.place(job, lanes[0], hosts, need, end, backfill, lent_to)
                return
        else:
            # any pool: the pool with the most idle capacity beyond what the jobs pinned to
            # it want, then where it fits best (least left free on the hosts it takes); a
            # loan of a head's capacity only where nothing else fits
            best: tuple[bool, int, int, int, _Lane, list[str], bool, int | None] | None = None
            for i, lane in enumerate(lanes):
                hosts, backfill, lent_to = self.try_place(lane, need, job.hosts, end, lend)
                if hosts is not None:
                    free = lane.now.free
                    left = sum(free[h] for h in hosts) - need * len(hosts)
                    spare = lane.now.total - self.pinned_demand(lane)
                    option = (lent_to is not None, -spare, left, i, lane, hosts, backfill, lent_to)
                    if best is None or option[:4] < best[:4]:
                        best = option
            if best is not None:
                _, _, _, _, lane, hosts, backfill, lent_to = best
                self.place(job, lane, hosts, need, end, backfill, lent_to)
                return
        possible = [ln for ln in lanes if ln.fits_ever(need, job.hosts)]
        if not possible:
            where = f"pool {job.pool}" if job.pool else "any pool"
            self.wait(
                job,
                f"waiting: cannot fit: {where} has fewer than {job.hosts} schedulable "
                f"host(s) with {need} {lanes[0].unit}",
            )
            return
        if job.preemption_requested:
            self.wait(job, "waiting: its preemption request is open; victims stop first")
            self.reserve(job, possible, need)
            return
        for lane in possible:
            if self.try_end_loans(job, lane, need):
                return
        for lane in possible:
            if self.try_preempt(job, lane, need):
                return
        for lane in possible if self.moves else ():
            if self.try_move(job, lane, need):
                return
        self.wait(job, self.blocked_reason(job, possible, need))
        self.reserve(job, possible, need)

    def lendable(self, job: JobView) -> int | None:
        """The class value of a job that may be lent a head's reserved capacity (preemptible
        backfill), else None: a class whose runs may be preempted, with a policy that approves
        a stop without a person when the run checkpointed recently, and a job not already
        stopped at the end of LEND_MAX_STOPS loans. Gangs too: over six seeds of the bench,
        lending to one-host jobs only left 0.6 points of utilisation on whole hosts that
        only gangs could use."""
        cls = self.classes.get(job.class_name)
        if (
            not self.lend
            or cls is None
            or not cls.preemptible
            or cls.approval != "auto_recent_checkpoint"
            or job.lent_stops >= LEND_MAX_STOPS
        ):
            return None
        return cls.value

    def try_place(
        self, lane: _Lane, need: int, n: int, end: float, lend: int | None = None
    ) -> tuple[list[str] | None, bool, int | None]:
        """(hosts, by backfill, the head whose capacity is lent) or (None, ..., None)."""
        # Free units only shrink during a pass, so a shape that did not fit stays unfit: a
        # long queue behind a full pool is answered from this set, not from the index.
        res = lane.reservation
        long = res is not None and end > res.start
        key = (need, n, long)
        if key not in lane.unfit:
            if res is not None and long:
                index, prefer = res.long, None
            else:
                index, prefer = lane.now, (res.slack if res is not None else None)
            ends = lane.ends if n == 1 else None
            hosts = index.pick(need, n, ends, end, prefer)
            if hosts is not None:
                return hosts, res is not None, None
            lane.unfit.add(key)
        # Preemptible backfill: a job that would run past the head's start may still take
        # the head's reserved units (they idle while its gang gathers) when it agrees to be
        # stopped as soon as the head could start there (`try_end_loans`).
        if (
            lend is None
            or res is None
            or not long
            or lend > res.value
            or res.start - self.now < LEND_MIN_S
            or (need, n) in lane.unfit_lent
        ):
            return None, res is not None, None
        hosts = lane.now.pick(need, n, lane.ends if n == 1 else None, end)
        if hosts is None:
            lane.unfit_lent.add((need, n))
            return None, True, None
        return hosts, True, res.run_id

    def place(
        self,
        job: JobView,
        lane: _Lane,
        hosts: list[str],
        need: int,
        end: float,
        backfill: bool,
        lent_to: int | None = None,
    ) -> None:
        lane.take(hosts, need, end, job.run_id)
        gpu = lane.gpu
        allocations = [Allocation(h, job.gpus if gpu else 0, 0 if gpu else need) for h in hosts]
        reason = f"placed on {', '.join(hosts)}"
        if lent_to is not None:
            reason += f"{LENT_MARK}{lent_to} can start (then stopped for it)"
        elif backfill:
            reason += " by backfill"
        if self.quota_gpu.get(lane.pool) == gpu:
            key = (job.team, lane.pool)
            self.usage[key] = self.usage.get(key, 0) + need * len(hosts)
            self.team_usage[job.team] = self.team_usage.get(job.team, 0) + need * len(hosts)
            self._shares.pop(job.team, None)
            if lane.pool in self.quota_pools and self.usage[key] > self.quota.get(key, 0):
                reason += f" (borrowing idle capacity in pool {lane.pool})"
        self.decisions.placements.append(Placement(job.run_id, allocations, reason, lent_to))

    def wait(self, job: JobView, reason: str) -> None:
        self.decisions.waiting[job.run_id] = reason

    def blocked_reason(self, job: JobView, lanes: list[_Lane], need: int) -> str:
        """Why a job that fits none of its lanes now waits. A job that may go to any pool is
        told what blocks it in each pool it could ever fit, not only in the first: a quota
        full in one pool says nothing about the reservation that keeps it out of another."""
        if len(lanes) == 1:
            return "waiting: " + self.lane_cause(job, lanes[0], need, True)
        by_cause: dict[str, list[str]] = {}
        for lane in lanes:
            by_cause.setdefault(self.lane_cause(job, lane, need, False), []).append(lane.pool)
        parts = [
            f"pool{'s' if len(pools) > 1 else ''} {', '.join(pools)}: {cause}"
            for cause, pools in by_cause.items()
        ]
        return "waiting: " + "; ".join(parts)

    def lane_cause(self, job: JobView, lane: _Lane, need: int, with_pool: bool) -> str:
        res = lane.reservation
        key = (
            lane.pool,
            lane.gpu,
            need,
            job.hosts,
            job.team,
            lane.now.total,
            res is not None,
            with_pool,
        )
        cause = self._reasons.get(key)
        if cause is None:
            cause = self._reasons[key] = self._lane_cause(job, lane, need, with_pool)
        return cause

    def _lane_cause(self, job: JobView, lane: _Lane, need: int, with_pool: bool) -> str:
        # a shape `try_place` found unfit on the free index stays unfit in this pass
        if (
            lane.reservation is not None
            and (need, job.hosts, False) not in lane.unfit
            and lane.now.pick(need, job.hosts) is not None
        ):
            return f"behind higher-priority run {lane.reservation.run_id}"
        in_pool = f" in pool {lane.pool}" if with_pool else ""
        key = (job.team, lane.pool)
        if lane.pool in self.quota_pools and self.quota_gpu.get(lane.pool) == lane.gpu:
            used, quota = self.usage.get(key, 0), self.quota.get(key, 0)
            if used + need * job.hosts > quota:
                return (
                    f"team quota full{in_pool} ({used} of {quota} {lane.unit} "
                    f"in use) and no idle {lane.unit} to borrow"
                )
        have = lane.now.count(need)
        text = f"needs {job.hosts} host(s) with {need} free {lane.unit}{in_pool}, {have} available"
        if lane.reservation is not None:
            # a pool-less cause is one of several joined by "; "
            text += f"{'; ' if with_pool else ', '}behind higher-priority run "
            text += str(lane.reservation.run_id)
        return text

    # -- reservation (backfill) -----------------------------------------------------------

    def reserve(self, job: JobView, lanes: list[_Lane], need: int) -> None:
        """Make the job the head of the first of `lanes` that has none. (For a job for any
        pool, reserving where it could start soonest measured no better over six seeds.)"""
        for lane in lanes:
            if lane.reservation is None:
                break
        else:
            return
        cls = self.classes.get(job.class_name)
        value = cls.value if cls else 0
        # the lent jobs this head may have stopped leave as soon as it could start
        found = lane.earliest(need, job.hosts, self.now, releases=lane.head_releases(value))
        if found is None:
            return
        start, hosts, free_then = found
        slack = {h: free_then[h] - need for h in hosts}
        # the index built whole (as `_Index.set` host by host would, same bucket order): a
        # reservation is made on most passes, over every host of its pool
        long = _Index()
        free, buckets = long.free, long.buckets
        total = 0
        for h, units in lane.now.free.items():
            if h in slack:
                units = max(0, min(units, slack[h]))
            free[h] = units
            total += units
            bucket = buckets.get(units)
            if bucket is None:
                bucket = buckets[units] = {}
            bucket[h] = None
        long.total = total
        lane.reservation = _Reservation(job.run_id, value, start, slack, long)

    # -- preemption -----------------------------------------------------------------------

    def try_preempt(self, job: JobView, lane: _Lane, need: int) -> bool:
        cls = self.classes.get(job.class_name)
        if cls is None:
            return False
        # like Kueue, only a team's first blocked job in a lane looks for victims in a pass, and
        # a pass searches a lane a few times at most (each search weighs every host; the rest
        # search in the next passes, which every start, stop and request triggers)
        if job.team in lane.preempt_tried or len(lane.preempt_tried) >= PREEMPTION_SEARCHES:
            return False
        lane.preempt_tried.add(job.team)
        reclaim = False
        if lane.pool in self.quota_pools and self.quota_gpu.get(lane.pool) == lane.gpu:
            key = (job.team, lane.pool)
            within = self.usage.get(key, 0) + need * job.hosts <= self.quota.get(key, 0)
            reclaim = within and any(
                self.borrower(t, lane.pool) for t, p in self.usage if p == lane.pool
            )
        if not (cls.can_preempt or reclaim):
            return False
        for value, n_need, n_hosts, rec in lane.failed_preemptions:
            if cls.value <= value and need >= n_need and job.hosts >= n_hosts and reclaim == rec:
                return False
        if cls.preempt_after_wait_s > 0:
            found = lane.earliest(need, job.hosts, self.now)
            if found is not None and found[0] - self.now <= cls.preempt_after_wait_s:
                return False

        victims_now = self.victims
        borrowing = {t for t in self.team_usage if self.borrower(t, lane.pool)}

        def usable(value: int, team: str) -> bool:
            if cls.can_preempt and value < cls.value:
                return True
            # reclaim takes back borrowed capacity from the same or a lower class only (Kueue's
            # reclaimWithinCohort: LowerOrNewerEqualPriority): a higher-class borrower placed
            # before the requester would take the freed capacity again, and lose work each time
            return reclaim and team != job.team and value <= cls.value and team in borrowing

        options: list[tuple[tuple[int, float, int], str, list[JobView]]] = []
        table = lane.victim_table(self.classes)
        for host, free in lane.now.free.items():
            deficit = need - free
            if deficit <= 0:
                options.append(((0, 0.0, 0), host, []))
                continue
            # candidates in (class, cost) order; borrowers first, keeping that order
            first: list[tuple[int, float, int, JobView]] = []
            then: list[tuple[int, float, int, JobView]] = []
            for value, cost, units, v in table.get(host, ()):
                if v.run_id in victims_now or (v.team == job.team and not cls.can_preempt):
                    continue
                if usable(value, v.team):
                    (first if v.team in borrowing else then).append((value, cost, units, v))
            chosen: list[JobView] = []
            freed = chosen_inside = 0
            chosen_cost = 0.0
            alone: list[tuple[tuple[int, float, int], list[JobView]]] = []
            for _value, cost, units, v in first + then:
                inside = 0 if v.team in borrowing else 1  # a victim within its team's quota
                if units >= deficit:  # frees enough by itself
                    alone.append(((inside, cost, 1), [v]))
                if freed < deficit:
                    chosen.append(v)
                    freed += units
                    chosen_inside += inside
                    chosen_cost += cost
            if freed >= deficit:
                alone.append(((chosen_inside, chosen_cost, len(chosen)), chosen))
            if not alone:
                continue
            # the cheapest of: the greedy set (cheapest first) and any one victim that suffices
            key3, best = min(alone, key=lambda o: o[0])
            options.append((key3, host, best))
        if len(options) < job.hosts:
            lane.failed_preemptions.append((cls.value, need, job.hosts, reclaim))
            return False
        options.sort(key=lambda o: o[0])
        picked = options[: job.hosts]
        victims: dict[int, JobView] = {}
        for _, _, chosen in picked:
            for v in chosen:
                victims[v.run_id] = v
        if not victims:
            return False  # it fits without victims: only a reservation keeps it out
        hosts = [h for _, h, _ in picked]
        self.file_plan(
            job, lane, need, hosts, list(victims.values()), reclaim and not cls.can_preempt
        )
        return True

    # -- ending loans of reserved capacity (preemptible backfill) --------------------------

    def try_end_loans(self, job: JobView, lane: _Lane, need: int) -> bool:
        """A job that would be the head of this lane, and could start once the lent jobs
        (`JobView.lent`) of its class or a lower one on its hosts stop, files a plan that stops
        them as soon as everything else on those hosts ends within LOAN_END_LEAD_S (or the
        lent jobs' grace period, if shorter; judged from est_remaining_s): they then stop as
        the last of the others end, and the hosts the head gathered do not idle while they
        stop. The plan goes through the same approval path as any preemption; the lent jobs
        go back to the queue at their old place."""
        cls = self.classes.get(job.class_name)
        if cls is None or lane.reservation is not None:
            return False
        table = lane.lent_table(cls.value)
        if not table:
            return False
        releases = lane.head_releases(cls.value, stopped=False)
        found = lane.earliest(need, job.hosts, self.now, releases=releases)
        if found is None:
            return False
        start, hosts, _ = found
        grace = min(self.classes[v.class_name].grace_s for rows in table.values() for *_, v in rows)
        if start > self.now + min(grace, LOAN_END_LEAD_S):
            return False  # others still run there for a while: the loans go on
        lent_ids = {v.run_id for rows in table.values() for *_, v in rows}
        # on each host, what is free by `start` without the lent jobs
        chosen_hosts = set(hosts)
        base = {h: lane.now.free[h] for h in hosts}
        for end, h, units, rid in lane.releases:
            if h in chosen_hosts and end <= start and rid not in lent_ids:
                base[h] += units
        stopping: dict[int, JobView] = {}  # a lent gang chosen on one host frees all of them
        for h in hosts:
            rows = table.get(h, [])
            deficit = need - base[h] - sum(r[0] for r in rows if r[2].run_id in stopping)
            if deficit <= 0:
                continue
            rows = [r for r in rows if r[2].run_id not in self.victims | stopping.keys()]
            # the fewest units that cover the deficit: one job that does, or the largest first
            alone = [r for r in rows if r[0] >= deficit]
            if alone:
                chosen = [min(alone, key=lambda r: (r[0], r[1], r[2].run_id))]
            else:
                chosen, got = [], 0
                for r in sorted(rows, key=lambda r: (-r[0], r[1], r[2].run_id)):
                    chosen.append(r)
                    got += r[0]
                    if got >= deficit:
                        break
                if got < deficit:
                    return False
            stopping.update((r[2].run_id, r[2]) for r in chosen)
        if not stopping:
            return False  # it fits without stopping anything: only a reservation keeps it out
        self.file_plan(job, lane, need, hosts, list(stopping.values()), False, "backfill")
        return True

    # -- moving runs to free whole hosts (defragmentation) ---------------------------------

    def try_move(self, job: JobView, lane: _Lane, need: int) -> bool:
        """Free the hosts a blocked job needs by moving one-host runs off them into the free
        units of other hosts: each moved run checkpoints, stops, and starts again at once
        elsewhere (defragmentation). The units are free but scattered, in fragments smaller
        than what the queue asks per host; unmoved, they idle until enough runs end on one host.

        A move is a preemption request like any other, approved by the moved runs' class
        policy: a run is moved only when its class would auto-approve it now (it checkpointed
        recently, and loses the work since), when its class is not above the requester's, and
        when it runs on one host. With a head reserved in the lane, only what a run past the
        head's start may use is counted (the moved runs and this job run past it), and the
        head's hosts are not emptied. Runs still stopping for earlier requests get their places
        first. At most MOVE_SEARCHES searches per lane and pass; a shape no move frees is not
        searched again in the pass."""
        cls = self.classes.get(job.class_name)
        n = job.hosts
        if cls is None or lane.moves_tried >= MOVE_SEARCHES or (need, n) in lane.unmovable:
            return False
        lane.moves_tried += 1
        res = lane.reservation
        # with a head reserved, what a run past its start may use: the moved runs and this job
        # run past it (the vacated hosts are never the head's)
        free = res.long.free if res is not None else lane.now.free
        if sum(free.values()) < need * n:  # moves keep the units in use as they are
            lane.unmovable.add((need, n))
            return False
        take = [h for _, h in sorted((u, h) for h, u in free.items() if u >= need)[:n]]
        dest = {h: u for h, u in free.items() if u > 0}
        for h in take:
            dest[h] -= need
        # runs still stopping for earlier requests (moved, or preempted) need places too: the
        # free units they would take, best fit, are not counted again
        for v in lane.jobs:
            if v.preemption_pending and len(v.running_on) == 1:
                a = v.running_on[0]
                units = a.gpus if lane.gpu else a.cpu_slots
                spots = [(u, d) for d, u in dest.items() if u >= units and d != a.host]
                if spots:
                    dest[min(spots)[1]] -= units
        gpu = lane.gpu
        options: list[tuple[tuple[int, float], str, list[tuple[int, JobView]]]] = []
        for h, jobs in lane.running.items():
            have = free.get(h, 0)
            if have >= need or lane.total[h] < need or (res is not None and h in res.slack):
                continue
            deficit = need - have
            movers: list[tuple[int, float, JobView]] = []
            for v in jobs:
                if len(v.running_on) != 1 or v.run_id in self.victims or v.preemption_pending:
                    continue
                vcls = self.classes.get(v.class_name)
                if (
                    vcls is None
                    or not vcls.preemptible
                    or vcls.value > cls.value
                    or not _auto_approves(vcls, v)
                ):
                    continue
                a = v.running_on[0]
                movers.append((a.gpus if gpu else a.cpu_slots, _victim_cost(v), v))
            if sum(m[0] for m in movers) < deficit:
                continue
            # the fewest units that cover the deficit: one run that does, or the largest first
            movers.sort(key=lambda m: (-m[0], m[1]))
            alone = [m for m in movers if m[0] >= deficit]
            chosen = [min(alone, key=lambda m: (m[0], m[1]))] if alone else []
            if not chosen:
                got = 0
                for m in movers:
                    chosen.append(m)
                    got += m[0]
                    if got >= deficit:
                        break
            moved = sum(m[0] for m in chosen)
            options.append(((moved, sum(m[1] for m in chosen)), h, [(m[0], m[2]) for m in chosen]))
        options.sort(key=lambda o: (o[0], o[1]))
        vacated: list[str] = []
        victims: list[JobView] = []
        landing: dict[str, int] = {}  # host -> units held there for the moved runs
        for _, h, moving in options:
            if len(take) + len(vacated) == n:
                break
            if dest.get(h, 0) < free.get(h, 0):
                continue  # moved runs (this plan's or stopping ones) are to land on it
            # each moved run, largest first, to the fullest host it fits (best fit)
            trial = dict(dest)
            trial.pop(h, None)
            for units, _v in sorted(moving, key=lambda c: -c[0]):
                spots = [(u, d) for d, u in trial.items() if u >= units]
                if not spots:
                    break
                trial[min(spots)[1]] -= units
            else:
                for d, u in trial.items():
                    if u != dest[d]:
                        landing[d] = landing.get(d, 0) + dest[d] - u
                dest = trial
                vacated.append(h)
                victims.extend(v for _, v in moving)
        if len(take) + len(vacated) < n or not victims:
            lane.unmovable.add((need, n))
            return False
        hosts = take + vacated
        self.file_plan(job, lane, need, hosts, victims, False, "move", moved_to=landing)
        return True

    def pinned_demand(self, lane: _Lane) -> int:
        """Units wanted by the queued jobs that can only run in this lane's pool."""
        demand = self._pinned.get((lane.pool, lane.gpu))
        if demand is None:
            demand = 0
            for j in self.queued:
                if j.pool == lane.pool and (j.gpus > 0) == lane.gpu:
                    demand += _units(j) * j.hosts
            self._pinned[(lane.pool, lane.gpu)] = demand
        return demand

    def order_key(self, job: JobView) -> tuple[int, int, float, int]:
        cls = self.classes.get(job.class_name)
        return (-(cls.value if cls else 0), -job.priority, job.queued_at, job.run_id)

    def waiting_in(self, lane: _Lane) -> list[tuple[tuple[int, int, float, int], JobView]]:
        """The queued jobs that start in this lane (they name its pool; a job for any pool
        where it has no other pool to go to), in queue order; sorted once per lane and pass."""
        cached = self._waiting.get((lane.pool, lane.gpu))
        if cached is None:
            only = sum(1 for _, gpu in self.lanes if gpu == lane.gpu) == 1
            cached = sorted(
                (
                    (self.order_key(j), j)
                    for j in self.queued
                    if (j.pool == lane.pool or (j.pool is None and only))
                    and (j.gpus > 0) == lane.gpu
                    and not j.preemption_requested
                ),
                key=lambda kj: kj[0],
            )
            self._waiting[(lane.pool, lane.gpu)] = cached
        return cached

    def expected_starts(
        self,
        lane: _Lane,
        requester: JobView,
        victims: list[JobView],
        free: dict[str, int],
        releases: list[tuple[float, str, int, int]],
    ) -> dict[int, float | None]:
        """Seconds until each victim, back in the queue at its old place, is expected to start
        again. The jobs waiting ahead of it in this lane (by class, priority and age; at most
        AHEAD_IN_ESTIMATE of them, placed or planned ones left out) and the victims start in
        that order as running jobs end, each on its best-fit hosts until its est_remaining_s
        is over. In order, without backfill: an estimate that errs late rather than early.
        None: it never fits, or the jobs ahead never all fit (capacity held for requesters)."""
        keyed = sorted(((self.order_key(v), v) for v in victims), key=lambda kv: kv[0])
        last = keyed[-1][0]
        skip = {requester.run_id, *(p.run_id for p in self.decisions.placements)}
        skip.update(p.requester_run_id for p in self.decisions.preemptions)
        ahead: list[tuple[tuple[int, int, float, int], JobView]] = []
        for key, j in self.waiting_in(lane):
            if key >= last or len(ahead) == AHEAD_IN_ESTIMATE:
                break
            if j.run_id not in skip and lane.fits_ever(_units(j), j.hosts):
                ahead.append((key, j))
        order = sorted(ahead + keyed, key=lambda kj: kj[0])
        free = dict(free)
        top = max(lane.total.values(), default=0)
        at_least = [0] * (top + 2)  # at_least[k]: hosts with k or more free units
        for u in free.values():
            for k in range(1, min(u, top) + 1):
                at_least[k] += 1
        # the lane's releases (sorted once per pass, victims' skipped) merged with a small
        # heap of this estimate's own: the requester's and each started job's
        base = lane.sorted_releases()
        i, n_base = 0, len(base)
        pending = sorted(releases)
        pop, push = heapq.heappop, heapq.heappush
        wanted = {v.run_id for v in victims}
        starts: dict[int, float | None] = {v.run_id: None for v in victims}
        t = self.now
        for _, job in order:
            need = _units(job)
            n = len(job.running_on) if job.run_id in wanted else job.hosts
            while at_least[need] < n:
                while i < n_base and base[i][3] in wanted:
                    i += 1
                if i < n_base and (not pending or base[i] < pending[0]):
                    end, h, units, _ = base[i]
                    i += 1
                elif pending:
                    end, h, units, _ = pop(pending)
                else:
                    return starts  # the rest never fit
                before = free[h]
                free[h] = before + units
                for k in range(before + 1, min(before + units, top) + 1):
                    at_least[k] += 1
                t = max(t, end)
            if job.run_id in wanted:
                starts[job.run_id] = t - self.now
            # best fit, as a placement would choose
            hosts = heapq.nsmallest(
                n, (h for h, u in free.items() if u >= need), key=free.__getitem__
            )
            end = t + max(0.0, job.est_remaining_s)
            for h in hosts:
                before = free[h]
                free[h] = before - need
                for k in range(before - need + 1, min(before, top) + 1):
                    at_least[k] -= 1
                push(pending, (end, h, need, job.run_id))
        return starts

    def borrower(self, team: str, pool: str) -> bool:
        return self.usage.get((team, pool), 0) > self.quota.get((team, pool), 0)

    def file_plan(
        self,
        job: JobView,
        lane: _Lane,
        need: int,
        hosts: list[str],
        victims: list[JobView],
        reclaim: bool,
        kind: PlanKind = "preempt",
        moved_to: dict[str, int] | None = None,
    ) -> None:
        victim_ids = {v.run_id for v in victims}
        self.victims |= victim_ids
        # what the fleet looks like once the victims stop and the requester runs
        free = dict(lane.now.free)
        for v in victims:
            for a in v.running_on:
                if a.host in free:
                    free[a.host] += a.gpus if lane.gpu else a.cpu_slots
        for h in hosts:
            free[h] -= need
        end = self.now + max(0.0, job.est_remaining_s)
        releases = [(end, h, need, job.run_id) for h in hosts]  # beside the lane's own
        impacts = []
        auto = True
        resumes = self.expected_starts(lane, job, victims, free, releases)
        for v in sorted(victims, key=lambda v: v.run_id):
            vcls = self.classes[v.class_name]
            auto = auto and _auto_approves(vcls, v)
            resume = resumes[v.run_id]
            age = (
                v.last_checkpoint_age_s if v.last_checkpoint_age_s is not None else v.running_for_s
            )
            impacts.append(
                VictimImpact(
                    run_id=v.run_id,
                    gpu_hours_since_checkpoint=round(v.gpus * len(v.running_on) * age / 3600.0, 4),
                    steps_lost=v.steps_since_checkpoint,
                    next_checkpoint_in_s=v.next_checkpoint_in_s,
                    rollouts_in_flight=v.rollouts_in_flight,
                    expected_resume_s=resume,
                )
            )
        names = ", ".join(str(v.run_id) for v in sorted(victims, key=lambda v: v.run_id))
        if kind == "backfill":
            why = (
                f"can start on {', '.join(sorted(hosts))} in pool {lane.pool}{LOAN_END_MARK}"
                f"{names}, placed there by backfill until a run ahead of them could start"
            )
        elif moved_to is not None:
            why = (
                f"needs {job.hosts}x{need} {lane.unit} in pool {lane.pool}, free only in "
                f"fragments: moving run(s) {names} to {', '.join(sorted(moved_to))}"
            )
        elif reclaim:
            why = (
                f"reclaiming team {job.team}'s quota in pool {lane.pool} from borrowing run(s) "
                f"{names}"
            )
        else:
            why = (
                f"class {job.class_name} needs {job.hosts}x{need} {lane.unit} in pool "
                f"{lane.pool}: preempting run(s) {names}"
            )
        self.decisions.preemptions.append(PreemptionPlan(job.run_id, impacts, auto, why, kind))
        approval = "auto-approved" if auto else "awaiting approval"
        self.wait(job, f"waiting: preemption of run(s) {names} requested ({approval})")
        lane.hold(hosts, need)
        if moved_to:
            # the moved runs' new places: kept from the rest of this pass
            for h, units in moved_to.items():
                lane.hold([h], units)
        key = (job.team, lane.pool)
        self.usage[key] = self.usage.get(key, 0) + need * job.hosts  # counts against its quota now
        self._shares.pop(job.team, None)


def schedule(
    *,
    hosts: list[HostView],
    jobs: list[JobView],
    classes: dict[str, PriorityClass],
    quotas: list[Quota],
    now: float,
    moves: bool = True,
    lend: bool = True,
) -> Decisions:
    """One scheduling pass. Queued jobs are those with `running_on == []`.

    Placements start now; a job with a preemption plan is not placed in the same pass (it
    starts once its victims have stopped), and a job marked `preemption_requested` gets no
    second plan. Every queued job that is not placed has a reason in `waiting`.

    `moves=False` switches off moving runs to free whole hosts (`_Pass.try_move`): the bench
    runs the policy both ways on the same jobs, to show what moving gains and what it costs.
    `lend=False` likewise switches off preemptible backfill (`_Pass.try_place`'s loans of a
    head's reserved capacity, and `_Pass.try_end_loans`).
    """
    return _Pass(hosts, jobs, classes, quotas, now, moves, lend).run()
