"""Reads for the scheduler's pages and API: the queue, the fleet, classes and quotas, and the
preemption inbox. Pages for admins see every team; a member below admin sees the queue of
their own team only (`team` given)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from console.accounts.models import Team
from console.runs.models import LIVE_ATTEMPT_STATES, Allocation, Attempt, Host, Run, RunState
from console.scheduling.models import (
    DEFAULT_CLASS_NAME,
    DEFAULT_POOL_NAME,
    PreemptionRequest,
    PreemptionState,
    PreemptionVictim,
    PriorityClass,
    ResourcePool,
    SchedulingDecision,
    TeamQuota,
)


def class_choices() -> list[tuple[str, str]]:
    from console.scheduling.services import default_class

    default_class()
    return [
        (c.name, f"{c.name} ({c.value}{', may preempt' if c.can_preempt else ''})")
        for c in PriorityClass.objects.order_by("-value", "name")
    ]


def class_list() -> QuerySet[PriorityClass]:
    return PriorityClass.objects.order_by("-value", "name")


def pool_list() -> QuerySet[ResourcePool]:
    return ResourcePool.objects.order_by("name")


def quota_list() -> QuerySet[TeamQuota]:
    return TeamQuota.objects.select_related("team", "pool").order_by("pool__name", "team__name")


def team_list() -> QuerySet[Team]:
    return Team.objects.order_by("name")


@dataclass
class QueueRow:
    run: Run
    class_name: str
    class_value: int
    wait_s: float


@dataclass
class Queue:
    pending: list[QueueRow]
    running: list[Attempt]
    decisions: list[SchedulingDecision]
    by_class: list[tuple[str, list[QueueRow]]] = field(default_factory=list)


def queue(*, team: Team | None, decisions: int = 30) -> Queue:
    """Pending runs by class (highest first, in the order the scheduler takes them), running
    attempts by host, and the newest decisions; `team` limits all three to one team."""
    now = timezone.now()
    runs = Run.objects.filter(state=RunState.QUEUED).select_related(
        "team", "created_by", "priority_class"
    )
    live = (
        Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES)
        .select_related("run__team", "run__priority_class", "host")
        .prefetch_related(
            Prefetch("allocations", queryset=Allocation.objects.select_related("host"))
        )
    )
    log = SchedulingDecision.objects.select_related("run__team")
    if team is not None:
        runs = runs.filter(team=team)
        live = live.filter(run__team=team)
        log = log.filter(run__team=team)
    default = PriorityClass.objects.filter(name=DEFAULT_CLASS_NAME).first()
    rows = []
    for run in runs:
        cls = run.priority_class or default
        since = run.queued_at or run.created_at
        rows.append(
            QueueRow(
                run=run,
                class_name=cls.name if cls else DEFAULT_CLASS_NAME,
                class_value=cls.value if cls else 0,
                wait_s=max((now - since).total_seconds(), 0.0),
            )
        )
    rows.sort(key=lambda r: (-r.class_value, -r.run.priority, r.run.queued_at or now, r.run.pk))
    grouped: dict[str, list[QueueRow]] = {}
    for row in rows:
        grouped.setdefault(row.class_name, []).append(row)
    return Queue(
        pending=rows,
        running=sorted(live, key=lambda a: (a.host.name, a.run_id)),
        decisions=list(log.order_by("-created_at", "-id")[:decisions]),
        by_class=list(grouped.items()),
    )


@dataclass
class HostRow:
    host: Host
    pool: str
    attempts: list[Attempt]
    gpus_used: int
    cpu_used: int
    heartbeat_age_s: float | None
    fresh: bool

    @property
    def gpus_free(self) -> int:
        return max(self.host.gpu_slots - self.gpus_used, 0)

    @property
    def cpu_free(self) -> int:
        return max(self.host.cpu_slots - self.cpu_used, 0)


def fleet() -> list[HostRow]:
    """Every host with what runs on it. A host's use is its share of each live attempt (its
    `Allocation`, as the scheduler counts it): a run on several hosts shows, and counts, on each
    of them, not only on node 0's host."""
    now = timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S)
    hosts = Host.objects.select_related("pool").prefetch_related(
        Prefetch(
            "allocations",
            queryset=Allocation.objects.filter(attempt__state__in=LIVE_ATTEMPT_STATES)
            .select_related("attempt__run__team", "attempt__run__priority_class")
            .order_by("attempt__run_id"),
            to_attr="live_allocations",
        )
    )
    rows = []
    for host in hosts.order_by("name"):
        shares: list[Allocation] = host.live_allocations  # type: ignore[attr-defined]
        rows.append(
            HostRow(
                host=host,
                pool=host.pool.name if host.pool else DEFAULT_POOL_NAME,
                attempts=[share.attempt for share in shares],
                gpus_used=sum(share.gpus for share in shares),
                cpu_used=sum(share.cpu_slots for share in shares),
                heartbeat_age_s=(now - host.heartbeat_at).total_seconds()
                if host.heartbeat_at
                else None,
                fresh=bool(host.heartbeat_at and host.heartbeat_at >= cutoff),
            )
        )
    return rows


def fleet_totals(rows: list[HostRow]) -> dict[str, Any]:
    return {
        "gpus": sum(r.host.gpu_slots for r in rows),
        "gpus_used": sum(r.gpus_used for r in rows),
        "cpu": sum(r.host.cpu_slots for r in rows),
        "cpu_used": sum(r.cpu_used for r in rows),
    }


def host_get(*, pk: int) -> Host:
    return Host.objects.select_related("pool").get(pk=pk)


def _requests() -> QuerySet[PreemptionRequest]:
    return PreemptionRequest.objects.select_related(
        "requester__team", "requester__priority_class", "decided_by"
    ).prefetch_related(
        Prefetch(
            "victims",
            queryset=PreemptionVictim.objects.select_related(
                "run__team", "run__priority_class"
            ).order_by("id"),
        )
    )


def preemption_inbox(
    *, recent: int = 20
) -> tuple[list[PreemptionRequest], list[PreemptionRequest]]:
    """(pending requests, oldest first; the newest decided ones)."""
    pending = list(_requests().filter(state=PreemptionState.PENDING).order_by("created_at", "id"))
    decided = list(
        _requests().exclude(state=PreemptionState.PENDING).order_by("-created_at", "-id")[:recent]
    )
    return pending, decided


def preemption_get(*, pk: int) -> PreemptionRequest:
    return _requests().get(pk=pk)


def preemption_list(*, state: str = "") -> QuerySet[PreemptionRequest]:
    requests = _requests().order_by("-created_at", "-id")
    if state:
        requests = requests.filter(state=state)
    return requests
