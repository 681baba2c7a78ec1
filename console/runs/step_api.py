"""The step timeline in the API (mounted at /api/ next to `console.runs.api`): one step's
spans per rank, as the step timeline page draws them (`console.runs.steps`), and the slowest
steps. Same rules as the runs API: another team's run is a 404, annotators may read."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema
from ninja.errors import HttpError

from console.api import answers
from console.runs import steps
from console.runs.api import _run

router = Router(tags=["runs"])


class SpanOut(Schema):
    stage: str
    start_s: float
    end_s: float
    rank: int
    host: str
    busy_s: float | None = None
    round: int | None = None


class RankOut(Schema):
    rank: int
    host: str
    busy_s: float
    idle_s: float
    gaps: list[list[float]]


class TimelineOut(Schema):
    step: int
    step_s: float
    attempt: int | None
    spans: list[SpanOut]
    ranks: list[RankOut]


class StepOut(Schema):
    step: int
    step_s: float


@router.get(
    "/runs/{run_id}/steps/{step}/timeline",
    response=answers({200: TimelineOut}),
    url_name="run_step_timeline",
    summary="One step's stages per rank (seconds from the step's start) and each rank's idle gaps",
)
def run_step_timeline(request: HttpRequest, run_id: int, step: int) -> Any:
    run = _run(request, run_id)
    timeline = steps.step_timeline(run, step)
    if timeline is None:
        raise HttpError(404, f"Step {step} has no timeline")
    return timeline.as_dict()


@router.get(
    "/runs/{run_id}/steps/slowest",
    response=answers({200: list[StepOut]}),
    summary="The steps with a timeline that took longest, slowest first",
)
def run_slowest_steps(
    request: HttpRequest, run_id: int, limit: int = Query(steps.SLOWEST_STEPS, ge=1, le=500)
) -> Any:
    return steps.slowest_steps(_run(request, run_id), limit=limit)
