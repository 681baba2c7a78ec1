"""The scheduler service and the admins' writes: one scheduling pass under a PostgreSQL
advisory lock, preemption requests (file, approve, reject, expire), and priority classes,
quotas and hosts.

A pass reads the fleet and the queue into the policy's views (`console.scheduling.policy`),
asks the policy, and writes what it decided: attempts through the runs' own placement path
(`console.runs.services._schedule`), waiting reasons on the runs (a decision-log row only
when a run's reason changes), and preemption requests with each victim's impact preview
(approved at once when the victims' class policy says so).
"""

from __future__ import annotations

import datetime as dt
import logging
import zlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Prefetch, Q
from django.utils import timezone

from console.accounts.models import Team
from console.audit.services import audit_record
from console.broadcast import FLEET_HOSTS_GROUP, FLEET_INBOX_GROUP, broadcast_on_commit
from console.runs import services as runs_services
from console.runs.models import (
    LIVE_ATTEMPT_STATES,
    Allocation,
    AllocationState,
    Attempt,
    Checkpoint,
    CommandKind,
    Host,
    HostState,
    Run,
    RunState,
)
from console.scheduling import policy
from console.scheduling.models import (
    DEFAULT_CLASS_NAME,
    DEFAULT_POOL_NAME,
    Approval,
    DecisionKind,
    PreemptionPurpose,
    PreemptionRequest,
    PreemptionState,
    PreemptionVictim,
    PriorityClass,
    ResourcePool,
    SchedulingDecision,
    TeamQuota,
)

logger = logging.getLogger(__name__)

# pg_try_advisory_xact_lock's key: one scheduler at a time across every control worker.
SCHEDULER_LOCK_KEY = zlib.crc32(b"console.scheduling.schedule_pass")

# A run that is placed, or about to be, while a pass runs: the policy sees it as running.
_OCCUPYING_RUN_STATES = (RunState.SCHEDULED, RunState.RUNNING, RunState.PREEMPTING)


def default_class() -> PriorityClass:
    """The class of runs that did not pick one (created by the migration; again here when a
    test database was flushed)."""
    cls, _ = PriorityClass.objects.get_or_create(
        name=DEFAULT_CLASS_NAME,
        defaults={"value": 100, "approval": Approval.ASK, "preemptible": True},
    )
    return cls


def default_pool() -> ResourcePool:
    pool, _ = ResourcePool.objects.get_or_create(name=DEFAULT_POOL_NAME)
    return pool


def request_pass() -> None:
    """Ask the control worker for a pass (after the commit that changed the queue or fleet)."""
    runs_services.request_placement()


# --- the pass -------------------------------------------------------------------------------


@dataclass
class PassResult:
    ran: bool  # False: another pass held the lock
    placed: list[Attempt] = field(default_factory=list)
    waiting: int = 0
    filed: list[PreemptionRequest] = field(default_factory=list)


def _decide(run: Run, kind: str, reason: str, *, lent_to: int | None = None) -> None:
    SchedulingDecision.objects.create(run=run, kind=kind, reason=reason[:1000], lent_to_id=lent_to)


def _class_view(cls: PriorityClass) -> policy.PriorityClass:
    return policy.PriorityClass(
        name=cls.name,
        value=cls.value,
        can_preempt=cls.can_preempt,
        preemptible=cls.preemptible,
        approval=cls.approval,  # type: ignore[arg-type]
        auto_approve_minutes=cls.auto_approve_minutes,
        grace_s=float(cls.grace_s),
        preempt_after_wait_s=float(cls.preempt_after_wait_s),
    )


def _seconds_per_step(run: Run, attempt: Attempt | None, now: dt.datetime) -> float | None:
    if attempt is None or attempt.started_at is None:
        return None
    done = run.last_step - attempt.start_step
    if done <= 0:
        return None
    return max((now - attempt.started_at).total_seconds(), 0.0) / done


def _job_view(
    run: Run,
    attempt: Attempt | None,
    now: dt.datetime,
    classes: dict[int, PriorityClass],
    fallback: PriorityClass,
    pending_victims: set[int],
    open_requesters: set[int],
    checkpoints: dict[int, Checkpoint],
) -> policy.JobView:
    cls = classes.get(run.priority_class_id or 0, fallback)
    rate = _seconds_per_step(run, attempt, now)
    steps_left = max(run.max_steps - run.last_step, 0)
    view = policy.JobView(
        run_id=run.pk,
        team=run.team.slug,
        class_name=cls.name,
        priority=run.priority,
        gpus=run.gpus,
        cpu_slots=run.cpu_slots,
        hosts=run.hosts,
        queued_at=(run.queued_at or run.created_at).timestamp(),
        est_remaining_s=rate * steps_left if rate is not None else 3600.0,
    )
    if attempt is None:
        view.preemption_requested = run.pk in open_requesters
        return view
    view.running_on = [
        policy.Allocation(host=node.host.name, gpus=node.gpus, cpu_slots=node.cpu_slots)
        for node in attempt.allocations.all()
    ]
    checkpoint = checkpoints.get(run.pk)
    started = attempt.started_at or attempt.scheduled_at
    view.running_for_s = max((now - started).total_seconds(), 0.0)
    # A stop loses the work since the newest state the run would come back to: a checkpoint
    # this attempt saved, else the attempt's own start (it began from the run's last
    # checkpoint, or from scratch). A checkpoint older than the attempt is not lost work: the
    # attempt resumed from it. So a run that just started, or just resumed, is cheap to stop.
    saved_at = max(checkpoint.created_at, started) if checkpoint is not None else started
    view.last_checkpoint_age_s = max((now - saved_at).total_seconds(), 0.0)
    view.steps_since_checkpoint = max(
        run.last_step - (checkpoint.step if checkpoint else attempt.start_step), 0
    )
    every = int((run.spec.get("checkpoint") or {}).get("every_steps") or 0)
    if every and rate is not None:
        view.next_checkpoint_in_s = (every - run.last_step % every) * rate
    batch = run.spec.get("batch") or {}
    view.rollouts_in_flight = int(batch.get("prompts_per_step", 0)) * int(
        batch.get("group_size", 1)
    )
    view.preemption_pending = run.pk in pending_victims or run.state == RunState.PREEMPTING
    return view


def _fleet(now: dt.datetime) -> tuple[list[Host], list[policy.HostView], dict[int, Attempt]]:
    """Hosts (locked) and their views, and each live attempt by run id."""
    fresh = now - dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S)
    hosts = list(
        Host.objects.select_for_update(of=("self",)).select_related("pool").order_by("name")
    )
    nodes = Allocation.objects.select_related("host").order_by("node_rank")
    live = {
        a.run_id: a
        for a in Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES)
        .select_related("run", "host")
        .prefetch_related(Prefetch("allocations", queryset=nodes))
    }
    used: dict[int, list[int]] = {h.pk: [0, 0] for h in hosts}
    # Every node of a live attempt holds its host's slots. So does a node of an ended attempt
    # whose process group the agent has not yet seen exit (a preempted job still tearing
    # down): the agent would not take the next attempt before then, and the sweep would take
    # that attempt for lost.
    exiting = Allocation.objects.filter(
        state__in=[AllocationState.STARTING, AllocationState.RUNNING],
        attempt__ended_at__gte=fresh,
        host__state__in=[HostState.READY, HostState.CORDONED, HostState.DRAINING],
    ).exclude(attempt__state__in=LIVE_ATTEMPT_STATES)
    for node in [*(n for a in live.values() for n in a.allocations.all()), *exiting]:
        if node.host_id in used:
            used[node.host_id][0] += node.gpus
            used[node.host_id][1] += node.cpu_slots
    views = [
        policy.HostView(
            name=h.name,
            pool=h.pool.name if h.pool else DEFAULT_POOL_NAME,
            gpus_total=h.gpu_slots,
            cpu_total=h.cpu_slots,
            gpus_free=max(h.gpu_slots - used[h.pk][0], 0),
            cpu_free=max(h.cpu_slots - used[h.pk][1], 0),
            schedulable=(
                h.state == HostState.READY
                and h.heartbeat_at is not None
                and h.heartbeat_at >= fresh
            ),
        )
        for h in hosts
    ]
    return hosts, views, live


def _last_checkpoints(run_ids: list[int]) -> dict[int, Checkpoint]:
    """Each run's newest recorded checkpoint (as `runs.services.last_checkpoint`), in one
    query."""
    if not run_ids:
        return {}
    newest = (
        Checkpoint.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "-step", "-id")
        .distinct("run_id")
    )
    return {c.run_id: c for c in newest}


def _loans(live: dict[int, Attempt]) -> tuple[set[int], dict[int, int]]:
    """Preemptible backfill's state, read back from the decision log: the running runs (of
    `live`, by run id) whose current attempt was placed on a head's reserved capacity (its
    placement decision's `lent_to`), and per queued run how often such a loan ended with the
    run stopped (it was a victim of an approved request whose purpose was to end loans). Both
    read fields, never the reasons, and each goes in by a partial index of the few loans."""
    lent: set[int] = set()
    if live:
        since = min(a.scheduled_at for a in live.values())
        # of the runs placed now, the loans since the oldest live attempt
        placed = SchedulingDecision.objects.filter(
            lent_to__isnull=False,
            run__state__in=_OCCUPYING_RUN_STATES,
            kind=DecisionKind.PLACED,
            created_at__gte=since,
        ).values_list("run_id", "created_at")
        for run_id, created_at in placed:
            # this attempt's placement: an earlier attempt's decision is older than it
            attempt = live.get(run_id)
            if attempt is not None and created_at >= attempt.scheduled_at:
                lent.add(run_id)
    ended = (
        PreemptionVictim.objects.filter(
            run__state=RunState.QUEUED,
            request__state__in=[PreemptionState.APPROVED, PreemptionState.DONE],
            request__purpose=PreemptionPurpose.BACKFILL,
        )
        .values("run_id")
        .annotate(n=Count("id"))
    )
    return lent, {row["run_id"]: row["n"] for row in ended}


def _try_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SCHEDULER_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def schedule_pass(*, now: dt.datetime | None = None) -> PassResult:
    """One pass of the scheduler; a no-op (``ran=False``) while another pass holds the lock
    (that pass, or the next tick, sees whatever changed)."""
    now = now or timezone.now()
    with transaction.atomic():
        if not _try_lock():
            return PassResult(ran=False)
        result = PassResult(ran=True)
        _expire_requests(now)
        _finish_drains()
        _close_requests()
        hosts, host_views, live = _fleet(now)
        by_name = {h.name: h for h in hosts}
        fallback = default_class()
        classes = {c.pk: c for c in PriorityClass.objects.all()}
        pending_victims = set(
            PreemptionVictim.objects.filter(
                request__state__in=[PreemptionState.PENDING, PreemptionState.APPROVED]
            ).values_list("run_id", flat=True)
        )
        open_requesters = set(
            PreemptionRequest.objects.filter(
                state__in=[PreemptionState.PENDING, PreemptionState.APPROVED]
            ).values_list("requester_id", flat=True)
        )
        queued = {
            r.pk: r
            for r in Run.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state=RunState.QUEUED)
            .select_related("team")
            .defer("request", "pins", "spec", "error")
        }
        running = {
            a.run_id: a.run
            for a in live.values()
            if a.run.state in _OCCUPYING_RUN_STATES and a.run_id not in queued
        }
        for run in (
            Run.objects.filter(pk__in=running).select_related("team").defer("request", "pins")
        ):
            running[run.pk] = run
        checkpoints = _last_checkpoints(list(running))
        lent, loan_stops = _loans({pk: live[pk] for pk in running})
        jobs = [
            _job_view(r, None, now, classes, fallback, pending_victims, open_requesters, {})
            for r in queued.values()
        ]
        jobs += [
            _job_view(
                r, live[r.pk], now, classes, fallback, pending_victims, open_requesters, checkpoints
            )
            for r in running.values()
        ]
        for job in jobs:
            job.lent = job.run_id in lent
            job.lent_stops = loan_stops.get(job.run_id, 0)
        quotas = [
            policy.Quota(team=q.team.slug, pool=q.pool.name, gpus=q.gpus)
            for q in TeamQuota.objects.select_related("team", "pool")
        ]
        decisions = policy.schedule(
            hosts=host_views,
            jobs=jobs,
            classes={c.name: _class_view(c) for c in [fallback, *classes.values()]},
            quotas=quotas,
            now=now.timestamp(),
        )
        for placement in decisions.placements:
            placed_run = queued.get(placement.run_id)
            if placed_run is None:
                continue
            run = placed_run
            started = gang_start(run, [by_name[a.host] for a in placement.allocations])
            if isinstance(started, str):
                decisions.waiting[run.pk] = started
                continue
            _decide(run, DecisionKind.PLACED, placement.reason, lent_to=placement.lent_to)
            result.placed.append(started)
        changed: dict[str, list[Run]] = {}
        for run_id, reason in decisions.waiting.items():
            waiting_run = queued.get(run_id)
            if waiting_run is not None and waiting_run.state_reason != reason[:2000]:
                changed.setdefault(reason[:2000], []).append(waiting_run)
        # Many runs share a reason: one UPDATE per reason, one INSERT for the log.
        log = []
        for reason, runs in changed.items():
            Run.objects.filter(pk__in=[r.pk for r in runs]).update(state_reason=reason)
            for run in runs:
                log.append(
                    SchedulingDecision(run=run, kind=DecisionKind.WAITING, reason=reason[:1000])
                )
                # Without waiting for Redis: a pass must not slow down with the open pages.
                runs_services.notify(
                    run, "run.state", {"state": run.state, "reason": reason}, wait=False
                )
        SchedulingDecision.objects.bulk_create(log)
        result.waiting = len(log)
        for plan in decisions.preemptions:
            request = _file_request(plan, queued, now)
            if request is not None:
                result.filed.append(request)
    return result


# --- gang start -----------------------------------------------------------------------------


def rendezvous_port() -> int | None:
    """The lowest port of RUNS_RENDEZVOUS_PORT_* that no gang holds: one whose attempt is live,
    or one of whose nodes still runs (an ended attempt's port is free once its process groups
    have exited). None when every port is held."""
    first = settings.RUNS_RENDEZVOUS_PORT_FIRST
    held = set(
        Attempt.objects.filter(rendezvous_port__isnull=False)
        .filter(
            Q(state__in=LIVE_ATTEMPT_STATES)
            | Q(
                allocations__state__in=[AllocationState.STARTING, AllocationState.RUNNING],
            )
        )
        .values_list("rendezvous_port", flat=True)
    )
    for port in range(first, first + settings.RUNS_RENDEZVOUS_PORT_COUNT):
        if port not in held:
            return port
    return None


def gang_start(run: Run, hosts: list[Host]) -> Attempt | str:
    """Starts `run` on `hosts` (node 0 first) all at once or not at all: in one savepoint, with
    the hosts locked by the pass, every host is checked to be ready with room for the run's
    share, a gang takes a rendezvous port, and the attempt and one allocation per host are
    written (the messages to the hosts' queues go out after commit). Returns the waiting
    reason instead when any of it fails; then nothing is written."""
    if len(hosts) != max(run.hosts, 1) or len({h.pk for h in hosts}) != len(hosts):
        return f"waiting: needs {run.hosts} distinct hosts, the placement named {len(hosts)}"
    for host in hosts:
        free_gpus, free_cpus = runs_services.host_free_slots(host)
        short = free_gpus < run.gpus if run.gpus else free_cpus < run.cpu_slots
        if host.state != HostState.READY or short:
            return f"waiting: host {host.name} has no room for its share of the gang"
    port = None
    if len(hosts) > 1:
        port = rendezvous_port()
        if port is None:
            return (
                "waiting: every rendezvous port is held "
                f"(RUNS_RENDEZVOUS_PORT_COUNT={settings.RUNS_RENDEZVOUS_PORT_COUNT})"
            )
    with transaction.atomic():
        return runs_services._schedule(run, hosts, rendezvous_port=port)


# --- preemption requests ---------------------------------------------------------------------


def _file_request(
    plan: policy.PreemptionPlan, queued: dict[int, Run], now: dt.datetime
) -> PreemptionRequest | None:
    requester = queued.get(plan.requester_run_id)
    if requester is None or not plan.victims:
        return None
    if (
        PreemptionRequest.objects.filter(requester=requester)
        .filter(
            Q(state__in=[PreemptionState.PENDING, PreemptionState.APPROVED])
            | Q(
                state__in=[PreemptionState.REJECTED, PreemptionState.EXPIRED],
                decided_at__gte=now - dt.timedelta(seconds=settings.PREEMPTION_REFILE_AFTER_S),
            )
        )
        .exists()
    ):
        return None  # one open request per requester; a refused one is not asked again soon
    victims = {
        r.pk: r
        for r in Run.objects.filter(
            pk__in=[v.run_id for v in plan.victims], state__in=_OCCUPYING_RUN_STATES
        ).select_related("team")
    }
    if len(victims) != len(plan.victims):
        return None  # a victim ended meanwhile: the next pass plans again
    request = PreemptionRequest.objects.create(
        requester=requester,
        reason=plan.reason[:1000],
        purpose=PreemptionPurpose(plan.kind),
        expires_at=now + dt.timedelta(seconds=settings.PREEMPTION_REQUEST_EXPIRE_S),
    )
    for impact in plan.victims:
        victim = victims[impact.run_id]
        checkpoint = runs_services.last_checkpoint(victim)
        PreemptionVictim.objects.create(
            request=request,
            run=victim,
            gpu_hours_since_checkpoint=impact.gpu_hours_since_checkpoint,
            steps_lost=impact.steps_lost,
            next_checkpoint_in_s=impact.next_checkpoint_in_s,
            rollouts_in_flight=impact.rollouts_in_flight,
            expected_resume_s=impact.expected_resume_s,
            last_checkpoint_step=checkpoint.step if checkpoint else None,
            step_at_request=victim.last_step,
        )
    names = ", ".join(f"{v.name} (#{v.pk})" for v in victims.values())
    _decide(requester, DecisionKind.PREEMPTION_REQUESTED, f"preemption of {names} requested")
    runs_services.record_event(
        requester,
        "preemption.requested",
        {"request": request.pk, "victims": list(victims), "reason": plan.reason},
    )
    for victim in victims.values():
        runs_services.record_event(
            victim,
            "preemption.requested",
            {"request": request.pk, "requester": requester.pk, "step": victim.last_step},
        )
    audit_record(
        actor=None,
        team=requester.team,
        action="preemption.request",
        target=request,
        before=None,
        after={"requester": requester.pk, "victims": list(victims), "reason": plan.reason},
    )
    if plan.auto_approved:
        _approve(request, actor=None, auto=True)
    _inbox_changed()
    return request


def _inbox_changed() -> None:
    """Rings the open inbox pages after commit (a doorbell: they re-read the inbox through
    its view). Without waiting for Redis, as a pass must not slow down with open pages."""
    broadcast_on_commit(FLEET_INBOX_GROUP, "inbox.changed", {}, wait=False, doorbell=True)


def hosts_changed() -> None:
    """Rings the open fleet pages after commit: a host's state as the page shows it changed
    (cordon, drain, pool; online or offline by its heartbeat: `console.runs.services`)."""
    broadcast_on_commit(FLEET_HOSTS_GROUP, "hosts.changed", {}, wait=False, doorbell=True)


def _locked_request(request: PreemptionRequest) -> PreemptionRequest:
    return (
        PreemptionRequest.objects.select_for_update()
        .select_related("requester__team")
        .get(pk=request.pk)
    )


def _victim_runs(request: PreemptionRequest) -> list[Run]:
    return [v.run for v in request.victims.select_related("run__team", "run__priority_class")]


def _record_on_all(request: PreemptionRequest, kind: str, data: dict[str, Any]) -> None:
    """An event on the requester's and every victim's run (their charts draw it)."""
    for run in [request.requester, *_victim_runs(request)]:
        runs_services.record_event(
            run, kind, {"request": request.pk, "step": run.last_step, **data}
        )
        runs_services.notify(run, "run.event", {"kind": kind}, to_lists=False)
    _inbox_changed()


def _audit_on_teams(
    request: PreemptionRequest, actor: Any, action: str, before: dict[str, Any]
) -> None:
    """The audit entry goes to every team the decision touches."""
    teams: dict[int, Team] = {request.requester.team_id: request.requester.team}
    for run in _victim_runs(request):
        teams.setdefault(run.team_id, run.team)
    after = {
        "state": request.state,
        "auto": request.auto,
        "rejection_reason": request.rejection_reason,
    }
    for team in teams.values():
        audit_record(
            actor=actor, team=team, action=action, target=request, before=before, after=after
        )


def _approve(request: PreemptionRequest, *, actor: Any, auto: bool) -> None:
    before = {"state": request.state}
    request.state = PreemptionState.APPROVED
    request.auto = auto
    request.decided_by = actor if getattr(actor, "is_authenticated", False) else None
    request.decided_at = timezone.now()
    request.save(update_fields=["state", "auto", "decided_by", "decided_at"])
    how = "auto-approved by its class policy" if auto else f"approved by {actor.get_username()}"
    # a backfilled run lent a head's capacity is stopped on the terms it was placed on
    what = {
        PreemptionPurpose.BACKFILL: "backfill ended: stopped",
        PreemptionPurpose.MOVE: "stopped to move elsewhere",
    }.get(PreemptionPurpose(request.purpose), "preempted")
    for victim in _victim_runs(request):
        if victim.state in (RunState.SCHEDULED, RunState.RUNNING):
            runs_services.run_command(
                actor=actor,
                run=victim,
                kind=CommandKind.PREEMPT,
                payload={"preemption_request": request.pk},
                reason=f"{what} for {request.requester.name} (request #{request.pk}, {how})",
            )
    _decide(request.requester, DecisionKind.PREEMPTION_APPROVED, f"preemption {how}")
    _record_on_all(request, "preemption.approved", {"auto": auto, "by": _who(actor)})
    _audit_on_teams(request, actor, "preemption.approve", before)


def _who(actor: Any) -> str:
    return actor.get_username() if getattr(actor, "is_authenticated", False) else "policy"


def preemption_approve(*, actor: Any, request: PreemptionRequest) -> PreemptionRequest:
    """An admin approves: each victim checkpoints through its Control and stops (the host
    agent sends SIGTERM, then SIGKILL after the victim class's grace period), goes back to the
    queue and later resumes from that checkpoint; the requester is placed once they stop."""
    with transaction.atomic():
        request = _locked_request(request)
        if request.state != PreemptionState.PENDING:
            raise ValidationError({"state": [f"the request is already {request.state}"]})
        _approve(request, actor=actor, auto=False)
    return request


def preemption_reject(*, actor: Any, request: PreemptionRequest, reason: str) -> PreemptionRequest:
    """An admin rejects, saying why; the victims are left alone."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": ["say why the preemption is rejected"]})
    if len(reason) > 1000:
        raise ValidationError({"reason": ["at most 1000 characters"]})
    with transaction.atomic():
        request = _locked_request(request)
        if request.state != PreemptionState.PENDING:
            raise ValidationError({"state": [f"the request is already {request.state}"]})
        before = {"state": request.state}
        request.state = PreemptionState.REJECTED
        request.decided_by = actor
        request.decided_at = timezone.now()
        request.rejection_reason = reason
        request.save(update_fields=["state", "decided_by", "decided_at", "rejection_reason"])
        _decide(
            request.requester,
            DecisionKind.PREEMPTION_REJECTED,
            f"preemption rejected by {actor.get_username()}: {reason}",
        )
        _record_on_all(request, "preemption.rejected", {"by": _who(actor), "reason": reason})
        _audit_on_teams(request, actor, "preemption.reject", before)
    return request


def _expire_requests(now: dt.datetime) -> None:
    for request in (
        PreemptionRequest.objects.select_for_update(skip_locked=True)
        .filter(state=PreemptionState.PENDING, expires_at__lt=now)
        .select_related("requester__team")
    ):
        before = {"state": request.state}
        request.state = PreemptionState.EXPIRED
        request.decided_at = now
        request.save(update_fields=["state", "decided_at"])
        _decide(
            request.requester,
            DecisionKind.PREEMPTION_EXPIRED,
            "preemption request expired without a decision",
        )
        _record_on_all(request, "preemption.expired", {})
        _audit_on_teams(request, None, "preemption.expire", before)


def _close_requests() -> None:
    """Approved requests whose victims have all stopped are done; pending ones whose
    requester is no longer waiting are moot."""
    for request in PreemptionRequest.objects.select_for_update(skip_locked=True).filter(
        state=PreemptionState.APPROVED
    ):
        victim_ids = list(request.victims.values_list("run_id", flat=True))
        if not Attempt.objects.filter(
            run_id__in=victim_ids, state__in=LIVE_ATTEMPT_STATES
        ).exists():
            request.state = PreemptionState.DONE
            request.done_at = timezone.now()
            request.save(update_fields=["state", "done_at"])
            _inbox_changed()
    if (
        PreemptionRequest.objects.filter(state=PreemptionState.PENDING)
        .exclude(requester__state=RunState.QUEUED)
        .update(state=PreemptionState.CANCELLED, decided_at=timezone.now())
    ):
        _inbox_changed()


def _finish_drains() -> None:
    """A draining host with nothing left on it is cordoned (drained)."""
    for host in Host.objects.select_for_update(skip_locked=True).filter(state=HostState.DRAINING):
        if not host.attempts.filter(state__in=LIVE_ATTEMPT_STATES).exists():
            host.state = HostState.CORDONED
            host.state_reason = "drained: nothing runs on it any more"
            host.save(update_fields=["state", "state_reason"])
            hosts_changed()


# --- hosts ----------------------------------------------------------------------------------

HOST_ACTIONS = {
    "cordon": (HostState.CORDONED, "cordoned by {who}: no new placements"),
    "drain": (HostState.DRAINING, "draining by {who}: running jobs finish, nothing new starts"),
    "uncordon": (HostState.READY, "made ready by {who}"),
}


def host_act(*, actor: Any, team: Team, host: Host, action: str, reason: str = "") -> Host:
    """Cordon, drain or uncordon a host (an offline host stays offline until its agent
    beats again: uncordoning it is refused)."""
    if action not in HOST_ACTIONS:
        raise ValidationError({"action": [f"unknown action {action!r}"]})
    state, template = HOST_ACTIONS[action]
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if host.state == HostState.OFFLINE:
            raise ValidationError({"action": ["the host is offline: its agent is not running"]})
        before = {"state": host.state, "state_reason": host.state_reason}
        host.state = state
        host.state_reason = template.format(who=actor.get_username()) + (
            f" ({reason.strip()[:300]})" if reason.strip() else ""
        )
        host.save(update_fields=["state", "state_reason"])
        audit_record(
            actor=actor,
            team=team,
            action=f"host.{action}",
            target=host,
            before=before,
            after={"state": host.state, "state_reason": host.state_reason},
        )
        hosts_changed()
        transaction.on_commit(request_pass)
    return host


def host_set_pool(*, actor: Any, team: Team, host: Host, pool: ResourcePool) -> Host:
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        before = {"pool": host.pool.name if host.pool else None}
        host.pool = pool
        host.save(update_fields=["pool"])
        audit_record(
            actor=actor,
            team=team,
            action="host.set_pool",
            target=host,
            before=before,
            after={"pool": pool.name},
        )
        hosts_changed()
        transaction.on_commit(request_pass)
    return host


# --- classes, pools and quotas ---------------------------------------------------------------

CLASS_FIELDS = (
    "name",
    "value",
    "can_preempt",
    "preemptible",
    "approval",
    "auto_approve_minutes",
    "preempt_after_wait_s",
    "grace_s",
    "description",
)


def _class_snapshot(cls: PriorityClass) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in CLASS_FIELDS}


def _check_class(values: dict[str, Any], instance: PriorityClass | None) -> None:
    errors: dict[str, list[str]] = {}
    name = values.get("name", "")
    clash = PriorityClass.objects.filter(name=name)
    if instance is not None:
        clash = clash.exclude(pk=instance.pk)
    if clash.exists():
        errors["name"] = [f"a class named {name!r} exists"]
    if values.get("approval") not in Approval.values:
        errors["approval"] = [f"one of {', '.join(Approval.values)}"]
    if values.get("auto_approve_minutes", 0) < 0:
        errors["auto_approve_minutes"] = ["must not be negative"]
    if values.get("approval") == Approval.AUTO_RECENT_CHECKPOINT and not values.get(
        "auto_approve_minutes"
    ):
        errors.setdefault("auto_approve_minutes", []).append(
            "auto-approval needs a number of minutes greater than 0"
        )
    if not 0 <= int(values.get("preempt_after_wait_s", 0)) <= 7 * 86400:
        errors["preempt_after_wait_s"] = ["between 0 and 604800 seconds"]
    if not 1 <= int(values.get("grace_s", 0)) <= 86400:
        errors["grace_s"] = ["between 1 and 86400 seconds"]
    if not -(10**6) <= int(values.get("value", 0)) <= 10**6:
        errors["value"] = ["between -1000000 and 1000000"]
    if errors:
        raise ValidationError(errors)


def class_save(
    *, actor: Any, team: Team, values: dict[str, Any], instance: PriorityClass | None = None
) -> PriorityClass:
    """Create (no `instance`) or change a priority class."""
    _check_class(values, instance)
    with transaction.atomic():
        before = _class_snapshot(instance) if instance else None
        cls = instance or PriorityClass()
        if instance is not None and instance.name == DEFAULT_CLASS_NAME:
            values = {**values, "name": DEFAULT_CLASS_NAME}  # runs without a class use it
        for name in CLASS_FIELDS:
            if name in values:
                setattr(cls, name, values[name])
        cls.save()
        audit_record(
            actor=actor,
            team=team,
            action="priority_class.update" if before else "priority_class.create",
            target=cls,
            before=before,
            after=_class_snapshot(cls),
        )
        transaction.on_commit(request_pass)
    return cls


def class_delete(*, actor: Any, team: Team, cls: PriorityClass) -> None:
    if cls.name == DEFAULT_CLASS_NAME:
        raise ValidationError({"name": ["the default class cannot be deleted"]})
    if Run.objects.filter(priority_class=cls).exists():
        raise ValidationError({"name": ["runs use this class: it cannot be deleted"]})
    with transaction.atomic():
        audit_record(
            actor=actor,
            team=team,
            action="priority_class.delete",
            target=cls,
            before=_class_snapshot(cls),
            after=None,
        )
        cls.delete()


def pool_create(*, actor: Any, team: Team, name: str, description: str = "") -> ResourcePool:
    from django.utils.text import slugify

    if not name or slugify(name) != name:
        raise ValidationError({"name": ["lowercase letters, digits, '-' and '_' only"]})
    if ResourcePool.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a pool named {name!r} exists"]})
    with transaction.atomic():
        pool = ResourcePool.objects.create(name=name, description=description[:500])
        audit_record(
            actor=actor,
            team=team,
            action="pool.create",
            target=pool,
            before=None,
            after={"name": name, "description": pool.description},
        )
    return pool


def quota_set(
    *, actor: Any, team: Team, quota_team: Team, pool: ResourcePool, gpus: int
) -> TeamQuota | None:
    """Sets `quota_team`'s guaranteed GPUs in `pool`; 0 removes the quota."""
    if not 0 <= gpus <= 100000:
        raise ValidationError({"gpus": ["between 0 and 100000"]})
    with transaction.atomic():
        existing = TeamQuota.objects.select_for_update().filter(team=quota_team, pool=pool).first()
        before = {"gpus": existing.gpus} if existing else None
        quota: TeamQuota | None
        if gpus == 0:
            if existing is not None:
                audit_record(
                    actor=actor, team=team, action="quota.delete", target=existing,
                    before=before, after=None,
                )  # fmt: skip
                existing.delete()
            quota = None
        else:
            quota = existing or TeamQuota(team=quota_team, pool=pool, gpus=gpus)
            quota.gpus = gpus
            quota.save()
            audit_record(
                actor=actor, team=team, action="quota.set", target=quota, before=before,
                after={"team": quota_team.slug, "pool": pool.name, "gpus": gpus},
            )  # fmt: skip
        transaction.on_commit(request_pass)
    return quota
