"""The runs API, mounted at /api/: runs, their metrics, trajectories, events, checkpoints and
logs, operator commands, models, and hosts.

Same rules as the registry: a token acts in its team; another team's run answers 404;
researchers launch and control, annotators read (403 on writes); no token is a 401.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, overload

from django.core.exceptions import ValidationError
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from ninja.pagination import paginate

from console.accounts.models import Role
from console.api import ErrorOut, Pagination, answers, api_member, api_membership
from console.registry.jsonvalues import json_value_problem
from console.runs import exports, live, selectors, services
from console.runs.launch import LaunchError, launch_document_json_schema
from console.runs.models import CommandKind, Run, RunState

router = Router(tags=["runs"])


def _run(request: HttpRequest, run_id: int, role: str = Role.ANNOTATOR) -> Run:
    try:
        run = selectors.run_get(pk=run_id)
    except Run.DoesNotExist:
        raise HttpError(404, "No such run") from None
    if run.team_id != api_membership(request).team_id:
        raise HttpError(404, "No such run")
    api_member(request, role)
    return run


# --- schemas --------------------------------------------------------------------------------


class LaunchIn(Schema):
    spec: dict[str, Any] = Field(
        ...,
        description=(
            "The run spec (training.spec) with registry references by name: base_model is a "
            "registered model's slug ('slug@N' for version N), domains is a list of "
            "{domain: slug, weight, pass_threshold?, max_new_tokens?}; every other section "
            "is the run spec's own (algorithm, batch, sampling, kl, eval, checkpoint, ewc, "
            "tools, rollout, deepspeed, lr, lr_warmup_steps, max_steps, seed, cpu_threads, "
            "autocast)."
        ),
        json_schema_extra=launch_document_json_schema(),
    )
    gpus: int = Field(0, ge=0, le=64, description="GPUs the run needs per host (0: a CPU slot)")
    cpu_slots: int = Field(1, ge=1, le=64)
    hosts: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Hosts the run starts on at once (a gang: one process group per host, joined by "
            "a rendezvous on the first; gpus or cpu_slots are per host)"
        ),
    )
    priority_class: str = Field(
        "", max_length=64, description="A priority class's name ('': the default class)"
    )
    priority: int = Field(0, ge=-1000, le=1000, description="Order within the class: higher first")


class AllocationOut(Schema):
    node: int
    host: str
    gpus: int
    cpu_slots: int
    state: str
    exit_code: int | None


class AttemptOut(Schema):
    number: int
    host: str
    hosts: list[AllocationOut]
    rendezvous: str
    state: str
    start_step: int
    resume_from: str
    scheduled_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    outcome: str
    exit_code: int | None
    error: str


class RunOut(Schema):
    id: int
    name: str
    state: str
    state_reason: str
    error: str
    created_by: str
    model: str
    last_step: int
    max_steps: int
    dropped_trajectories: int
    gpus: int
    cpu_slots: int
    hosts: int
    priority_class: str
    priority: int
    created_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    pins: dict[str, Any]


class RunListOut(RunOut):
    latest_reward: float | None = Field(None, description="The newest step's reward/mean")
    eta_seconds: float | None = Field(
        None, description="Seconds to max_steps at the newest steps' pace (running runs only)"
    )
    sparkline: list[tuple[int, float]] = Field(
        ..., description="reward/mean as [step, mean] over at most 40 equal step buckets"
    )


class CompareRunOut(Schema):
    id: int
    name: str
    state: str
    last_step: int
    max_steps: int
    series: dict[str, list[tuple[int, float]]] = Field(
        ...,
        description="Each chart metric's [step, value] points, min/max downsampled to at "
        "most 500 points per series",
    )


class CompareOut(Schema):
    runs: list[CompareRunOut]


class RunDetailOut(RunOut):
    request: dict[str, Any]
    spec: dict[str, Any]
    attempts: list[AttemptOut]
    trajectory_count: int


def _run_out(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "state": run.state,
        "state_reason": run.state_reason,
        "error": run.error,
        "created_by": run.created_by.get_username(),
        "model": str(run.model_version),
        "last_step": run.last_step,
        "max_steps": run.max_steps,
        "dropped_trajectories": run.dropped_trajectories,
        "gpus": run.gpus,
        "cpu_slots": run.cpu_slots,
        "hosts": run.hosts,
        "priority_class": run.priority_class.name if run.priority_class else "",
        "priority": run.priority,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "pins": run.pins,
    }


def _run_detail(run: Run) -> dict[str, Any]:
    return {
        **_run_out(run),
        "request": run.request,
        "spec": run.spec,
        "trajectory_count": selectors.run_trajectory_count(run=run),
        "attempts": [
            {
                "number": a.number,
                "host": a.host.name,
                "hosts": [
                    {
                        "node": n.node_rank,
                        "host": n.host.name,
                        "gpus": n.gpus,
                        "cpu_slots": n.cpu_slots,
                        "state": n.state,
                        "exit_code": n.exit_code,
                    }
                    for n in a.allocations.all()
                ],
                "rendezvous": a.rendezvous,
                "state": a.state,
                "start_step": a.start_step,
                "resume_from": a.resume_from,
                "scheduled_at": a.scheduled_at,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "heartbeat_at": a.heartbeat_at,
                "outcome": a.outcome,
                "exit_code": a.exit_code,
                "error": a.error,
            }
            for a in selectors.run_attempts(run=run)
        ],
    }


class CommandIn(Schema):
    reason: str = Field("", max_length=500)


class OverridesIn(Schema):
    domain_weights: dict[str, float] | None = None
    kl_coef: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    reason: str = Field("", max_length=500)


class CommandOut(Schema):
    run: RunOut
    command: int | None


class MetricsOut(Schema):
    keys: list[str]
    rows: list[dict[str, Any]]


class TrajectoryOut(Schema):
    step: int
    index: int
    domain: str
    reward: float
    policy_version: int
    task_id: str
    rubric_version: int | None
    finish_reason: str
    response_tokens: int
    attempt: int
    trajectory: dict[str, Any]


class TrajectoryPage(Schema):
    items: list[TrajectoryOut]
    next_cursor: str | None


class EventOut(Schema):
    id: int
    kind: str
    step: int | None
    data: dict[str, Any]
    created_at: dt.datetime


class CheckpointOut(Schema):
    id: int
    step: int
    path: str
    reason: str
    policy_version: int
    attempt: int
    created_at: dt.datetime


class PromoteIn(Schema):
    slug: str = Field(..., max_length=64)
    title: str = Field("", max_length=200)


class ModelVersionOut(Schema):
    id: int
    number: int
    path: str
    source_run: int | None
    source_step: int | None
    created_at: dt.datetime


class ModelOut(Schema):
    id: int
    slug: str
    title: str
    description: str
    versions: list[ModelVersionOut]


class HostOut(Schema):
    name: str
    state: str
    state_reason: str
    queue: str
    gpu_slots: int
    cpu_slots: int
    inventory: dict[str, Any]
    heartbeat_at: dt.datetime | None


class LogOut(Schema):
    attempt: int
    host: str
    bytes: int
    text: str


# --- runs -----------------------------------------------------------------------------------


class _RunListPage(Sequence[dict[str, Any]]):
    """The filtered runs for the paginator: the newest reward, sparkline and ETA are read only
    for the page it slices (three queries), not for every run of the team."""

    def __init__(self, runs: Any) -> None:
        self.runs = runs

    def __len__(self) -> int:
        return int(self.runs.count())

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, int):
            return self[index : index + 1][0]
        runs = selectors.run_list_summaries(list(self.runs[index]))
        return [
            {
                **_run_out(run),
                "latest_reward": run.latest_reward,  # type: ignore[attr-defined]
                "eta_seconds": run.eta_s,  # type: ignore[attr-defined]
                "sparkline": run.sparkline,  # type: ignore[attr-defined]
            }
            for run in runs
        ]


@router.get(
    "/runs",
    response=answers({200: list[RunListOut]}),
    summary="The team's runs, newest first, with progress, newest reward and a sparkline",
)
@paginate(Pagination)
def run_list(
    request: HttpRequest,
    state: str = Query("", max_length=16),
    # PostgreSQL refuses NUL in a query: a 422 here, as for the registry's search.
    q: str = Query(
        "",
        max_length=100,
        pattern=r"^[^\x00]*$",
        description="part of the name, or a pinned domain's slug",
    ),
    launched_by: str = Query(
        "", max_length=150, pattern=r"^[^\x00]*$", description="the launcher's username"
    ),
) -> Any:
    if state and state not in RunState.values:
        raise HttpError(422, f"unknown state {state!r}; one of {', '.join(RunState.values)}")
    filters = selectors.RunListFilters(state=state, q=q.strip(), launched_by=launched_by.strip())
    runs = selectors.run_list_filtered(team=api_member(request).team, filters=filters)
    return _RunListPage(runs.select_related("created_by", "model_version__model"))


@router.get(
    "/runs/compare",
    response=answers({200: CompareOut}),
    summary="Several runs' chart series, downsampled, to overlay (the compare page's data)",
)
def run_compare(
    request: HttpRequest,
    ids: str = Query(..., max_length=200, description="run ids, comma-separated (2 to 8)"),
    metrics: str = Query(
        "", max_length=2000, description="only these metric keys, comma-separated"
    ),
) -> Any:
    try:
        wanted = live.parse_compare_ids([ids])
    except ValueError as error:
        return 422, {"detail": str(error), "errors": {"ids": [str(error)]}}
    runs = [_run(request, run_id) for run_id in wanted]
    only = [key.strip() for key in metrics.split(",") if key.strip()]
    return {"runs": live.compare_series(runs, keys=only or None)}


@router.post("/runs", response=answers({201: RunDetailOut}), summary="Launch a run")
def run_launch(request: HttpRequest, payload: LaunchIn) -> Any:
    membership = api_member(request, Role.RESEARCHER)
    problem = json_value_problem(payload.spec)
    if problem:
        return 422, {"detail": "invalid run spec", "errors": {"spec": [problem]}}
    try:
        run = services.run_launch(
            actor=request.user,
            team=membership.team,
            document=payload.spec,
            gpus=payload.gpus,
            cpu_slots=payload.cpu_slots,
            hosts=payload.hosts,
            priority_class=payload.priority_class,
            priority=payload.priority,
        )
    except LaunchError as error:
        return 422, {"detail": "invalid run spec", "errors": error.errors}
    return 201, _run_detail(selectors.run_get(pk=run.pk))


@router.get("/runs/{run_id}", response=answers({200: RunDetailOut}))
def run_get(request: HttpRequest, run_id: int) -> Any:
    return _run_detail(_run(request, run_id))


def _command(
    request: HttpRequest, run_id: int, kind: str, payload: dict[str, Any], reason: str
) -> Any:
    run = _run(request, run_id, Role.RESEARCHER)
    try:
        command = services.run_command(
            actor=request.user, run=run, kind=kind, payload=payload, reason=reason
        )
    except ValidationError as error:
        return 422, {"detail": "invalid command", "errors": error.message_dict}
    except ValueError as error:
        raise HttpError(409, str(error)) from None
    return 200, {
        "run": _run_out(selectors.run_get(pk=run.pk)),
        "command": command.pk if command else None,
    }


@router.post("/runs/{run_id}/cancel", response=answers({200: CommandOut, 409: ErrorOut}))
def run_cancel(request: HttpRequest, run_id: int, payload: CommandIn) -> Any:
    return _command(request, run_id, CommandKind.CANCEL, {}, payload.reason)


@router.post(
    "/runs/{run_id}/preempt",
    response=answers({200: CommandOut, 409: ErrorOut}),
    summary="Checkpoint, stop, and go back to the queue",
)
def run_preempt(request: HttpRequest, run_id: int, payload: CommandIn) -> Any:
    return _command(request, run_id, CommandKind.PREEMPT, {}, payload.reason)


@router.post(
    "/runs/{run_id}/overrides",
    response=answers({200: CommandOut, 409: ErrorOut}),
    summary="Change domain weights, KL coefficient or temperature from the next step",
)
def run_overrides(request: HttpRequest, run_id: int, payload: OverridesIn) -> Any:
    values = payload.dict(exclude_none=True)
    reason = values.pop("reason", "")
    return _command(request, run_id, CommandKind.OVERRIDES, values, reason)


@router.get("/runs/{run_id}/metrics", response=answers({200: MetricsOut}))
def run_metrics(
    request: HttpRequest,
    run_id: int,
    # Named differently in Python: a query field called `keys` shadows the schema's own method.
    wanted_keys: str = Query(
        "", alias="keys", max_length=4000, description="comma-separated metric names"
    ),
    since_step: int = Query(0, ge=0, le=2**31),
) -> Any:
    run = _run(request, run_id)
    wanted = [k for k in wanted_keys.split(",") if k] or None
    return {
        "keys": selectors.run_metric_keys(run=run),
        "rows": selectors.run_metrics(run=run, keys=wanted, since_step=since_step),
    }


def _cursor(value: str) -> tuple[int, int] | None:
    if not value:
        return None
    step, _, index = value.partition(".")
    if not (step.isdigit() and index.isdigit()) or len(value) > 24:
        raise HttpError(422, "cursor: use the next_cursor of the previous page")
    return int(step), int(index)


@router.get("/runs/{run_id}/trajectories", response=answers({200: TrajectoryPage}))
def run_trajectories(
    request: HttpRequest,
    run_id: int,
    step: int | None = Query(None, ge=0, le=2**31),
    domain: str = Query("", max_length=64),
    min_reward: float | None = Query(None, allow_inf_nan=False),
    max_reward: float | None = Query(None, allow_inf_nan=False),
    cursor: str = Query("", max_length=24),
    limit: int = Query(50, ge=1, le=500),
) -> Any:
    run = _run(request, run_id)
    rows = selectors.run_trajectories(
        run=run,
        step=step,
        domain=domain,
        min_reward=min_reward,
        max_reward=max_reward,
        after=_cursor(cursor),
        limit=limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    attempts = {a.pk: a.number for a in run.attempts.all()}
    return {
        "items": [
            {
                "step": r.step,
                "index": r.index,
                "domain": r.domain,
                "reward": r.reward,
                "policy_version": r.policy_version,
                "task_id": r.task_id,
                "rubric_version": r.rubric_version,
                "finish_reason": r.finish_reason,
                "response_tokens": r.response_tokens,
                "attempt": attempts.get(r.attempt_id, 0),
                "trajectory": r.data,
            }
            for r in rows
        ],
        "next_cursor": f"{rows[-1].step}.{rows[-1].index}" if more and rows else None,
    }


def _streamed(description: str, media_type: str) -> dict[str, Any]:
    """The OpenAPI answer of a streamed file (ninja's `response=` describes JSON only)."""
    return {
        "responses": {
            "200": {
                "description": description,
                "content": {media_type: {"schema": {"type": "string"}}},
            }
        }
    }


def _download(chunks: Any, content_type: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(chunks, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@router.get(
    "/runs/{run_id}/trajectories.jsonl",
    response=answers({}),
    summary="Export the run's trajectories (filters as for the list), one JSON object a line",
    openapi_extra=_streamed("the trajectories, streamed", "application/x-ndjson"),
)
def run_trajectories_export(
    request: HttpRequest,
    run_id: int,
    step: int | None = Query(None, ge=0, le=2**31),
    domain: str = Query("", max_length=64),
    min_reward: float | None = Query(None, allow_inf_nan=False),
    max_reward: float | None = Query(None, allow_inf_nan=False),
) -> Any:
    run = _run(request, run_id)
    rows = exports.trajectories_jsonl(
        run, step=step, domain=domain, min_reward=min_reward, max_reward=max_reward
    )
    return _download(rows, "application/x-ndjson", f"run-{run.pk}-trajectories.jsonl")


@router.get(
    "/runs/{run_id}/trajectories.parquet",
    response=answers({}),
    summary="Export the run's trajectories (filters as for the list) as a Parquet file",
    openapi_extra=_streamed("the trajectories, streamed", "application/vnd.apache.parquet"),
)
def run_trajectories_parquet(
    request: HttpRequest,
    run_id: int,
    step: int | None = Query(None, ge=0, le=2**31),
    domain: str = Query("", max_length=64),
    min_reward: float | None = Query(None, allow_inf_nan=False),
    max_reward: float | None = Query(None, allow_inf_nan=False),
) -> Any:
    run = _run(request, run_id)
    rows = exports.trajectories_parquet(
        run, step=step, domain=domain, min_reward=min_reward, max_reward=max_reward
    )
    return _download(rows, "application/vnd.apache.parquet", f"run-{run.pk}-trajectories.parquet")


@router.get(
    "/runs/{run_id}/metrics.csv",
    response=answers({}),
    summary="Export the run's metrics, one row per step and one column per metric",
    openapi_extra=_streamed("the metrics, streamed", "text/csv"),
)
def run_metrics_export(request: HttpRequest, run_id: int) -> Any:
    run = _run(request, run_id)
    return _download(exports.metrics_csv(run), "text/csv", f"run-{run.pk}-metrics.csv")


@router.get("/runs/{run_id}/events", response=answers({200: list[EventOut]}))
def run_events(
    request: HttpRequest,
    run_id: int,
    after: int = Query(0, ge=0, le=2**62),
    limit: int = Query(200, ge=1, le=500),
) -> Any:
    return list(selectors.run_events(run=_run(request, run_id), after_id=after, limit=limit))


@router.get("/runs/{run_id}/checkpoints", response=answers({200: list[CheckpointOut]}))
def run_checkpoints(request: HttpRequest, run_id: int) -> Any:
    return [
        {
            "id": c.pk,
            "step": c.step,
            "path": c.path,
            "reason": c.reason,
            "policy_version": c.policy_version,
            "attempt": c.attempt.number,
            "created_at": c.created_at,
        }
        for c in selectors.run_checkpoints(run=_run(request, run_id))
    ]


@router.get(
    "/runs/{run_id}/logs",
    response=answers({200: list[LogOut]}),
    summary="Each attempt's job output (bounded: its head and its newest part)",
)
def run_logs(request: HttpRequest, run_id: int) -> Any:
    return [
        {"attempt": a.number, "host": a.host.name, "bytes": a.log_bytes, "text": a.log_text}
        for a in selectors.run_attempts(run=_run(request, run_id))
    ]


@router.post(
    "/checkpoints/{checkpoint_id}/promote",
    response=answers({201: ModelVersionOut}),
    summary="Make a checkpoint a model version (the base of a next run)",
)
def checkpoint_promote(request: HttpRequest, checkpoint_id: int, payload: PromoteIn) -> Any:
    try:
        checkpoint = selectors.checkpoint_get(pk=checkpoint_id)
    except Exception:
        raise HttpError(404, "No such checkpoint") from None
    if checkpoint.run.team_id != api_membership(request).team_id:
        raise HttpError(404, "No such checkpoint")
    api_member(request, Role.RESEARCHER)
    try:
        version = services.checkpoint_promote(
            actor=request.user, checkpoint=checkpoint, slug=payload.slug, title=payload.title
        )
    except ValidationError as error:
        return 422, {"detail": "cannot promote", "errors": error.message_dict}
    return 201, _version_out(version)


def _version_out(version: Any) -> dict[str, Any]:
    source = version.source_checkpoint
    return {
        "id": version.pk,
        "number": version.number,
        "path": version.path,
        "source_run": source.run_id if source else None,
        "source_step": source.step if source else None,
        "created_at": version.created_at,
    }


@router.get("/models", response=answers({200: list[ModelOut]}), summary="The team's models")
@paginate(Pagination)
def model_list(request: HttpRequest) -> Any:
    return [
        {
            "id": m.pk,
            "slug": m.slug,
            "title": m.title,
            "description": m.description,
            "versions": [_version_out(v) for v in m.versions.all()],
        }
        for m in selectors.model_list(team=api_member(request).team)
    ]


@router.get("/hosts", response=answers({200: list[HostOut]}), summary="Hosts and their state")
@paginate(Pagination)
def host_list(request: HttpRequest) -> Any:
    api_member(request)
    return [
        {
            "name": h.name,
            "state": h.state,
            "state_reason": h.state_reason,
            "queue": h.queue,
            "gpu_slots": h.gpu_slots,
            "cpu_slots": h.cpu_slots,
            "inventory": h.inventory,
            "heartbeat_at": h.heartbeat_at,
        }
        for h in selectors.host_list()
    ]
