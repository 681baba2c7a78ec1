"""Sinks: JSONL files, and the queueing wrapper's behaviour when its sink is slow or broken."""

from __future__ import annotations

import json
import threading

import pytest

from training.sink import JsonlSink, ListSink, QueueingSink, SinkError


def test_jsonl_sink_writes_one_object_a_line(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.metrics(1, {"reward/mean": 0.5, "actor/kl": float("nan")})
    sink.trajectories([{"text": "a"}, {"text": "b"}])
    sink.event("run.started", {"run": "x"})
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "reward/mean": 0.5, "actor/kl": None}]
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "events.jsonl").read_text())["kind"] == "run.started"


class GatedSink(ListSink):
    """A sink that blocks until the test opens its gate (a slow database)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.calls = 0

    def trajectories(self, items):
        self.gate.wait()
        self.calls += 1
        super().trajectories(items)

    def metrics(self, step, values):
        self.gate.wait()
        super().metrics(step, values)


def test_a_full_queue_drops_trajectories_with_an_event_but_never_metrics():
    inner = GatedSink()
    sink = QueueingSink(inner, maxsize=4)
    sent_trajectories = 0
    for step in range(10):
        sink.trajectories([{"step": step}])
        sent_trajectories += 1
    assert sink.dropped_trajectories > 0
    releaser = threading.Timer(0.2, inner.gate.set)
    releaser.start()
    for step in range(20):  # blocks while the queue is full, until the gate opens
        sink.metrics(step, {"x": float(step)})
    sink.close()
    assert [s for s, _ in inner.metric_rows] == list(range(20))
    delivered = len(inner.trajectory_items)
    assert delivered + sink.dropped_trajectories == sent_trajectories
    drops = [d for k, d in inner.events if k == "sink.trajectories_dropped"]
    assert sum(d["dropped"] for d in drops) == sink.dropped_trajectories
    assert sink.blocked_s > 0


def test_waiting_trajectory_batches_are_merged_into_one_call():
    inner = GatedSink()
    sink = QueueingSink(inner, maxsize=64, trajectory_batch=100)
    for step in range(10):
        sink.trajectories([{"step": step}, {"step": step}])
    inner.gate.set()
    sink.close()
    assert len(inner.trajectory_items) == 20
    assert inner.calls <= 2  # the first batch may go alone; the rest wait together
    assert [t["step"] for t in inner.trajectory_items] == sorted(
        t["step"] for t in inner.trajectory_items
    )


def test_a_failing_sink_does_not_stop_the_run_but_close_reports_it():
    class Broken(ListSink):
        def metrics(self, step, values):
            raise OSError("disk full")

    sink = QueueingSink(Broken())
    sink.metrics(0, {"x": 1.0})
    sink.event("still", {})
    assert sink.flush(timeout=5)
    with pytest.raises(SinkError, match="disk full"):
        sink.close()
    assert sink.inner.events == [("still", {})]
