"""Exports of a run's data, streamed: trajectories as JSONL (filters applied), metrics as CSV.

Rows are read with a server-side cursor in chunks and written as they come, so a run with a
million trajectories exports in constant memory.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import msgspec

from console.runs.models import MetricRow, Run, TrajectoryRecord

CHUNK = 1000
_encoder = msgspec.json.Encoder()


def trajectories_jsonl(
    run: Run,
    *,
    step: int | None = None,
    domain: str = "",
    min_reward: float | None = None,
    max_reward: float | None = None,
) -> Iterator[bytes]:
    """One line per trajectory in (step, index) order: the stored trajectory with its step,
    index and attempt number (the reward breakdown is inside, under ``reward``)."""
    rows = TrajectoryRecord.objects.filter(run=run)
    if step is not None:
        rows = rows.filter(step=step)
    if domain:
        rows = rows.filter(domain=domain)
    if min_reward is not None:
        rows = rows.filter(reward__gte=min_reward)
    if max_reward is not None:
        rows = rows.filter(reward__lte=max_reward)
    attempts = dict(run.attempts.values_list("pk", "number"))
    fields = ("step", "index", "attempt_id", "data")
    for step_, index, attempt_id, data in (
        rows.order_by("step", "index").values_list(*fields).iterator(chunk_size=CHUNK)
    ):
        line = {"step": step_, "index": index, "attempt": attempts.get(attempt_id), **data}
        yield _encoder.encode(line) + b"\n"


def metrics_csv(run: Run) -> Iterator[bytes]:
    """One row per step, one column per metric name the run reported (empty where a step has
    no value); the header lists every name, sorted, after ``step``."""
    names: set[str] = set()
    for values in (
        MetricRow.objects.filter(run=run)
        .values_list("values", flat=True)
        .iterator(chunk_size=CHUNK)
    ):
        names.update(values)
    columns = sorted(names)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["step", *columns])
    for step, values in (
        MetricRow.objects.filter(run=run)
        .order_by("step")
        .values_list("step", "values")
        .iterator(chunk_size=CHUNK)
    ):
        writer.writerow([step, *("" if values.get(c) is None else values[c] for c in columns)])
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()
