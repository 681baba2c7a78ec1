"""Reads for runs, hosts and models. Callers check the team (console.accounts.access) first."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, QuerySet

from console.accounts.models import Team
from console.registry.models import VersionStatus
from console.runs.models import (
    PER_STEP_EVENT_KINDS,
    Attempt,
    Checkpoint,
    Host,
    MetricRow,
    ModelVersion,
    RegisteredModel,
    Run,
    RunEvent,
    TrajectoryRecord,
)


def run_list(*, team: Team | int, state: str = "") -> QuerySet[Run]:
    runs = Run.objects.filter(team=team).select_related(
        "created_by", "model_version__model", "priority_class"
    )
    if state:
        runs = runs.filter(state=state)
    return runs.annotate(trajectory_count=Count("trajectories", distinct=True))


def run_get(*, pk: int) -> Run:
    return Run.objects.select_related(
        "team", "created_by", "model_version__model", "priority_class"
    ).get(pk=pk)


def run_attempts(*, run: Run) -> QuerySet[Attempt]:
    return run.attempts.select_related("host").order_by("number")


def run_trajectory_count(*, run: Run) -> int:
    return run.trajectories.count()


def run_metrics(
    *, run: Run, keys: list[str] | None = None, since_step: int = 0
) -> list[dict[str, Any]]:
    rows = MetricRow.objects.filter(run=run, step__gte=since_step).order_by("step")
    result = []
    for row in rows:
        values = row.values if not keys else {k: row.values.get(k) for k in keys if k in row.values}
        result.append({"step": row.step, "values": values})
    return result


def run_metric_keys(*, run: Run) -> list[str]:
    keys: set[str] = set()
    for values in MetricRow.objects.filter(run=run).values_list("values", flat=True)[:500]:
        keys.update(values)
    return sorted(keys)


def run_trajectories(
    *,
    run: Run,
    step: int | None = None,
    domain: str = "",
    min_reward: float | None = None,
    max_reward: float | None = None,
    after: tuple[int, int] | None = None,
    limit: int = 50,
) -> list[TrajectoryRecord]:
    """Trajectories in (step, index) order after the cursor ``after`` = (step, index)."""
    rows = TrajectoryRecord.objects.filter(run=run)
    if step is not None:
        rows = rows.filter(step=step)
    if domain:
        rows = rows.filter(domain=domain)
    if min_reward is not None:
        rows = rows.filter(reward__gte=min_reward)
    if max_reward is not None:
        rows = rows.filter(reward__lte=max_reward)
    if after is not None:
        from django.db.models import Q

        rows = rows.filter(Q(step__gt=after[0]) | Q(step=after[0], index__gt=after[1]))
    return list(rows.order_by("step", "index")[:limit])


def run_events(*, run: Run, after_id: int = 0, limit: int = 200) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run, id__gt=after_id).order_by("id")[:limit]


def run_checkpoints(*, run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run).select_related("attempt").order_by("step", "id")


def checkpoint_get(*, pk: int) -> Checkpoint:
    return Checkpoint.objects.select_related("run", "run__team").get(pk=pk)


def model_list(*, team: Team | int) -> QuerySet[RegisteredModel]:
    return RegisteredModel.objects.filter(team=team).prefetch_related("versions")


def model_get(*, pk: int) -> RegisteredModel:
    return RegisteredModel.objects.get(pk=pk)


def model_version_choices(*, team: Team | int) -> QuerySet[ModelVersion]:
    return (
        ModelVersion.objects.filter(model__team=team, status=VersionStatus.PUBLISHED)
        .select_related("model")
        .order_by("model__slug", "-number")
    )


def host_list() -> QuerySet[Host]:
    return Host.objects.order_by("name")


# --- pages (console.runs.views) ---------------------------------------------------------------


def run_metrics_newest(*, run: Run, limit: int = 20) -> list[MetricRow]:
    """The newest `limit` metric rows of a run, newest first."""
    return list(MetricRow.objects.filter(run=run).order_by("-step")[:limit])


def run_events_newest(*, run: Run, limit: int = 50) -> list[RunEvent]:
    """The newest `limit` events of a run, newest first."""
    events = RunEvent.objects.filter(run=run).exclude(kind__in=PER_STEP_EVENT_KINDS)
    return list(events.order_by("-id")[:limit])


def model_list_with_lineage(*, team: Team | int) -> QuerySet[RegisteredModel]:
    """The team's models with their versions and the run each version was promoted from."""
    versions = ModelVersion.objects.select_related("source_checkpoint__run").order_by("number")
    return (
        RegisteredModel.objects.filter(team=team)
        .prefetch_related(Prefetch("versions", queryset=versions))
        .order_by("slug")
    )


def model_version_get(*, pk: int, number: int) -> ModelVersion:
    """Version `number` of model `pk`, with its team (for the access check)."""
    return ModelVersion.objects.select_related(
        "model__team", "source_checkpoint__run", "created_by"
    ).get(model_id=pk, number=number)


def host_list_with_live_attempts() -> QuerySet[Host]:
    """Every host with the attempts now live on it (and their runs)."""
    from console.runs.models import LIVE_ATTEMPT_STATES

    live = (
        Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES)
        .select_related("run__team")
        .order_by("run_id")
    )
    return Host.objects.order_by("name").prefetch_related(
        Prefetch("attempts", queryset=live, to_attr="live_attempts")
    )
