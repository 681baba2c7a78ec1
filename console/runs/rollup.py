"""Pre-aggregated chart series (`MetricRollup`): per run, chart key and bucket of steps, the
bucket's lowest and highest value (with their steps) and its newest value, at a few fixed
bucket widths. The live page's snapshot draws a long run from these rows instead of expanding
every step's metrics: 100k steps x 100 keys stored read as at most ~500 buckets per key.

Kept up to date by the sink in the transaction that writes a step's metrics (`record`, one
statement), and rebuilt from the stored rows for the buckets an attempt's restart cut short
(`truncate`). The same min/max-per-bucket as `live.downsampled_series` computes from the raw
rows for short runs, so spikes survive.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import connection

# Bucket widths in steps, each 4x the last: a snapshot uses the narrowest that spans the run
# in at most its number of buckets (500: 4 serves up to ~2k steps, 4096 up to ~2M; beyond,
# 4096 anyway), so a chart gets between a quarter of its buckets and all of them.
WIDTHS = (4, 16, 64, 256, 1024, 4096)

_UPSERT = """
    INSERT INTO runs_metric_rollup AS r
        (run_id, key, width, bucket, low, low_step, high, high_step, last, last_step)
    SELECT %(run)s, kv.key, w.width, %(step)s / w.width, kv.v, %(step)s, kv.v, %(step)s,
           kv.v, %(step)s
    FROM (
        SELECT key, (value #>> '{}')::float8 AS v FROM jsonb_each(%(values)s::jsonb)
        WHERE jsonb_typeof(value) = 'number' AND key ~ %(pattern)s
    ) kv CROSS JOIN unnest(%(widths)s::int[]) AS w(width)
    ON CONFLICT (run_id, width, key, bucket) DO UPDATE SET
        low_step = CASE WHEN EXCLUDED.low < r.low
                          OR (EXCLUDED.low = r.low AND EXCLUDED.low_step < r.low_step)
                        THEN EXCLUDED.low_step ELSE r.low_step END,
        low = LEAST(r.low, EXCLUDED.low),
        high_step = CASE WHEN EXCLUDED.high > r.high
                           OR (EXCLUDED.high = r.high AND EXCLUDED.high_step < r.high_step)
                         THEN EXCLUDED.high_step ELSE r.high_step END,
        high = GREATEST(r.high, EXCLUDED.high),
        last = CASE WHEN EXCLUDED.last_step >= r.last_step THEN EXCLUDED.last ELSE r.last END,
        last_step = GREATEST(r.last_step, EXCLUDED.last_step)
"""

# The buckets of `run` from its stored rows (steps from `first`, and for each width only the
# buckets that hold a step after `after`: -1 for every bucket).
REBUILD = """
    INSERT INTO runs_metric_rollup
        (run_id, key, width, bucket, low, low_step, high, high_step, last, last_step)
    SELECT run_id, key, width, step / width,
           min(v), (array_agg(step ORDER BY v, step))[1],
           max(v), (array_agg(step ORDER BY v DESC, step))[1],
           (array_agg(v ORDER BY step DESC))[1], max(step)
    FROM (
        SELECT m.run_id, m.step, kv.key, (kv.value #>> '{}')::float8 AS v
        FROM runs_metric m, jsonb_each(m."values") kv
        WHERE m.run_id = %(run)s AND m.step >= %(first)s
          AND jsonb_typeof(kv.value) = 'number' AND kv.key ~ %(pattern)s
    ) p CROSS JOIN unnest(%(widths)s::int[]) AS w(width)
    WHERE (step / width) * width + width - 1 > %(after)s
    GROUP BY run_id, key, width, step / width
"""


def _pattern() -> str:
    from console.runs.live import CHART_KEY_SQL

    return CHART_KEY_SQL


def record(run_id: int, step: int, values_json: str) -> None:
    """Folds one write of a step's metrics into the buckets (inside the sink's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _UPSERT,
            {
                "run": run_id,
                "step": step,
                "values": values_json,
                "pattern": _pattern(),
                "widths": list(WIDTHS),
            },
        )


def truncate(run_id: int, after: int) -> None:
    """Forgets the steps after `after` (their rows were deleted): the buckets that held them
    go, and those that also held earlier steps are rebuilt from the rows still stored."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM runs_metric_rollup WHERE run_id = %s AND bucket * width + width - 1 > %s",
            [run_id, after],
        )
        cursor.execute(
            REBUILD,
            {
                "run": run_id,
                "first": (after // max(WIDTHS)) * max(WIDTHS),
                "after": after,
                "pattern": _pattern(),
                "widths": list(WIDTHS),
            },
        )


def rebuild(run_id: int) -> None:
    """Every bucket of a run from its stored rows (runs stored before the rollup existed)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs_metric_rollup WHERE run_id = %s", [run_id])
        cursor.execute(
            REBUILD,
            {
                "run": run_id,
                "first": 0,
                "after": -1,
                "pattern": _pattern(),
                "widths": list(WIDTHS),
            },
        )


def width_for(low: int, high: int, buckets: int) -> int:
    for width in WIDTHS:
        if high // width - low // width + 1 <= buckets:
            return width
    return WIDTHS[-1]


def series(run_id: int, low: int, high: int, buckets: int) -> dict[str, list[list[float]]]:
    """Every chart key's points ``[step, value]`` in step order: each bucket's lowest and
    highest, and the series' newest point."""
    width = width_for(low, high, buckets)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, low_step, low, high_step, high, last_step, last "
            "FROM runs_metric_rollup WHERE run_id = %s AND width = %s ORDER BY key, bucket",
            [run_id, width],
        )
        rows: list[Any] = cursor.fetchall()
    found: dict[str, dict[int, float]] = {}
    newest: dict[str, tuple[int, float]] = {}
    for key, low_step, low_v, high_step, high_v, last_step, last_v in rows:
        points = found.setdefault(key, {})
        points[low_step] = low_v
        points[high_step] = high_v
        newest[key] = (last_step, last_v)  # rows come in bucket order: the last one wins
    result: dict[str, list[list[float]]] = {}
    for key, points in found.items():
        step, value = newest[key]
        points[step] = value
        finite = [[s, v] for s, v in sorted(points.items()) if math.isfinite(v)]
        if finite:
            result[key] = finite
    return result
