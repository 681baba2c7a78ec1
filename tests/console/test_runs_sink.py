"""The console's Sink and Control against real PostgreSQL: idempotent COPY ingest, metrics
merging, resume clean-up, commands delivered once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.runs import services
from console.runs.models import (
    Attempt,
    Checkpoint,
    Host,
    MetricRow,
    Run,
    RunEvent,
    TrajectoryRecord,
)
from console.runs.sink import ConsoleControl, ConsoleSink
from tests.console.factories import attempt_create

pytestmark = pytest.mark.django_db


def trajectory(step: int, group: int, reward: float = 1.0, task_id: str = "7") -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Is 4 even?"}],
        "prompt": "Is 4 even?",
        "completion": "\\boxed{even}",
        "observations": [],
        "reward": {"total": reward, "breakdown": {"answer": reward}, "details": {}},
        "finish_reason": "stop",
        "response_tokens": 5,
        "task_id": task_id,
        "provenance": {
            "run": "r",
            "step": step,
            "policy_version": step - 1,
            "domain": "parity",
            "group": group,
            "rubric_version": 3,
            "rubric_digest": "1:abc",
            "sandbox_image": None,
        },
    }


@pytest.fixture
def attempt(people: Any, tmp_path: Path) -> Attempt:
    (tmp_path / "config.json").write_text("{}")
    version = services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )
    run = Run.objects.create(
        team=people.team, created_by=people.owner, name="r", request={}, spec={},
        pins={"domains": [{"slug": "parity"}]}, model_version=version,
    )  # fmt: skip
    host = Host.objects.create(name="h", cpu_slots=1)
    return attempt_create(run, host, state="running")


def test_trajectories_land_once_even_when_a_batch_is_written_twice(attempt):
    sink = ConsoleSink(attempt)
    batch = [trajectory(1, g) for g in range(4)]
    sink.trajectories(batch)
    rows = list(TrajectoryRecord.objects.filter(run=attempt.run).order_by("index"))
    assert [(r.step, r.index) for r in rows] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert rows[0].rubric_version == 3 and rows[0].task_id == "7" and rows[0].reward == 1.0
    assert rows[0].data["completion"] == "\\boxed{even}"
    # A retry of the same batch (same indices) adds nothing.
    again = ConsoleSink(attempt)
    again.trajectories(batch)
    assert TrajectoryRecord.objects.filter(run=attempt.run).count() == 4
    # The run's count (what its page shows) is what was stored, a retry not counted twice.
    assert Run.objects.get(pk=attempt.run_id).trajectories_stored == 4


def test_metrics_of_one_step_merge_and_nan_is_stored_as_null(attempt):
    sink = ConsoleSink(attempt)
    sink.metrics(2, {"reward/mean": 0.5, "actor/kl": float("nan")})
    sink.metrics(2, {"eval/reward/mean": 0.75})
    row = MetricRow.objects.get(run=attempt.run, step=2)
    assert row.values == {"reward/mean": 0.5, "actor/kl": None, "eval/reward/mean": 0.75}
    assert Run.objects.get(pk=attempt.run_id).last_step == 2


def test_a_resumed_attempt_drops_what_the_lost_one_wrote_after_its_checkpoint(attempt):
    sink = ConsoleSink(attempt)
    for step in (1, 2, 3):
        sink.trajectories([trajectory(step, 0), trajectory(step, 1)])
        sink.metrics(step, {"reward/mean": float(step)})
    sink.checkpoint({"step": 2, "path": "/ckpt/step-2", "reason": "periodic", "policy_version": 2})
    assert Checkpoint.objects.get(run=attempt.run).step == 2
    # The next attempt resumes at step 2: step 3 is produced again, by the new policy.
    attempt.state = "lost"
    attempt.save()
    second = attempt_create(attempt.run, attempt.host, number=2)
    ConsoleSink(second).event("run.started", {"step": 2, "spec": None})
    assert sorted(
        TrajectoryRecord.objects.filter(run=attempt.run).values_list("step", flat=True)
    ) == [1, 1, 2, 2]
    assert list(MetricRow.objects.filter(run=attempt.run).values_list("step", flat=True)) == [1, 2]
    assert Run.objects.get(pk=attempt.run_id).trajectories_stored == 4


def test_dropped_trajectories_are_counted_on_the_run(attempt):
    ConsoleSink(attempt).event("sink.trajectories_dropped", {"dropped": 5, "dropped_total": 5})
    assert Run.objects.get(pk=attempt.run_id).dropped_trajectories == 5


def test_commands_are_delivered_once_and_folded_into_one_decision(attempt, people):
    run = attempt.run
    run.state = "running"
    run.save()
    services.run_command(
        actor=people.owner, run=run, kind="overrides", payload={"temperature": 0.7}
    )
    services.run_command(actor=people.owner, run=run, kind="cancel", reason="wrong lr")
    control = ConsoleControl(attempt)
    decision = control.poll(5)
    assert decision.cancel and not decision.preempt
    assert decision.overrides.temperature == 0.7
    assert "wrong lr" in decision.reason
    assert not control.poll(6).cancel  # delivered once
    assert set(run.commands.values_list("delivered_step", flat=True)) == {5}


def test_an_override_naming_a_domain_the_run_lacks_is_refused(attempt, people):
    from django.core.exceptions import ValidationError

    run = attempt.run
    run.state = "running"
    run.save()
    with pytest.raises(ValidationError) as caught:
        services.run_command(
            actor=people.owner, run=run, kind="overrides", payload={"domain_weights": {"x": 1}}
        )
    assert "domain_weights" in caught.value.message_dict
    assert not run.commands.exists()


def test_step_timelines_are_kept_per_step_and_redone_steps_replace_theirs(attempt):
    from console.runs.models import RunEvent
    from console.runs.selectors import run_events_newest

    sink = ConsoleSink(attempt)
    for step in (1, 2, 3):
        sink.event("step.timeline", {"step": step, "step_s": 1.0, "stages": []})
    sink.event("run.preempted", {"step": 3})
    attempt.state = "lost"
    attempt.save()
    second = attempt_create(attempt.run, attempt.host, number=2)
    ConsoleSink(second).event("run.started", {"step": 2, "spec": None})
    timelines = RunEvent.objects.filter(run=attempt.run, kind="step.timeline")
    assert sorted(timelines.values_list("step", flat=True)) == [1, 2]
    # The page's event list shows what happens now and then, not one row per step.
    assert [e.kind for e in run_events_newest(run=attempt.run)] == ["run.started", "run.preempted"]


def test_a_preemption_right_after_a_periodic_save_is_recorded_as_the_preemption(attempt):
    # Same step, same directory: one checkpoint, labelled by the later save (seen in CI when
    # the preempt command arrived on a step that had just been checkpointed).
    sink = ConsoleSink(attempt)
    sink.checkpoint({"step": 16, "path": "/ckpt/step-16", "reason": "periodic"})
    sink.checkpoint({"step": 16, "path": "/ckpt/step-16", "reason": "preempt"})
    saved = Checkpoint.objects.get(run=attempt.run)
    assert (saved.step, saved.reason) == (16, "preempt")
    # Each save is also an event, a marker on the run's charts.
    events = RunEvent.objects.filter(run=attempt.run, kind="checkpoint.saved").order_by("id")
    assert [(e.step, e.data["reason"]) for e in events] == [(16, "periodic"), (16, "preempt")]


def test_a_sample_with_a_nul_character_is_stored_with_the_rest_of_its_batch(attempt):
    # A model can sample U+0000; PostgreSQL's jsonb refuses it, which once failed a whole run.
    odd = trajectory(1, 0)
    odd["completion"] = "\\boxed{even}\x00"
    odd["messages"] = [{"role": "assistant", "content": "even\x00 \\u0000 stays text"}]
    ConsoleSink(attempt).trajectories([odd, trajectory(1, 1)])
    rows = list(TrajectoryRecord.objects.filter(run=attempt.run).order_by("index"))
    assert len(rows) == 2
    assert rows[0].data["completion"] == "\\boxed{even}\ufffd"
    assert rows[0].data["messages"][0]["content"] == "even\ufffd \\u0000 stays text"
