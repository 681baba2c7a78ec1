"""The scheduler's API, mounted at /api/scheduling/: the queue, the fleet (and cordon, drain,
uncordon), priority classes, pools and quotas, and preemption requests (approve, reject).

The fleet is shared by every team, so its writes and the preemption inbox are for admins
(an admin of the token's team; 403 for lower roles). Members read the classes and quotas
(researchers pick a class at launch), the fleet (other teams' runs unnamed) and their own
team's queue; admins see every team's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError

from console.accounts.models import Membership, Role, Team
from console.api import ErrorOut, answers, api_member
from console.runs.models import Host
from console.scheduling import selectors, services
from console.scheduling.models import (
    Approval,
    PreemptionRequest,
    PreemptionState,
    PriorityClass,
    ResourcePool,
)

router = Router(tags=["scheduling"])


def _admin(request: HttpRequest) -> Membership:
    return api_member(request, Role.ADMIN)


def _invalid(error: ValidationError, detail: str) -> tuple[int, dict[str, Any]]:
    return 422, {"detail": detail, "errors": error.message_dict}


# --- schemas --------------------------------------------------------------------------------


class QueueRunOut(Schema):
    run_id: int
    name: str
    team: str
    priority_class: str
    priority: int
    gpus: int
    cpu_slots: int
    hosts: int
    wait_s: float
    reason: str


class QueueAttemptOut(Schema):
    run_id: int
    name: str
    team: str
    priority_class: str
    host: str = Field(description="node 0's host (where the rendezvous is)")
    hosts: list[str] = Field(description="every host the attempt runs on, by node rank")
    attempt: int
    state: str
    last_step: int
    max_steps: int


class SchedulingDecisionOut(Schema):
    run_id: int
    run: str
    kind: str
    reason: str
    created_at: dt.datetime


class QueueOut(Schema):
    pending: list[QueueRunOut]
    running: list[QueueAttemptOut]
    decisions: list[SchedulingDecisionOut]


class FleetHostRunOut(Schema):
    run_id: int | None
    name: str
    team: str
    gpus: int
    cpu_slots: int


class FleetHostOut(Schema):
    id: int
    name: str
    pool: str
    state: str
    state_reason: str
    gpu_slots: int
    gpus_used: int
    cpu_slots: int
    cpu_used: int
    heartbeat_age_s: float | None
    runs: list[FleetHostRunOut]


class FleetHostActionIn(Schema):
    reason: str = Field("", max_length=300)


class PriorityClassIn(Schema):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    value: int = Field(..., ge=-(10**6), le=10**6)
    can_preempt: bool = False
    preemptible: bool = True
    approval: Approval = Approval.ASK
    auto_approve_minutes: float = Field(0.0, ge=0, le=10**6, allow_inf_nan=False)
    preempt_after_wait_s: int = Field(0, ge=0, le=7 * 86400)
    grace_s: int = Field(60, ge=1, le=86400)
    description: str = Field("", max_length=500)


class PriorityClassOut(PriorityClassIn):
    id: int


class ResourcePoolIn(Schema):
    name: str = Field(..., min_length=1, max_length=64)
    description: str = Field("", max_length=500)


class ResourcePoolOut(Schema):
    id: int
    name: str
    description: str
    hosts: list[str]


class TeamQuotaIn(Schema):
    team: str = Field(..., max_length=64, description="The team's slug")
    pool: str = Field(..., max_length=64)
    gpus: int = Field(..., ge=0, le=100000, description="0 removes the quota")


class TeamQuotaOut(Schema):
    team: str
    pool: str
    gpus: int


class PreemptionVictimOut(Schema):
    run_id: int
    name: str
    team: str
    priority_class: str
    gpu_hours_since_checkpoint: float
    steps_lost: int
    next_checkpoint_in_s: float | None
    rollouts_in_flight: int
    expected_resume_s: float | None
    last_checkpoint_step: int | None
    step_at_request: int


class PreemptionOut(Schema):
    id: int
    state: str
    requester_id: int
    requester: str
    requester_team: str
    requester_class: str
    reason: str
    purpose: str = Field(
        ...,
        description="Why the victims stop: preempt (a class preempts or a team reclaims its "
        "quota), move (restarted elsewhere to free whole hosts), backfill (runs lent a "
        "queued run's reserved capacity, stopped now that it can start)",
    )
    auto: bool
    decided_by: str | None
    decided_at: dt.datetime | None
    rejection_reason: str
    created_at: dt.datetime
    expires_at: dt.datetime
    victims: list[PreemptionVictimOut]


class PreemptionRejectIn(Schema):
    reason: str = Field(..., max_length=1000, description="Why (shown to the requester's team)")


# --- the queue and the fleet -----------------------------------------------------------------


def _class_name(run: Any) -> str:
    return run.priority_class.name if run.priority_class else "normal"


@router.get("/queue", response=answers({200: QueueOut}), summary="Pending and running runs")
def queue(request: HttpRequest) -> Any:
    membership = api_member(request)
    team = None if membership.has_role(Role.ADMIN) else membership.team
    data = selectors.queue(team=team)
    return {
        "pending": [
            {
                "run_id": row.run.pk,
                "name": row.run.name,
                "team": row.run.team.slug,
                "priority_class": row.class_name,
                "priority": row.run.priority,
                "gpus": row.run.gpus,
                "cpu_slots": row.run.cpu_slots,
                "hosts": row.run.hosts,
                "wait_s": row.wait_s,
                "reason": row.run.state_reason,
            }
            for row in data.pending
        ],
        "running": [
            {
                "run_id": a.run_id,
                "name": a.run.name,
                "team": a.run.team.slug,
                "priority_class": _class_name(a.run),
                "host": a.host.name,
                "hosts": [share.host.name for share in a.allocations.all()],
                "attempt": a.number,
                "state": a.run.state,
                "last_step": a.run.last_step,
                "max_steps": a.run.max_steps,
            }
            for a in data.running
        ],
        "decisions": [
            {
                "run_id": d.run_id,
                "run": d.run.name,
                "kind": d.kind,
                "reason": d.reason,
                "created_at": d.created_at,
            }
            for d in data.decisions
        ],
    }


def _host_out(row: selectors.HostRow, membership: Membership) -> dict[str, Any]:
    admin = membership.has_role(Role.ADMIN)
    runs = []
    for attempt in row.attempts:
        visible = admin or attempt.run.team_id == membership.team_id
        runs.append(
            {
                "run_id": attempt.run_id if visible else None,
                "name": attempt.run.name if visible else "another team's run",
                "team": attempt.run.team.slug if visible else "",
                "gpus": attempt.run.gpus,
                "cpu_slots": 0 if attempt.run.gpus else attempt.run.cpu_slots,
            }
        )
    return {
        "id": row.host.pk,
        "name": row.host.name,
        "pool": row.pool,
        "state": row.host.state,
        "state_reason": row.host.state_reason,
        "gpu_slots": row.host.gpu_slots,
        "gpus_used": row.gpus_used,
        "cpu_slots": row.host.cpu_slots,
        "cpu_used": row.cpu_used,
        "heartbeat_age_s": row.heartbeat_age_s,
        "runs": runs,
    }


@router.get(
    "/fleet", response=answers({200: list[FleetHostOut]}), summary="Hosts and what runs on them"
)
def fleet(request: HttpRequest) -> Any:
    membership = api_member(request)
    return [_host_out(row, membership) for row in selectors.fleet()]


@router.post(
    "/hosts/{name}/{action}",
    response=answers({200: FleetHostOut}),
    summary="cordon (no new placements), drain (running jobs finish, then cordoned), uncordon",
)
def host_action(request: HttpRequest, name: str, action: str, payload: FleetHostActionIn) -> Any:
    membership = _admin(request)
    if action not in services.HOST_ACTIONS:
        raise HttpError(404, f"No such action {action!r} (cordon, drain, uncordon)")
    host = Host.objects.filter(name=name).first()
    if host is None:
        raise HttpError(404, "No such host")
    try:
        services.host_act(
            actor=request.user,
            team=membership.team,
            host=host,
            action=action,
            reason=payload.reason,
        )
    except ValidationError as error:
        return _invalid(error, f"cannot {action} the host")
    row = next(r for r in selectors.fleet() if r.host.pk == host.pk)
    return 200, _host_out(row, membership)


# --- classes, pools, quotas ------------------------------------------------------------------


def _class_out(cls: PriorityClass) -> dict[str, Any]:
    return {"id": cls.pk, **{name: getattr(cls, name) for name in services.CLASS_FIELDS}}


@router.get("/classes", response=answers({200: list[PriorityClassOut]}), summary="Priority classes")
def class_list(request: HttpRequest) -> Any:
    api_member(request)
    services.default_class()
    return [_class_out(c) for c in selectors.class_list()]


@router.post(
    "/classes", response=answers({201: PriorityClassOut}), summary="Create a priority class"
)
def class_create(request: HttpRequest, payload: PriorityClassIn) -> Any:
    membership = _admin(request)
    try:
        cls = services.class_save(actor=request.user, team=membership.team, values=payload.dict())
    except ValidationError as error:
        return _invalid(error, "invalid priority class")
    return 201, _class_out(cls)


def _class(name: str) -> PriorityClass:
    cls = PriorityClass.objects.filter(name=name).first()
    if cls is None:
        raise HttpError(404, "No such priority class")
    return cls


@router.put("/classes/{name}", response=answers({200: PriorityClassOut}), summary="Change a class")
def class_update(request: HttpRequest, name: str, payload: PriorityClassIn) -> Any:
    membership = _admin(request)
    cls = _class(name)
    try:
        cls = services.class_save(
            actor=request.user, team=membership.team, values=payload.dict(), instance=cls
        )
    except ValidationError as error:
        return _invalid(error, "invalid priority class")
    return 200, _class_out(cls)


@router.delete("/classes/{name}", response=answers({204: None}), summary="Delete a class")
def class_delete(request: HttpRequest, name: str) -> Any:
    membership = _admin(request)
    cls = _class(name)
    try:
        services.class_delete(actor=request.user, team=membership.team, cls=cls)
    except ValidationError as error:
        return _invalid(error, "cannot delete the class")
    return 204, None


@router.get("/pools", response=answers({200: list[ResourcePoolOut]}), summary="Resource pools")
def pool_list(request: HttpRequest) -> Any:
    api_member(request)
    services.default_pool()
    return [
        {
            "id": p.pk,
            "name": p.name,
            "description": p.description,
            "hosts": [h.name for h in p.hosts.all()],
        }
        for p in selectors.pool_list().prefetch_related("hosts")
    ]


@router.post("/pools", response=answers({201: ResourcePoolOut}), summary="Create a resource pool")
def pool_create(request: HttpRequest, payload: ResourcePoolIn) -> Any:
    membership = _admin(request)
    try:
        pool = services.pool_create(
            actor=request.user,
            team=membership.team,
            name=payload.name,
            description=payload.description,
        )
    except ValidationError as error:
        return _invalid(error, "invalid pool")
    return 201, {"id": pool.pk, "name": pool.name, "description": pool.description, "hosts": []}


@router.get("/quotas", response=answers({200: list[TeamQuotaOut]}), summary="Teams' quotas")
def quota_list(request: HttpRequest) -> Any:
    api_member(request)
    return [
        {"team": q.team.slug, "pool": q.pool.name, "gpus": q.gpus} for q in selectors.quota_list()
    ]


@router.put(
    "/quotas",
    response=answers({200: TeamQuotaOut}),
    summary="Set a team's guaranteed GPUs in a pool (0 removes the quota)",
)
def quota_set(request: HttpRequest, payload: TeamQuotaIn) -> Any:
    membership = _admin(request)
    errors: dict[str, list[str]] = {}
    team = Team.objects.filter(slug=payload.team).first()
    pool = ResourcePool.objects.filter(name=payload.pool).first()
    if team is None:
        errors["team"] = [f"no team {payload.team!r}"]
    if pool is None:
        errors["pool"] = [f"no pool {payload.pool!r}"]
    if errors:
        return 422, {"detail": "invalid quota", "errors": errors}
    assert team is not None and pool is not None
    try:
        services.quota_set(
            actor=request.user, team=membership.team, quota_team=team, pool=pool, gpus=payload.gpus
        )
    except ValidationError as error:
        return _invalid(error, "invalid quota")
    return 200, {"team": team.slug, "pool": pool.name, "gpus": payload.gpus}


# --- preemption requests ---------------------------------------------------------------------


def preemption_out(request: PreemptionRequest) -> dict[str, Any]:
    requester = request.requester
    return {
        "id": request.pk,
        "state": request.state,
        "requester_id": requester.pk,
        "requester": requester.name,
        "requester_team": requester.team.slug,
        "requester_class": _class_name(requester),
        "reason": request.reason,
        "purpose": request.purpose,
        "auto": request.auto,
        "decided_by": request.decided_by.get_username() if request.decided_by else None,
        "decided_at": request.decided_at,
        "rejection_reason": request.rejection_reason,
        "created_at": request.created_at,
        "expires_at": request.expires_at,
        "victims": [
            {
                "run_id": v.run_id,
                "name": v.run.name,
                "team": v.run.team.slug,
                "priority_class": _class_name(v.run),
                "gpu_hours_since_checkpoint": v.gpu_hours_since_checkpoint,
                "steps_lost": v.steps_lost,
                "next_checkpoint_in_s": v.next_checkpoint_in_s,
                "rollouts_in_flight": v.rollouts_in_flight,
                "expected_resume_s": v.expected_resume_s,
                "last_checkpoint_step": v.last_checkpoint_step,
                "step_at_request": v.step_at_request,
            }
            for v in request.victims.all()
        ],
    }


def _preemption(request: HttpRequest, pk: int) -> PreemptionRequest:
    _admin(request)
    try:
        return selectors.preemption_get(pk=pk)
    except PreemptionRequest.DoesNotExist:
        raise HttpError(404, "No such preemption request") from None


@router.get(
    "/preemptions",
    response=answers({200: list[PreemptionOut]}),
    summary="Preemption requests, newest first (admins)",
)
def preemption_list(
    request: HttpRequest,
    state: str = Query("", max_length=16),
    limit: int = Query(50, ge=1, le=200),
) -> Any:
    _admin(request)
    if state and state not in PreemptionState.values:
        return 422, {
            "detail": "invalid input",
            "errors": {"state": [f"one of {', '.join(PreemptionState.values)}"]},
        }
    return 200, [preemption_out(r) for r in selectors.preemption_list(state=state)[:limit]]


@router.get("/preemptions/{pk}", response=answers({200: PreemptionOut}))
def preemption_get(request: HttpRequest, pk: int) -> Any:
    return preemption_out(_preemption(request, pk))


@router.post(
    "/preemptions/{pk}/approve",
    response=answers({200: PreemptionOut, 409: ErrorOut}),
    summary="Approve: the victims checkpoint and stop, the requester starts once they have",
)
def preemption_approve(request: HttpRequest, pk: int) -> Any:
    preemption = _preemption(request, pk)
    try:
        services.preemption_approve(actor=request.user, request=preemption)
    except ValidationError as error:
        return 409, {"detail": "; ".join(error.messages), "errors": error.message_dict}
    return 200, preemption_out(selectors.preemption_get(pk=pk))


@router.post(
    "/preemptions/{pk}/reject",
    response=answers({200: PreemptionOut, 409: ErrorOut}),
    summary="Reject, saying why: the victims are left alone",
)
def preemption_reject(request: HttpRequest, pk: int, payload: PreemptionRejectIn) -> Any:
    preemption = _preemption(request, pk)
    if preemption.state != PreemptionState.PENDING:
        return 409, {"detail": f"the request is already {preemption.state}", "errors": {}}
    try:
        services.preemption_reject(actor=request.user, request=preemption, reason=payload.reason)
    except ValidationError as error:
        return _invalid(error, "cannot reject")
    return 200, preemption_out(selectors.preemption_get(pk=pk))
