"""Reads for runs, hosts and models. Callers check the team (console.accounts.access) first."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Count, Prefetch, Q, QuerySet

from console.accounts.models import Team
from console.registry.models import VersionStatus
from console.runs.live import snapshot_xmin
from console.runs.models import (
    LIVE_ATTEMPT_STATES,
    PER_STEP_EVENT_KINDS,
    Allocation,
    Attempt,
    Checkpoint,
    Host,
    MetricRow,
    ModelVersion,
    RegisteredModel,
    Run,
    RunEvent,
    RunState,
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
    """The run's attempts, each with its hosts (`allocations`, node 0 first)."""
    nodes = Allocation.objects.select_related("host").order_by("node_rank")
    return (
        run.attempts.select_related("host")
        .prefetch_related(Prefetch("allocations", queryset=nodes))
        .order_by("number")
    )


def run_trajectory_count(*, run: Run) -> int:
    """What the sink stored (a counter it keeps: counting the rows of a long run is slow)."""
    return run.trajectories_stored


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


def run_events(*, run: Run, after_id: int = 0, limit: int = 200) -> list[RunEvent]:
    """The run's events after event `after_id`, for a client that polls with the last id it
    got. Ids are drawn before commit, so with several writers (the sink, an operator's edit,
    the scheduler) a smaller id can commit after a bigger one was listed, and "id greater
    than" would skip it for good. So events are listed by writing transaction, then id, and
    only those of transactions older than the oldest one still open (every one of those has
    ended: nothing can commit before them any more); "after" is after that event's place in
    this order. An event that is gone (a restarted attempt deletes its step timelines) is
    placed by id, as before."""
    # Every transaction older than this horizon has ended, so later reads (each statement's own
    # snapshot is newer) see all of its events.
    xmin = snapshot_xmin()
    events = RunEvent.objects.filter(run=run, xid__lt=xmin)
    after = RunEvent.objects.filter(run=run, pk=after_id).values_list("xid", flat=True)
    after_xid = after.first() if after_id else None
    if after_xid is not None:
        events = events.filter(Q(xid__gt=after_xid) | Q(xid=after_xid, id__gt=after_id))
    else:
        events = events.filter(id__gt=after_id)
    return list(events.order_by("xid", "id")[:limit])


def run_checkpoints(*, run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run).select_related("attempt").order_by("step", "id")


def run_checkpoints_newest(*, run: Run, limit: int) -> tuple[list[Checkpoint], bool]:
    """The run's newest `limit` checkpoints, newest first, and whether it has older ones (a
    long run saves hundreds: the page shows the newest, the API lists every one)."""
    rows = list(
        Checkpoint.objects.filter(run=run)
        .select_related("attempt")
        .order_by("-step", "-id")[: limit + 1]
    )
    return rows[:limit], len(rows) > limit


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


def host_list_with_live_nodes() -> QuerySet[Host]:
    """Every host with the nodes of live attempts on it (`live_nodes`: a run on one host has
    one; a gang has one on each of its hosts), with their attempts and runs."""
    live = (
        Allocation.objects.filter(attempt__state__in=LIVE_ATTEMPT_STATES)
        .select_related("attempt", "run__team")
        .order_by("run_id")
    )
    return Host.objects.order_by("name").prefetch_related(
        Prefetch("allocations", queryset=live, to_attr="live_nodes")
    )


# --- the runs list (console.runs.views.run_list, consumers.RunListConsumer) --------------------

SPARK_KEY = "reward/mean"  # the loop also writes it as critic/score/mean (training/metrics.py)
SPARK_BUCKETS = 40
SPARK_SAMPLES = 8 * SPARK_BUCKETS  # steps read per run for its sparkline, at most (about)
ETA_WINDOW_STEPS = 20
RUN_LIST_LIMIT = 200


@dataclass(frozen=True)
class RunListFilters:
    """The runs list's filters, from its query string (unknown values are dropped, so a bad
    link shows the unfiltered list rather than an error)."""

    state: str = ""
    q: str = ""  # part of the run's name, or a pinned domain's slug
    launched_by: str = ""  # a username

    @classmethod
    def from_query(cls, query: Any) -> RunListFilters:
        def text(name: str, limit: int) -> str:
            # PostgreSQL refuses NUL in a query: dropped, like any other unusable value.
            return str(query.get(name, "") or "").replace("\x00", "").strip()[:limit]

        state = text("state", 16)
        return cls(
            state=state if state in RunState.values else "",
            q=text("q", 100),
            launched_by=text("launched_by", 150),
        )

    def query(self) -> str:
        return urlencode({k: v for k, v in asdict(self).items() if v})


def run_list_filtered(*, team: Team | int, filters: RunListFilters) -> QuerySet[Run]:
    """The team's runs, newest first, filtered (no per-run counts: the list socket reads its
    rows again at every step of a run)."""
    runs = Run.objects.filter(team=team).select_related("created_by", "model_version__model")
    if filters.state:
        runs = runs.filter(state=filters.state)
    if filters.q:
        runs = runs.filter(
            Q(name__icontains=filters.q) | Q(pins__domains__contains=[{"slug": filters.q}])
        )
    if filters.launched_by:
        runs = runs.filter(created_by__username=filters.launched_by)
    return runs.order_by("-created_at", "-pk")


def run_list_launchers(*, team: Team | int) -> list[str]:
    """Who launched the team's runs (the launched-by filter's choices)."""
    names = (
        Run.objects.filter(team=team)
        .values_list("created_by__username", flat=True)
        .distinct()
        .order_by("created_by__username")
    )
    return list(names)


def eta_seconds(*, state: str, last_step: int, max_steps: int, span: Any) -> float | None:
    """Seconds until `max_steps` at the pace of the newest steps the current attempt wrote:
    `span` is (first step, last step, seconds between their writes); None when the run is not
    training or there is no pace yet."""
    if state != RunState.RUNNING or span is None or max_steps <= last_step:
        return None
    first, last, seconds = span
    if first is None or last is None or seconds is None or last <= first:
        return None
    return (max_steps - last_step) * float(seconds) / (last - first)


def run_list_summaries(runs: list[Run]) -> list[Run]:
    """Sets on each run its newest reward (``latest_reward``), a sparkline of its reward mean
    (``sparkline``: [[first step, mean]] of at most SPARK_BUCKETS equal step buckets, averaged
    in PostgreSQL over a systematic sample of at most about SPARK_SAMPLES steps, so its cost
    does not grow with the run) and an ETA (``eta_s``). Three queries for the whole list."""
    ids = [run.pk for run in runs]
    latest: dict[int, float] = {}
    spark: dict[int, list[list[float]]] = {}
    spans: dict[int, tuple[Any, Any, Any]] = {}
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT r.id, m.value FROM unnest(%(ids)s::int[]) AS r(id),
                LATERAL (SELECT ("values"->>%(key)s)::float8 AS value FROM runs_metric
                         WHERE run_id = r.id AND jsonb_typeof("values"->%(key)s) = 'number'
                         ORDER BY step DESC LIMIT 1) m
                """,
                {"ids": ids, "key": SPARK_KEY},
            )
            latest = {run_id: value for run_id, value in cursor.fetchall()}
            # Every `stride`-th step only (and the newest): a run of 100k steps reads about
            # SPARK_SAMPLES rows' values, not 100k, each time its row is pushed to a list.
            strides = [max(1, math.ceil((run.last_step + 1) / SPARK_SAMPLES)) for run in runs]
            cursor.execute(
                """
                WITH sample AS (
                    SELECT r.id, s.step
                    FROM unnest(%(ids)s::int[], %(strides)s::int[], %(lasts)s::int[])
                         AS r(id, stride, last),
                    LATERAL (SELECT generate_series(0, r.last, r.stride) AS step
                             UNION SELECT r.last) s
                ), points AS (
                    SELECT m.run_id, m.step, (m."values"->>%(key)s)::float8 AS value
                    FROM sample JOIN runs_metric m ON m.run_id = sample.id AND m.step = sample.step
                    WHERE jsonb_typeof(m."values"->%(key)s) = 'number'
                ), spans AS (
                    SELECT run_id, min(step) AS low, max(step) AS high FROM points
                    GROUP BY run_id
                )
                SELECT p.run_id, min(p.step), avg(p.value) FROM points p JOIN spans s USING (run_id)
                GROUP BY p.run_id, (p.step - s.low) * %(buckets)s / (s.high - s.low + 1)
                ORDER BY p.run_id, min(p.step)
                """,
                {
                    "ids": ids,
                    "strides": strides,
                    "lasts": [run.last_step for run in runs],
                    "key": SPARK_KEY,
                    "buckets": SPARK_BUCKETS,
                },
            )
            for run_id, step, value in cursor.fetchall():
                if value is not None and math.isfinite(value):
                    spark.setdefault(run_id, []).append([step, value])
            running = [run.pk for run in runs if run.state == RunState.RUNNING]
            if running:
                # The pace of the newest steps written since the current attempt started (a
                # resumed run's pace does not count the time it spent queued).
                cursor.execute(
                    """
                    SELECT r.id, min(t.step), max(t.step),
                           extract(epoch FROM max(t.updated_at) - min(t.updated_at))
                    FROM unnest(%(ids)s::int[]) AS r(id),
                    LATERAL (SELECT step, updated_at FROM runs_metric
                             WHERE run_id = r.id AND updated_at >= coalesce(
                                 (SELECT max(started_at) FROM runs_attempt
                                  WHERE run_id = r.id), '-infinity')
                             ORDER BY step DESC LIMIT %(window)s) t
                    GROUP BY r.id
                    """,
                    {"ids": running, "window": ETA_WINDOW_STEPS},
                )
                spans = {row[0]: row[1:] for row in cursor.fetchall()}
    for run in runs:
        run.latest_reward = latest.get(run.pk)  # type: ignore[attr-defined]
        run.sparkline = spark.get(run.pk, [])  # type: ignore[attr-defined]
        run.eta_s = eta_seconds(  # type: ignore[attr-defined]
            state=run.state, last_step=run.last_step, max_steps=run.max_steps,
            span=spans.get(run.pk),
        )  # fmt: skip
        run.eta_text = duration_text(run.eta_s)  # type: ignore[attr-defined]
        run.spark_points = sparkline_points(run.sparkline)  # type: ignore[attr-defined]
    return runs


def duration_text(seconds: float | None) -> str:
    """'under 1 s', '45 s', '12 min', '3 h 05 min', '2 d 4 h'; '' for None."""
    if seconds is None:
        return ""
    whole = max(int(round(seconds)), 0)
    if whole < 1:
        return "under 1 s"
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def sparkline_points(points: list[list[float]], width: int = 120, height: int = 28) -> str:
    """An SVG polyline's ``points`` for a sparkline (x by step, y scaled to the series' own
    range, higher values up)."""
    if not points:
        return ""
    steps = [p[0] for p in points]
    values = [p[1] for p in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    xs = (width - 2) / (x1 - x0) if x1 > x0 else 0.0
    ys = (height - 4) / (y1 - y0) if y1 > y0 else 0.0
    coords = []
    for step, value in points:
        x = 1 + (step - x0) * xs if xs else width / 2
        y = height - 2 - (value - y0) * ys if ys else height / 2
        coords.append(f"{x:.1f},{y:.1f}")
    if len(coords) == 1:
        coords.append(coords[0])
    return " ".join(coords)


def runs_by_ids(*, ids: list[int]) -> list[Run]:
    """The runs with these ids that exist, in the order asked (callers check each run's team)."""
    found = {run.pk: run for run in Run.objects.filter(pk__in=ids).select_related("team")}
    return [found[pk] for pk in ids if pk in found]


# --- a run's page header (console.runs.views.run_detail) ---------------------------------------

# The events of a live edit's round trip: asked for, delivered to the job, then applied (one
# event per changed value) or refused with the job's reason.
OVERRIDE_EVENT_KINDS = (
    "control.overrides_requested",
    "control.delivered",
    "control.override_refused",
    "mix.weights_changed",
    "kl.coef_changed",
    "sampling.temperature_changed",
)
OVERRIDE_EVENT_ROWS = 6


def _start_kl_coef(spec: dict[str, Any]) -> float | None:
    kl = spec.get("kl")
    if isinstance(kl, dict) and isinstance(kl.get("coef"), int | float):
        return float(kl["coef"])
    from training.algorithm_config import AlgorithmConfig

    try:
        return float(AlgorithmConfig.model_validate(spec.get("algorithm", "grpo")).kl_coef)
    except ValueError:
        return None


def run_values_in_force(*, run: Run) -> dict[str, Any]:
    """The domain weights, KL coefficient and sampling temperature the run trains with now:
    the launch values, replaced by the newest change the job reported applying; and the newest
    events of live edits (requested, delivered, applied or refused)."""
    spec = run.spec if isinstance(run.spec, dict) else {}
    sampling = spec.get("sampling")
    if not isinstance(sampling, dict):
        sampling = {}
    values: dict[str, Any] = {
        "domain_weights": {
            str(pin.get("slug")): pin.get("weight") for pin in run.pins.get("domains", [])
        },
        "kl_coef": _start_kl_coef(spec),
        "temperature": sampling.get("temperature", 1.0),
    }
    events = RunEvent.objects.filter(run=run)
    for kind, name in (
        ("mix.weights_changed", "domain_weights"),
        ("kl.coef_changed", "kl_coef"),
        ("sampling.temperature_changed", "temperature"),
    ):
        newest = events.filter(kind=kind).order_by("-id").values_list("data", flat=True).first()
        if isinstance(newest, dict) and "new" in newest:
            values[name] = newest["new"]
    values["events"] = list(
        events.filter(kind__in=OVERRIDE_EVENT_KINDS).order_by("-id")[:OVERRIDE_EVENT_ROWS]
    )
    return values


def run_policy_version(*, run: Run) -> int | None:
    """The policy version of the newest trajectory (the weights the rollouts now use)."""
    return (
        TrajectoryRecord.objects.filter(run=run)
        .order_by("-step", "-index")
        .values_list("policy_version", flat=True)
        .first()
    )
