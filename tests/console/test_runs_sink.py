"""The console's Sink and Control against real PostgreSQL: idempotent COPY ingest, metrics
merging, resume clean-up, commands delivered once."""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction

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
from console.runs.sink import ConsoleControl, ConsoleSink, checkpoints_prune
from tests.console.factories import attempt_create
from training.checkpoint import hf_copy

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


# --- an old attempt's job after the run moved on ------------------------------------------------


def resumed(attempt: Attempt, at_step: int) -> Attempt:
    """`attempt` lost (what the sweep does when its host goes silent, while its job may keep
    going), and the run resumed on attempt 2 from the checkpoint of `at_step`."""
    Attempt.objects.filter(pk=attempt.pk).update(state="lost", outcome="lost")
    second = attempt_create(attempt.run, attempt.host, number=2, state="running")
    ConsoleSink(second).event("run.started", {"step": at_step, "spec": None})
    return second


def test_a_stale_attempts_writes_are_refused_whole_and_the_current_ones_land(attempt):
    old = ConsoleSink(attempt)
    for step in (1, 2, 3):
        old.trajectories([trajectory(step, 0), trajectory(step, 1)])
        old.metrics(step, {"reward/mean": float(step)})
    old.checkpoint({"step": 2, "path": "/ckpt/step-2", "reason": "periodic", "policy_version": 2})
    second = resumed(attempt, at_step=2)
    new = ConsoleSink(second)
    before = (
        list(TrajectoryRecord.objects.values_list("pk", flat=True)),
        list(MetricRow.objects.values_list("step", "values")),
        list(RunEvent.objects.values_list("pk", flat=True)),
        list(Checkpoint.objects.values_list("pk", flat=True)),
        Run.objects.values_list("trajectories_stored", "last_step").get(pk=attempt.run_id),
    )
    # The old job goes on with steps 3 and 4, and a restart of its own would wipe the run.
    writes = [
        lambda: old.trajectories([trajectory(3, 0), trajectory(4, 0)]),
        lambda: old.metrics(3, {"reward/mean": 30.0}),
        lambda: old.event("step.timeline", {"step": 4, "step_s": 1.0, "stages": []}),
        lambda: old.checkpoint({"step": 4, "path": "/ckpt/step-4"}),
        lambda: old.event("run.started", {"step": 0, "spec": None}),
        lambda: old.event("sink.trajectories_dropped", {"dropped": 3}),
    ]
    for write in writes:
        with pytest.raises(services.AttemptNotCurrent, match="attempt 2 is"):
            write()
    refusal = RunEvent.objects.get(kind="sink.refused")  # once, for the first refused write
    after = (
        list(TrajectoryRecord.objects.values_list("pk", flat=True)),
        list(MetricRow.objects.values_list("step", "values")),
        list(RunEvent.objects.exclude(pk=refusal.pk).values_list("pk", flat=True)),
        list(Checkpoint.objects.values_list("pk", flat=True)),
        Run.objects.values_list("trajectories_stored", "last_step").get(pk=attempt.run_id),
    )
    assert after == before, "a refused write left something behind"
    assert refusal.attempt_id == attempt.pk and refusal.step is None
    assert refusal.data["refused"] == "trajectories" and refusal.data["at_step"] == 4
    assert "attempt 1 of run" in refusal.data["reason"] and "is lost" in refusal.data["reason"]
    assert Run.objects.get(pk=attempt.run_id).dropped_trajectories == 0
    assert old.refused == refusal.data["reason"]
    # The current attempt's writes land, and the run's metrics run on without a gap.
    for step in (3, 4):
        new.trajectories([trajectory(step, 0), trajectory(step, 1)])
        new.metrics(step, {"reward/mean": float(step) + 0.5})
    new.event("step.timeline", {"step": 4, "step_s": 1.0, "stages": []})
    rows = dict(MetricRow.objects.filter(run=attempt.run).values_list("step", "values"))
    assert rows == {
        1: {"reward/mean": 1.0},
        2: {"reward/mean": 2.0},
        3: {"reward/mean": 3.5},
        4: {"reward/mean": 4.5},
    }
    stored = TrajectoryRecord.objects.filter(run=attempt.run)
    assert sorted(stored.values_list("step", "attempt__number")) == [
        (1, 1), (1, 1), (2, 1), (2, 1), (3, 2), (3, 2), (4, 2), (4, 2),
    ]  # fmt: skip
    assert Run.objects.values_list("trajectories_stored", "last_step").get(pk=attempt.run_id) == (
        8,
        4,
    )
    assert not new.refused


def test_a_stale_attempts_control_stops_its_job_and_leaves_the_commands_to_the_current_one(
    attempt, people
):
    second = resumed(attempt, at_step=0)
    run = Run.objects.get(pk=attempt.run_id)
    run.state = "running"
    run.save()
    services.run_command(
        actor=people.owner, run=run, kind="overrides", payload={"temperature": 0.7}
    )
    stale = ConsoleControl(attempt)
    decision = stale.poll(5)
    # Cancelled, not preempted: no checkpoint of its own over the current attempt's.
    assert decision.cancel and not decision.preempt and decision.overrides.is_empty()
    assert "attempt 1 of run" in decision.reason and "attempt 2 is" in decision.reason
    assert stale.refused == decision.reason
    assert run.commands.get().delivered_at is None
    current = ConsoleControl(second).poll(1)
    assert current.overrides.temperature == 0.7 and not current.cancel
    assert run.commands.get().delivered_to_id == second.pk


@pytest.mark.django_db(transaction=True)
def test_ending_an_attempt_waits_for_its_write_in_flight_and_the_next_write_is_refused(attempt):
    # The write's transaction holds the attempt current: the attempt's end (here the job's
    # report; the sweep locks it the same way) waits for the write's commit, with no deadlock
    # between the two, and the write after it is refused.
    sink = ConsoleSink(attempt)
    in_flight, may_commit = threading.Event(), threading.Event()
    ended: list[bool] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                sink.trajectories([trajectory(1, 0)])
                sink.metrics(1, {"reward/mean": 1.0})
                in_flight.set()
                assert may_commit.wait(10)
        finally:
            connections.close_all()

    def end() -> None:
        try:
            ended.append(
                services.attempt_finished(attempt_id=attempt.pk, status="preempted", step=1)
            )
        finally:
            connections.close_all()

    def waiting_for_a_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            return cursor.fetchone()[0] > 0

    threads = [threading.Thread(target=writer), threading.Thread(target=end)]
    threads[0].start()
    try:
        assert in_flight.wait(10)
        threads[1].start()
        deadline = time.monotonic() + 30
        while not waiting_for_a_lock():
            assert time.monotonic() < deadline, "the attempt's end did not wait for the write"
            time.sleep(0.02)
        assert Attempt.objects.get(pk=attempt.pk).state == "running"
    finally:
        may_commit.set()
        for thread in threads:
            if thread.is_alive() or thread.ident:
                thread.join(30)
    assert ended == [True]
    assert Attempt.objects.get(pk=attempt.pk).state == "preempted"
    assert list(MetricRow.objects.filter(run=attempt.run).values_list("step", flat=True)) == [1]
    assert TrajectoryRecord.objects.filter(run=attempt.run).count() == 1
    with pytest.raises(services.AttemptNotCurrent, match="is preempted"):
        sink.metrics(2, {"reward/mean": 2.0})
    assert list(MetricRow.objects.filter(run=attempt.run).values_list("step", flat=True)) == [1]


class LostAfterStep2:
    """The job's Control wrapper (``RUNS_CONTROL_WRAPPER``) for the next test: after step 2
    (asked with the steps done), once that step is stored, what the sweep does when the job's
    host goes silent while the job goes on: attempt 1 is lost and the run resumes on attempt 2,
    elsewhere."""

    def __init__(self, attempt: Attempt, control: Any) -> None:
        self.attempt, self.control = attempt, control

    def poll(self, step: int) -> Any:
        if step == 2 and Attempt.objects.filter(pk=self.attempt.pk, state="running").exists():
            stored = RunEvent.objects.filter(run_id=self.attempt.run_id, kind="step.timeline")
            deadline = time.monotonic() + 60
            while not stored.filter(step=2).exists():  # step 2's last record, delivered
                assert time.monotonic() < deadline
                time.sleep(0.05)
            Attempt.objects.filter(pk=self.attempt.pk).update(state="lost", outcome="lost")
            elsewhere = Host.objects.create(name="elsewhere", cpu_slots=1)
            attempt_create(self.attempt.run, elsewhere, number=2, state="running")
        return self.control.poll(step)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_whose_attempt_was_lost_stops_before_its_next_step_without_reporting(
    attempt, tmp_path, settings
):
    # The real job (`manage.py run_attempt`, the training loop on a tiny model) with the
    # console's Sink and Control: once its attempt is no longer current, its Control cancels it
    # at the next step, its last writes are refused, and it ends cleanly (no failure recorded,
    # nothing over the current attempt's record).
    from django.core.management import call_command

    from tests.training.conftest import build_tiny_model, tiny_spec

    spec = tiny_spec(build_tiny_model(tmp_path / "model"), tmp_path, max_steps=3)
    Run.objects.filter(pk=attempt.run_id).update(spec=spec, state="scheduled", max_steps=3)
    Attempt.objects.filter(pk=attempt.pk).update(state="starting")
    settings.RUNS_CONTROL_WRAPPER = f"{__name__}.LostAfterStep2"
    out = io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        call_command("run_attempt", attempt.pk, stdout=out)  # returns: no SystemExit
    finally:
        signal.signal(signal.SIGTERM, handler)
        with connection.cursor() as cursor:  # the job's sink thread's connection, left open
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    first, second = Attempt.objects.filter(run_id=attempt.run_id).order_by("number")
    assert (first.state, first.outcome, first.error) == ("lost", "lost", "")
    assert second.state == "running"
    assert "attempt 1: stopped at step 2: attempt 1 of run" in out.getvalue()
    assert "(attempt 2 is)" in out.getvalue()
    steps = MetricRow.objects.filter(run_id=attempt.run_id).values_list("step", flat=True)
    assert sorted(steps) == [1, 2]
    kinds = list(RunEvent.objects.filter(run_id=attempt.run_id).values_list("kind", flat=True))
    assert "run.cancelled" not in kinds and not any(k.startswith("attempt.") for k in kinds)
    refusal = RunEvent.objects.get(run_id=attempt.run_id, kind="sink.refused")
    assert refusal.data["refused"] == "run.cancelled" and refusal.attempt_id == first.pk
    assert Run.objects.get(pk=attempt.run_id).state == "running"


# --- checkpoints: each attempt's own directory, pruned by what the database accepted -----------


def test_a_stale_attempts_saves_touch_no_checkpoint_of_the_current_one_and_the_run_resumes_on_its_timeline(  # noqa: E501
    attempt, tmp_path
):
    # Real saves and loads (`training.checkpoint`, a tiny model) with the spec each attempt's
    # job runs and the console's sink. Attempt 1's job goes on after the run moved on to
    # attempt 2: its records are refused, and its saves must neither prune attempt 2's resume
    # point nor replace attempt 2's checkpoint of the same step.
    from tests.training.conftest import build_tiny_model, tiny_spec
    from training.checkpoint import load_checkpoint, save_checkpoint
    from training.spec import RunSpec
    from training.trainer import Trainer

    model = build_tiny_model(tmp_path / "model")
    spec = tiny_spec(model, tmp_path)
    # As the launch pins it (`services.training_spec`): the run's checkpoint directory.
    root = tmp_path / "run" / "checkpoints"
    spec["checkpoint"] = {"dir": str(root), "resume": "none", "every_steps": 2, "keep_last": 1}
    Run.objects.filter(pk=attempt.run_id).update(spec=spec, directory=str(tmp_path / "run"))
    trainer = Trainer(model, {"zero_optimization": {"stage": 1}}, 1e-3)

    def save(job: Attempt, step: int) -> Path:
        """A save of the job's loop (`training.loop._Run.save`) with the spec the job runs."""
        job = Attempt.objects.select_related("run").get(pk=job.pk)
        policy = RunSpec.from_dict(services.attempt_training_spec(job)).checkpoint
        state = {"step": step, "saved_by": job.number}
        keep = policy.keep_last if policy.prune else None
        path = save_checkpoint(trainer, str(policy.dir), step, state, keep)
        ConsoleSink(job).checkpoint({"step": step, "path": str(path), "reason": "periodic"})
        return path

    def resume_point() -> dict[str, Any]:
        """What the run's next attempt resumes from (the scheduler's choice), as its job loads
        it."""
        checkpoint = services.last_checkpoint(Run.objects.get(pk=attempt.run_id))
        assert checkpoint is not None
        state = load_checkpoint(trainer, checkpoint.path)
        return {"step": state["step"], "saved_by": state["saved_by"]}

    first = attempt
    save(first, 2)
    # Attempt 1's host goes silent: lost, and the run resumes on attempt 2 from step 2.
    Attempt.objects.filter(pk=first.pk).update(state="lost", outcome="lost")
    checkpoint = services.last_checkpoint(first.run)
    second = attempt_create(
        first.run, first.host, number=2, state="running", resume_from=checkpoint.path,
        start_step=checkpoint.step,
    )  # fmt: skip
    # The old job saves its next periodic checkpoint before its next poll stops it (with the
    # library pruning to keep_last=1 in a shared directory, this removed step 2).
    with pytest.raises(services.AttemptNotCurrent):
        save(first, 4)
    assert resume_point() == {"step": 2, "saved_by": 1}
    save(second, 4)
    save(second, 6)
    # A job that hung (its host frozen) and woke up saves the step attempt 2 saved last.
    with pytest.raises(services.AttemptNotCurrent):
        save(first, 6)
    assert resume_point() == {"step": 6, "saved_by": 2}
    # What attempt 2's next accepted checkpoint supersedes goes, the old job's saves included.
    save(second, 8)
    saved = sorted(str(p.relative_to(root)) for p in root.glob("*/step_*"))
    assert saved == ["attempt-2/step_00000008"]
    assert resume_point() == {"step": 8, "saved_by": 2}


def test_pruning_keeps_the_newest_recorded_and_promoted_checkpoints_and_never_a_newer_attempts(
    attempt, tmp_path, people
):
    run = attempt.run
    Run.objects.filter(pk=run.pk).update(
        directory=str(tmp_path / "run"), spec={"checkpoint": {"keep_last": 2}}
    )
    run.refresh_from_db()
    root = Path(run.checkpoint_dir)
    layout = [
        "step_00000001",  # the shared directory of before attempts had their own
        "latest",
        "attempt-1/step_00000002",  # recorded, then promoted to a model version
        "attempt-1/step_00000004",  # recorded, superseded
        "attempt-1/step_00000006",  # saved by attempt 1's job after the run moved on
        "attempt-1/step_00000008.partial",
        "attempt-2/step_00000006",  # recorded, superseded by two newer ones
        "attempt-2/step_00000008",
        "attempt-2/step_00000010",
        "attempt-2/step_00000012.partial",  # being saved: ahead of its record
        "attempt-3/step_00000010",  # a newer attempt's: not this one's to judge
    ]
    for name in layout:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if name == "latest":
            (root / name).write_text("step_00000001")
        else:
            (root / name).mkdir()
    Attempt.objects.filter(pk=attempt.pk).update(state="lost")
    second = attempt_create(run, attempt.host, number=2, state="running")
    for job, step in [(attempt, 1), (attempt, 2), (attempt, 4), (second, 6), (second, 8)]:
        name = f"attempt-{job.number}/step_{step:08d}" if step > 1 else f"step_{step:08d}"
        Checkpoint.objects.create(
            run=run, attempt=job, step=step, path=str(root / name), reason="periodic"
        )
    promoted = Checkpoint.objects.get(run=run, step=2)
    promotion = services._model_version_create(
        actor=people.owner,
        model=run.model_version.model,
        path=str(hf_copy(promoted.path)),
        source=promoted,
    )
    # A record of attempt 1's, now refused, prunes nothing.
    with pytest.raises(services.AttemptNotCurrent):
        ConsoleSink(attempt).checkpoint({"step": 6, "path": str(root / "attempt-1/step_00000006")})
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == sorted(
        {*layout, "attempt-1", "attempt-2", "attempt-3"}
    )
    ConsoleSink(second).checkpoint(
        {"step": 10, "path": str(root / "attempt-2/step_00000010"), "reason": "periodic"}
    )
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == [
        "attempt-1",
        "attempt-1/step_00000002",
        "attempt-2",
        "attempt-2/step_00000008",
        "attempt-2/step_00000010",
        "attempt-2/step_00000012.partial",
        "attempt-3",
        "attempt-3/step_00000010",
    ]
    # Once nothing in an old attempt's directory is kept, the directory goes too.
    promotion.delete()
    assert checkpoints_prune(Attempt.objects.get(pk=second.pk)) == [
        root / "attempt-1/step_00000002"
    ]
    assert not (root / "attempt-1").exists()
