"""The scheduler's policy: pure Python over an in-memory view of the fleet and the queue.

No Django import here: the console's scheduler service (`console.scheduling.services`) reads
the database into these views under a PostgreSQL advisory lock, calls `schedule()`, and
writes the decisions back; the unit tests and `bench/bench_scheduler.py` call `schedule()` on
views they build themselves.

INTERFACE (agreed between the policy and the console side; the policy's author fills in the
algorithm and may add fields, but keeps these names and meanings):
"""

from __future__ import annotations

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
    last_checkpoint_age_s: float | None = None
    steps_since_checkpoint: int = 0
    next_checkpoint_in_s: float | None = None
    rollouts_in_flight: int = 0
    preemption_pending: bool = False  # already a victim of an open request


@dataclass
class Placement:
    run_id: int
    allocations: list[Allocation]
    reason: str  # "placed on host-3", "placed on host-3 by backfill", ...


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
    reason: str


@dataclass
class Decisions:
    placements: list[Placement] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # run_id -> reason it waits
    preemptions: list[PreemptionPlan] = field(default_factory=list)


def _demand(job: JobView) -> tuple[bool, int]:
    """(uses GPUs?, units per host): a GPU job needs `gpus` GPUs per host, a CPU job `cpu_slots`."""
    return (True, job.gpus) if job.gpus > 0 else (False, job.cpu_slots)


def _queue_key(job: JobView, classes: dict[str, PriorityClass]) -> tuple[int, int, float, int]:
    cls = classes.get(job.class_name)
    return (-(cls.value if cls else 0), -job.priority, job.queued_at, job.run_id)


def schedule(
    *,
    hosts: list[HostView],
    jobs: list[JobView],
    classes: dict[str, PriorityClass],
    quotas: list[Quota],
    now: float,
) -> Decisions:
    """One scheduling pass. Queued jobs are those with `running_on == []`."""
    decisions = Decisions()
    free = {h.name: [h.gpus_free, h.cpu_free] for h in hosts}
    usable = [h for h in hosts if h.schedulable]
    # pool -> the queued run that blocks it (strict order: nothing lower may jump it)
    blocked: dict[str | None, int] = {}
    queued = sorted((j for j in jobs if not j.running_on), key=lambda j: _queue_key(j, classes))
    for job in queued:
        if job.pool is None:
            blocker = next(iter(blocked.values()), None)
        else:
            blocker = blocked.get(job.pool, blocked.get(None))
        if blocker is not None:
            decisions.waiting[job.run_id] = f"waiting: behind higher-priority run {blocker}"
            continue
        gpu, need = _demand(job)
        slot = 0 if gpu else 1
        fits = [
            h
            for h in usable
            if (job.pool is None or h.pool == job.pool) and free[h.name][slot] >= need
        ]
        if len(fits) < job.hosts:
            where = f"pool {job.pool}" if job.pool else "the fleet"
            unit = "GPUs" if gpu else "CPU slots"
            decisions.waiting[job.run_id] = (
                f"waiting: needs {job.hosts} host(s) with {need} free {unit} in {where}, "
                f"{len(fits)} available"
            )
            blocked.setdefault(job.pool, job.run_id)
            continue
        # best fit: the fullest hosts that still fit, to keep whole hosts free for big gangs
        fits.sort(key=lambda h: (free[h.name][slot], h.name))
        chosen = fits[: job.hosts]
        allocations = []
        for h in chosen:
            free[h.name][slot] -= need
            allocations.append(Allocation(h.name, job.gpus if gpu else 0, 0 if gpu else need))
        names = ", ".join(a.host for a in allocations)
        decisions.placements.append(Placement(job.run_id, allocations, f"placed on {names}"))
    return decisions
