"""Where a run reports: the `Sink` protocol, a JSONL sink, and a non-blocking wrapper.

`training.run` calls a sink from its main loop. The console's sink writes Postgres and
broadcasts to the channel layer; the CLI's is `JsonlSink`. Either can be slow, so the loop
wraps it in `QueueingSink`, which hands records to a background thread through a bounded queue.

What happens when that queue is full (the sink is slower than the run):

- **metrics, checkpoints and events are never dropped.** The loop waits for room (back
  pressure: the run slows to the sink's pace rather than lose a step's metrics or the record of
  a checkpoint). The time spent waiting is counted in ``blocked_s``.
- **trajectories are dropped**, oldest-first never: the *new* batch is refused, counted in
  ``dropped_trajectories``, and an event ``sink.trajectories_dropped`` (with the running count)
  goes through the never-dropped channel once the queue has room, so the loss is visible.
- an exception in the wrapped sink does not kill the run: it is counted, the first few are
  kept in ``errors``, and `close` raises `SinkError` after draining whatever it still can.

Trajectories waiting in the queue are delivered in batches (consecutive batches are merged up
to ``trajectory_batch`` items per call), which is what a database-backed sink wants.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["JsonlSink", "ListSink", "NullSink", "QueueingSink", "Sink", "SinkError"]


@runtime_checkable
class Sink(Protocol):
    """Receives what a run produces. Methods are called from one thread, in step order.

    - ``trajectories(items)``: one dict per scored sample, the dict form of
      `training.trajectory.Trajectory` (its fields are defined there, once;
      ``trajectory_json_schema()`` is its JSON Schema).
    - ``metrics(step, values)``: ``{name: float}`` for one step (names in `training.metrics`).
    - ``checkpoint(info)``: ``{"step", "path", "reason", "policy_version"}`` once a checkpoint
      is on disk.
    - ``event(kind, data)``: things that happen (``run.started``, ``mix.weights_changed``,
      ``run.preempted`` ...).
    """

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None: ...

    def metrics(self, step: int, values: dict[str, float]) -> None: ...

    def checkpoint(self, info: dict[str, Any]) -> None: ...

    def event(self, kind: str, data: dict[str, Any]) -> None: ...


class SinkError(RuntimeError):
    """The wrapped sink failed; ``errors`` holds the first failures' messages."""

    def __init__(self, errors: list[str], count: int) -> None:
        self.errors = errors
        self.count = count
        super().__init__(f"sink failed {count} time(s); first: {'; '.join(errors[:3])}")


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _clean_float(value: float) -> float | None:
    """JSON has no NaN/inf: they are written as null (and flagged by the name in metrics)."""
    return value if math.isfinite(value) else None


class NullSink:
    """Discards everything (ranks other than 0 report nothing)."""

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        pass

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def checkpoint(self, info: dict[str, Any]) -> None:
        pass

    def event(self, kind: str, data: dict[str, Any]) -> None:
        pass


class ListSink:
    """Keeps everything in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.trajectory_items: list[dict[str, Any]] = []
        self.metric_rows: list[tuple[int, dict[str, float]]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        self.trajectory_items.extend(items)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.metric_rows.append((step, dict(values)))

    def checkpoint(self, info: dict[str, Any]) -> None:
        self.checkpoints.append(dict(info))

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, dict(data)))

    def metrics_at(self, step: int) -> dict[str, float]:
        for row_step, values in self.metric_rows:
            if row_step == step:
                return values
        raise KeyError(step)

    def event_kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


class JsonlSink:
    """Appends to ``metrics.jsonl``, ``trajectories.jsonl``, ``events.jsonl`` and
    ``checkpoints.jsonl`` under ``directory`` (one JSON object a line, flushed per call, so a
    crash loses at most the line being written and ``tail -f`` works)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files = {
            name: (self.directory / f"{name}.jsonl").open("a", encoding="utf-8")
            for name in ("metrics", "trajectories", "events", "checkpoints")
        }

    def _write(self, name: str, record: dict[str, Any]) -> None:
        handle = self._files[name]
        handle.write(json.dumps(record, default=_json_default, allow_nan=False) + "\n")
        handle.flush()

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        for item in items:
            self._write("trajectories", item)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        row = {"step": step, **{k: _clean_float(float(v)) for k, v in values.items()}}
        self._write("metrics", row)

    def checkpoint(self, info: dict[str, Any]) -> None:
        self._write("checkpoints", {"time": time.time(), **info})

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self._write("events", {"time": time.time(), "kind": kind, **data})

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


_STOP = object()


class QueueingSink:
    """Wraps a slow sink so the run never waits for it, except as the module docstring says.

    ``maxsize`` bounds the queue (in calls, not items). ``trajectory_batch`` is the most
    trajectories merged into one call of the wrapped sink. Call `close` (or use ``with``) to
    drain the queue and stop the thread (and close the wrapped sink too, unless
    ``close_inner`` is false: the caller keeps it); `flush` waits until everything queued so far is
    delivered.
    """

    def __init__(
        self,
        inner: Sink,
        maxsize: int = 256,
        trajectory_batch: int = 256,
        max_kept_errors: int = 5,
        close_inner: bool = True,
    ) -> None:
        if maxsize < 2:
            raise ValueError("maxsize must be at least 2")
        self.inner = inner
        self.close_inner = close_inner
        self.trajectory_batch = trajectory_batch
        self.dropped_trajectories = 0
        self.blocked_s = 0.0
        self.error_count = 0
        self.errors: list[str] = []
        self._max_kept_errors = max_kept_errors
        self._reported_drops = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="sink-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the run's side

    def trajectories(self, items: Sequence[dict[str, Any]]) -> None:
        if not items:
            return
        self._check_open()  # drops are reported by the next never-dropped call, not here,
        try:  # so that this call can never block
            self._queue.put_nowait(("trajectories", list(items)))
        except queue.Full:
            self.dropped_trajectories += len(items)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._put_reliably(("metrics", step, dict(values)))

    def checkpoint(self, info: dict[str, Any]) -> None:
        self._put_reliably(("checkpoint", dict(info)))

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self._put_reliably(("event", kind, dict(data)))

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything queued so far reached the wrapped sink; False on timeout."""
        self._report_drops()
        done = threading.Event()
        self._put_reliably(("flush", done), report=False)
        return done.wait(timeout)

    def close(self) -> None:
        """Drains the queue, stops the thread and raises `SinkError` if the sink failed."""
        if self._closed:
            return
        self._report_drops()
        self._put_reliably(_STOP, report=False)
        self._closed = True
        self._thread.join()
        closer = getattr(self.inner, "close", None) if self.close_inner else None
        if callable(closer):
            closer()
        if self.error_count:
            raise SinkError(self.errors, self.error_count)

    def __enter__(self) -> QueueingSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this QueueingSink is closed")

    def _put_reliably(self, record: Any, report: bool = True) -> None:
        self._check_open()
        if report:
            self._report_drops()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            started = time.perf_counter()
            self._queue.put(record)  # back pressure: wait for the writer
            self.blocked_s += time.perf_counter() - started

    def _report_drops(self) -> None:
        if self.dropped_trajectories == self._reported_drops:
            return
        newly = self.dropped_trajectories - self._reported_drops
        self._reported_drops = self.dropped_trajectories
        self._put_reliably(
            (
                "event",
                "sink.trajectories_dropped",
                {"dropped": newly, "dropped_total": self.dropped_trajectories},
            ),
            report=False,
        )

    # ------------------------------------------------------------------ the writer's side

    def _drain(self) -> None:
        carried: Any = None
        while True:
            record = carried if carried is not None else self._queue.get()
            carried = None
            if record is _STOP:
                return
            if record[0] != "trajectories":
                self._deliver(record)
                continue
            batch = list(record[1])
            # merge the trajectory batches already waiting right behind this one
            while len(batch) < self.trajectory_batch:
                try:
                    following = self._queue.get_nowait()
                except queue.Empty:
                    break
                if following is not _STOP and following[0] == "trajectories":
                    batch.extend(following[1])
                else:
                    carried = following
                    break
            self._deliver_trajectories(batch)

    def _deliver_trajectories(self, items: list[dict[str, Any]]) -> None:
        for start in range(0, len(items), self.trajectory_batch):
            self._call(self.inner.trajectories, items[start : start + self.trajectory_batch])

    def _deliver(self, record: tuple[Any, ...]) -> None:
        kind = record[0]
        if kind == "metrics":
            self._call(self.inner.metrics, record[1], record[2])
        elif kind == "checkpoint":
            self._call(self.inner.checkpoint, record[1])
        elif kind == "event":
            self._call(self.inner.event, record[1], record[2])
        elif kind == "flush":
            record[1].set()

    def _call(self, method: Any, *args: Any) -> None:
        try:
            method(*args)
        except Exception as exc:  # a failing sink must not take the run down
            self.error_count += 1
            if len(self.errors) < self._max_kept_errors:
                self.errors.append(f"{type(exc).__name__}: {exc}")
