"""Exports of a run's data, streamed: trajectories as JSONL or Parquet (filters applied),
metrics as CSV.

Rows are read with a server-side cursor in chunks and written as they come, so a run with a
million trajectories exports in constant memory.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import msgspec
from django.db.models import QuerySet

from console.runs.models import MetricRow, Run, TrajectoryRecord

CHUNK = 1000
_encoder = msgspec.json.Encoder()


def _filtered(
    run: Run,
    step: int | None,
    domain: str,
    min_reward: float | None,
    max_reward: float | None,
) -> QuerySet[TrajectoryRecord]:
    rows = TrajectoryRecord.objects.filter(run=run)
    if step is not None:
        rows = rows.filter(step=step)
    if domain:
        rows = rows.filter(domain=domain)
    if min_reward is not None:
        rows = rows.filter(reward__gte=min_reward)
    if max_reward is not None:
        rows = rows.filter(reward__lte=max_reward)
    return rows


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
    rows = _filtered(run, step, domain, min_reward, max_reward)
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


PARQUET_ROWS_PER_GROUP = 5000


class _Drain:
    """A write-only file for pyarrow whose bytes are taken out as they are written, so the
    Parquet file streams out one row group at a time."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False
        self.position = 0

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data, self.chunks = b"".join(self.chunks), []
        return data


def trajectories_parquet(
    run: Run,
    *,
    step: int | None = None,
    domain: str = "",
    min_reward: float | None = None,
    max_reward: float | None = None,
) -> Iterator[bytes]:
    """The same rows as `trajectories_jsonl`, as a Parquet file: one column per field lists
    and filters on (step, index, attempt, domain, reward, policy_version, task_id,
    rubric_version, finish_reason, response_tokens), the prompt and completion as text, the
    reward breakdown and the whole trajectory as JSON text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("step", pa.int64()),
            ("index", pa.int64()),
            ("attempt", pa.int64()),
            ("domain", pa.string()),
            ("reward", pa.float64()),
            ("policy_version", pa.int64()),
            ("task_id", pa.string()),
            ("rubric_version", pa.int64()),
            ("finish_reason", pa.string()),
            ("response_tokens", pa.int64()),
            ("prompt", pa.string()),
            ("completion", pa.string()),
            ("reward_breakdown", pa.string()),
            ("trajectory", pa.string()),
        ]
    )
    rows = _filtered(run, step, domain, min_reward, max_reward)
    attempts = dict(run.attempts.values_list("pk", "number"))
    sink = _Drain()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}

    def flush() -> bytes:
        writer.write_table(pa.table(columns, schema=schema))
        for values in columns.values():
            values.clear()
        return sink.take()

    for record in rows.order_by("step", "index").iterator(chunk_size=CHUNK):
        data = record.data
        columns["step"].append(record.step)
        columns["index"].append(record.index)
        columns["attempt"].append(attempts.get(record.attempt_id))
        columns["domain"].append(record.domain)
        columns["reward"].append(record.reward)
        columns["policy_version"].append(record.policy_version)
        columns["task_id"].append(record.task_id or None)
        columns["rubric_version"].append(record.rubric_version)
        columns["finish_reason"].append(record.finish_reason)
        columns["response_tokens"].append(record.response_tokens)
        columns["prompt"].append(data.get("prompt"))
        columns["completion"].append(data.get("completion"))
        columns["reward_breakdown"].append(
            _encoder.encode((data.get("reward") or {}).get("breakdown", {})).decode()
        )
        columns["trajectory"].append(_encoder.encode(data).decode())
        if len(columns["step"]) >= PARQUET_ROWS_PER_GROUP:
            yield flush()
    if columns["step"]:
        yield flush()
    writer.close()
    yield sink.take()
