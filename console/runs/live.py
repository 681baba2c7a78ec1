"""The reads behind a run's live stream (`/ws/runs/<id>/`, `console.runs.consumers`).

The channel layer only rings a doorbell ("something of run 7 was committed"); what a browser
is shown is always read here, from PostgreSQL, newer than the connection's cursors:

- ``event_xid`` and ``event_sent`` (and ``metric_xid``/``metric_sent``,
  ``trajectory_xid``/``trajectory_sent``, the same for metric rows and trajectories, one
  helper for the three: `_xid_window`): rows are sent by writing transaction, not by id or
  step. Ids are drawn before commit, so with two writers (a job's sink and an operator's edit
  or the job's Control recording a delivered command, or two benches) a smaller id can commit
  after a bigger one was sent; a cursor of ids or steps would skip it for good. (An old
  attempt's sink is not one of them: it is refused once a newer attempt is current.)
  Each read takes its snapshot's ``xmin`` (every transaction older than it has committed or
  rolled back, so its rows are final) and sends every visible row of a transaction at or
  after ``event_xid`` that is not in ``event_sent``. The next cursor is ``xmin``, with
  ``event_sent`` the transactions at or after it whose rows were sent: a
  transaction's rows appear all at once, so sending by transaction sends nothing twice, and a
  committed transaction is never held behind another writer's open one (which is what the
  horizon alone did: one writer's open 50-event transaction delayed the other's by its whole
  length). ``event_sent`` is bounded (MAX_SENT_XIDS): while a long transaction keeps the
  horizon back, newer transactions past the bound wait for it (the message says
  ``held_back`` and the consumer reads again shortly).
- ``metric_step`` and ``metric_keys``: the newest metric step the client holds and which chart
  keys it holds at that step. Metrics of one step merge into one row (the loop writes a step's
  training metrics, then its held-out evaluation into the same step; the merge sets the row's
  transaction again, so the row is read again), and only the keys the client lacks at its
  newest step are sent. A late row at an older step is sent whole (the page keys points by
  step, so a point it held is replaced by the same value).

Every read runs in one REPEATABLE READ transaction, so the rows sent and the cursors returned
describe the same moment. Sync functions: the consumer calls them via
``database_sync_to_async``.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import msgspec
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left

from console.runs import rollup
from console.runs.models import PER_STEP_EVENT_KINDS, MetricRow, Run, RunEvent, TrajectoryRecord

# The metric keys drawn as charts (names from training/metrics.py).
CHART_KEY = re.compile(
    r"^(?:"
    r"reward/mean|reward/std|reward/[^/]+/mean|reward/[^/]+/std"
    r"|reward/[^/]+/[^/]+/mean|reward/[^/]+/[^/]+/std"
    r"|pass_rate(?:/[^/]+)?"
    r"|eval/reward/mean|eval/reward/[^/]+/mean|eval/pass_rate(?:/[^/]+)?"
    r"|actor/kl|actor/entropy|actor/grad_norm|actor/pg_clipfrac"
    r"|response_length/mean|response_length/clip_ratio"
    r"|frac_reward_zero_std|batch/discarded_fraction|perf/throughput"
    r"|timing_s/[^/]+"
    r")$"
)
# The same test for PostgreSQL (POSIX regex; the pattern above uses no Python-only syntax).
CHART_KEY_SQL = CHART_KEY.pattern

MAX_POINTS = 1000  # per series in a snapshot: two points (min and max) per bucket
SNAPSHOT_TRAJECTORIES = 20
DELTA_TRAJECTORIES = 50  # a delta carries at most the newest 50 new trajectories (a feed)
SNAPSHOT_EVENTS = 500
DELTA_MAX_STEPS = 5000
# Transactions past the horizon whose events a cursor records as sent (``event_sent``). Under
# a steady load the horizon trails by a few transactions; the bound only bites while one
# transaction stays open for long, and keeps the cursor a client sends back small.
MAX_SENT_XIDS = 200  # a resume that missed more steps than this gets a fresh snapshot
COMPLETION_CHARS = 200

Cursors = dict[str, Any]


@functools.lru_cache(maxsize=4096)
def is_chart_key(key: str) -> bool:
    return bool(CHART_KEY.match(key))


_JSON = msgspec.json.Decoder()


def _repeatable_read() -> None:
    """Call first inside `transaction.atomic()`: every later read sees one moment."""
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def _run_facts(run: Run) -> dict[str, Any]:
    return {
        "state": run.state,
        "reason": run.state_reason,
        "last_step": run.last_step,
        "max_steps": run.max_steps,
        "dropped_trajectories": run.dropped_trajectories,
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _event(event: RunEvent) -> dict[str, Any]:
    data = event.data if isinstance(event.data, dict) else {}
    reason = data.get("reason") or data.get("error") or ""
    if data.get("host") and not reason:  # an attempt placed on a host: where the run moved
        reason = f"attempt {data.get('attempt', '?')} on {data['host']}"
    return {
        "id": event.pk,
        "kind": event.kind,
        "step": event.step,
        "reason": str(reason)[:300],
        "at": event.created_at.isoformat(),
    }


def _trajectories(rows: Any) -> list[dict[str, Any]]:
    return [
        {
            "step": row.step,
            "index": row.index,
            "domain": row.domain,
            "reward": row.reward,
            "finish_reason": row.finish_reason,
            "completion": row.completion or "",
        }
        for row in rows
    ]


def _trajectory_rows(run_id: int) -> Any:
    return (
        TrajectoryRecord.objects.filter(run_id=run_id)
        .annotate(completion=Left(KT("data__completion"), COMPLETION_CHARS))
        .only("step", "index", "domain", "reward", "finish_reason")
    )


def downsampled_series(run_id: int, max_points: int = MAX_POINTS) -> dict[str, list[list[float]]]:
    """Every chart key's points ``[step, value]`` in step order. A run of at most `max_points`
    steps is read from its rows, every point. A longer one is read from the buckets the sink
    keeps (`console.runs.rollup`: fixed widths, the narrowest that spans the run in at most
    `max_points // 2` buckets): each bucket's minimum and maximum (so spikes survive), plus
    the series' last point (where the live points continue). A run of 100k steps costs two
    small queries, not a pass over its 10M values."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(step), max(step), count(*) FROM runs_metric WHERE run_id = %s", [run_id]
        )
        low, high, count = cursor.fetchone()
        if not count:
            return {}
        buckets = max(max_points // 2, 1)
        if count > max_points:
            return rollup.series(run_id, low, high, buckets)
        # Every point is kept. The rows are decoded here rather than expanded in PostgreSQL:
        # `jsonb_each` with the key pattern over 800 steps x 120 keys took ~2 s on a loaded
        # machine, fetching the rows as text and decoding them ~0.1 s.
        cursor.execute(
            'SELECT step, "values"::text FROM runs_metric WHERE run_id = %s ORDER BY step',
            [run_id],
        )
        series: dict[str, list[list[float]]] = {}
        for step, text in cursor.fetchall():
            for key, raw in _JSON.decode(text).items():
                value = _number(raw)
                if value is not None and is_chart_key(key):
                    series.setdefault(key, []).append([step, value])
        return dict(sorted(series.items()))


def snapshot_xmin() -> int:
    """The oldest transaction still open when this transaction's snapshot was taken (call
    first in the transaction: under REPEATABLE READ the first statement fixes the snapshot)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def _shown_events(run_id: int) -> Any:
    return RunEvent.objects.filter(run_id=run_id).exclude(kind__in=PER_STEP_EVENT_KINDS)


def _pending_sql() -> str:
    """One query for the three kinds (each read used to compile and run three, then fetch all
    three even when nothing was new): per kind, the transactions past the new floor with
    visible rows not sent yet (ordered, at most ``limit``), and one transaction below it that
    ended since the last read with rows not sent (whether any waits); and the run's newest
    metric step. Plain SQL (its table names and kinds are constants): composing querysets per
    read cost more than running them."""
    shown_events = "AND kind <> ALL(%(per_step)s::text[])"
    tables = {
        "event": (RunEvent._meta.db_table, shown_events),
        "metric": (MetricRow._meta.db_table, ""),
        "trajectory": (TrajectoryRecord._meta.db_table, ""),
    }
    parts = []
    for kind, (table, extra) in tables.items():
        where = f"run_id = %(run)s {extra}"
        parts.append(
            f"(SELECT '{kind}' AS kind, xid, false AS settled FROM (SELECT DISTINCT xid "  # noqa: S608
            f"FROM {table} WHERE {where} AND xid >= %({kind}_floor)s "
            f"AND xid <> ALL(%({kind}_kept)s::bigint[]) ORDER BY xid "
            f"LIMIT %({kind}_limit)s) AS newer)"
        )
        parts.append(
            f"(SELECT '{kind}', xid, true FROM {table} WHERE {where} "  # noqa: S608
            f"AND xid >= %({kind}_old_floor)s AND xid < %({kind}_floor)s "
            f"AND xid <> ALL(%({kind}_sent)s::bigint[]) LIMIT 1)"
        )
    parts.append(
        f"(SELECT 'newest_step', step, false FROM {MetricRow._meta.db_table} "  # noqa: S608
        "WHERE run_id = %(run)s ORDER BY step DESC LIMIT 1)"
    )
    return " UNION ALL ".join(parts)


_PENDING = _pending_sql()
_KINDS = ("event", "metric", "trajectory")


def _xid_window(
    rows: Any, floor: int, sent: list[int], xmin: int, newer: list[int], any_settled: bool
) -> tuple[Any, int, list[int], bool]:
    """The rows of `rows` (a queryset of a model with ``xid``: events, metric rows,
    trajectories) to send after the cursor (`floor`, `sent`) in a snapshot whose horizon is
    `xmin` (see ``event_xid``), given what `_PENDING` found: the transactions past the horizon
    with rows not sent (`newer`) and whether rows below it wait (`any_settled`). Returns the
    rows, the next cursor's floor and sent transactions, and whether committed rows wait
    (``held_back``: MAX_SENT_XIDS reached)."""
    new_floor = max(floor, xmin)  # never backwards: a cursor from another server is kept
    kept = [xid for xid in sent if xid >= new_floor]
    room = MAX_SENT_XIDS - len(kept)
    held_back = len(newer) > room
    newer = newer[:room]
    if not newer and not any_settled:
        return rows.none(), new_floor, sorted(kept), held_back  # nothing to read
    # Below the new floor every transaction has ended: all of it that was not sent, goes.
    settled = Q(xid__gte=floor, xid__lt=new_floor)
    if sent:
        settled &= ~Q(xid__in=sent)
    wanted = settled | Q(xid__in=newer) if newer else settled
    return rows.filter(wanted), new_floor, sorted(kept + newer), held_back


def _windows(
    run_id: int, since: Cursors, xmin: int
) -> tuple[dict[str, Any], dict[str, Any], bool, int | None]:
    """The events, metric rows and trajectories to send after `since` (by kind), the next
    cursors' floors and sent transactions, whether any committed row waits, and the run's
    newest metric step."""
    params: dict[str, Any] = {"run": run_id, "per_step": list(PER_STEP_EVENT_KINDS)}
    for kind in _KINDS:
        floor, sent = since.get(f"{kind}_xid", 0), since.get(f"{kind}_sent", [])
        new_floor = max(floor, xmin)
        kept = [xid for xid in sent if xid >= new_floor]
        params.update({
            f"{kind}_old_floor": floor, f"{kind}_floor": new_floor, f"{kind}_sent": list(sent),
            f"{kind}_kept": kept, f"{kind}_limit": MAX_SENT_XIDS - len(kept) + 1,
        })  # fmt: skip
    newer: dict[str, list[int]] = {kind: [] for kind in _KINDS}
    any_settled: set[str] = set()
    newest_step = None
    with connection.cursor() as cursor:
        cursor.execute(_PENDING, params)
        for kind, value, settled in cursor.fetchall():
            if kind == "newest_step":
                newest_step = int(value)
            elif settled:
                any_settled.add(kind)
            else:
                newer[kind].append(int(value))
    tables = {
        "event": _shown_events(run_id),
        "metric": MetricRow.objects.filter(run_id=run_id),
        "trajectory": _trajectory_rows(run_id),
    }
    rows: dict[str, Any] = {}
    cursors: dict[str, Any] = {}
    held_back = False
    for kind, table in tables.items():
        floor, sent = since.get(f"{kind}_xid", 0), since.get(f"{kind}_sent", [])
        rows[kind], cursors[f"{kind}_xid"], cursors[f"{kind}_sent"], held = _xid_window(
            table, floor, sent, xmin, sorted(newer[kind]), kind in any_settled
        )
        held_back |= held
    return rows, cursors, held_back, newest_step


def _metric_cursor(run_id: int) -> tuple[int, list[str]]:
    row = MetricRow.objects.filter(run_id=run_id).order_by("-step").first()
    if row is None:
        return -1, []
    return row.step, sorted(
        k for k, v in row.values.items() if is_chart_key(k) and _number(v) is not None
    )


def snapshot(run_id: int) -> dict[str, Any]:
    """Everything the page draws, and the cursors a later delta continues from."""
    with transaction.atomic():
        _repeatable_read()
        xmin = snapshot_xmin()
        run = Run.objects.get(pk=run_id)
        series = downsampled_series(run_id)
        metric_step, metric_keys = _metric_cursor(run_id)
        shown, windows, held_back, _ = _windows(run_id, {}, xmin)
        events = list(shown["event"].order_by("-id")[:SNAPSHOT_EVENTS])
        events.sort(key=lambda e: e.pk)
        newest = list(shown["trajectory"].order_by("-step", "-index")[:SNAPSHOT_TRAJECTORIES])
        cursors: Cursors = {"metric_step": metric_step, "metric_keys": metric_keys, **windows}
        return {
            "type": "snapshot",
            **_run_facts(run),
            "series": series,
            "events": [_event(e) for e in events],
            "trajectories": _trajectories(newest),  # newest first
            "cursors": cursors,
            "held_back": held_back,
        }


def clean_cursors(value: Any) -> Cursors | None:
    """The cursors a client sent back with ``resume``, or None when they are malformed."""
    if not isinstance(value, dict):
        return None

    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    try:
        metric_step = value["metric_step"]
        metric_keys = value.get("metric_keys", [])
        event_xid = value["event_xid"]
    except KeyError:
        return None
    if not is_int(metric_step) or not is_int(event_xid):
        return None
    if not isinstance(metric_keys, list) or not all(isinstance(k, str) for k in metric_keys):
        return None
    if len(metric_keys) > 1000:
        return None
    cleaned: Cursors = {"metric_step": metric_step, "metric_keys": sorted(set(metric_keys))}
    for kind in ("event", "metric", "trajectory"):
        # A page loaded before metric rows and trajectories had their own transaction
        # cursors sends the events' one: the moment it describes held both.
        xid = value.get(f"{kind}_xid", event_xid)
        sent = value.get(f"{kind}_sent", value.get("event_sent", []))
        if not is_int(xid) or not isinstance(sent, list) or len(sent) > MAX_SENT_XIDS:
            return None
        if not all(is_int(x) for x in sent):
            return None
        cleaned[f"{kind}_xid"], cleaned[f"{kind}_sent"] = xid, sorted(set(sent))
    return cleaned


def delta(run_id: int, since: Cursors) -> dict[str, Any]:
    """What was committed after `since`: every chart point (not downsampled), new events and
    the newest new trajectories, with the run's facts and the new cursors. When the run
    restarted from an earlier step (a resumed attempt deletes what came after its
    checkpoint), ``truncate_after`` tells the client to drop points and trajectories after
    that step first. A client too far behind (more than DELTA_MAX_STEPS steps) gets a
    snapshot instead."""
    with transaction.atomic():
        _repeatable_read()
        xmin = snapshot_xmin()
        run = Run.objects.get(pk=run_id)
        cursors = dict(since)
        # Every event of the transactions committed since the last read, transaction by
        # transaction, each in the order it wrote them (id).
        shown, windows, held_back, newest_step = _windows(run_id, since, xmin)
        events = list(shown["event"].order_by("xid", "id"))
        restarts = [e.step for e in events if e.kind == "run.started" and e.step is not None]
        truncate_after: int | None = min(restarts) if restarts else None
        if truncate_after is not None and cursors["metric_step"] > truncate_after:
            cursors["metric_step"] = truncate_after
            row = MetricRow.objects.filter(run_id=run_id, step=truncate_after).first()
            cursors["metric_keys"] = sorted(k for k in row.values if is_chart_key(k)) if row else []
        if newest_step is not None and newest_step - cursors["metric_step"] > DELTA_MAX_STEPS:
            return snapshot(run_id)
        series: dict[str, list[list[float]]] = {}
        held = set(cursors["metric_keys"])
        for row in shown["metric"].order_by("step"):
            present = []
            for key, raw in sorted(row.values.items()):
                value = _number(raw)
                if value is None or not is_chart_key(key):
                    continue
                present.append(key)
                if row.step == cursors["metric_step"] and key in held:
                    continue
                series.setdefault(key, []).append([row.step, value])
            if row.step > cursors["metric_step"]:
                cursors["metric_step"] = row.step
                held = set(present)
            elif row.step == cursors["metric_step"]:
                held |= set(present)
        cursors["metric_keys"] = sorted(held)
        # A feed: the newest of the new ones (the rest count as sent).
        new_trajectories = list(
            shown["trajectory"].order_by("-step", "-index")[:DELTA_TRAJECTORIES]
        )
        cursors.pop("trajectory", None)  # an older page's cursor, followed by transaction now
        cursors.update(windows)
        message: dict[str, Any] = {
            "type": "delta",
            **_run_facts(run),
            "series": series,
            "events": [_event(e) for e in events],
            "trajectories": _trajectories(new_trajectories),  # newest first
            "cursors": cursors,
            "held_back": held_back,
        }
        if truncate_after is not None:
            message["truncate_after"] = truncate_after
        return message


COMPARE_MAX_RUNS = 8
COMPARE_MAX_POINTS = 500  # per series and run: eight runs draw as fast as one


def compare_series(
    runs: list[Run], keys: list[str] | None = None, max_points: int = COMPARE_MAX_POINTS
) -> list[dict[str, Any]]:
    """Each run's chart series, min/max downsampled as for its own page (one query a run),
    for overlaying several runs on one chart; with `keys`, only those keys."""
    result = []
    for run in runs:
        series = downsampled_series(run.pk, max_points=max_points)
        if keys:
            series = {key: points for key, points in series.items() if key in keys}
        result.append(
            {
                "id": run.pk,
                "name": run.name,
                "state": run.state,
                "last_step": run.last_step,
                "max_steps": run.max_steps,
                "series": series,
            }
        )
    return result


def parse_compare_ids(values: list[str]) -> list[int]:
    """Run ids from ``?ids=1,2,3`` (or ``ids`` repeated, as the runs list's checkboxes send
    them), in order, without repeats; ValueError saying what is wrong."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or len(part) > 10:
                raise ValueError(f"'{part[:20]}' is not a run id")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) < 2:
        raise ValueError("pick two or more runs to compare")
    if len(ids) > COMPARE_MAX_RUNS:
        raise ValueError(f"at most {COMPARE_MAX_RUNS} runs can be compared at once")
    return ids
