"""Runs end to end on real parts: a run launched through the API is placed by the control
worker, executed by a host agent as a child job that trains the demo model, and everything
it produced is in PostgreSQL; a host agent killed mid-run hands the run to another host,
which resumes from the checkpoint without a gap or a duplicate."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from console.runs.launch import default_document
from console.runs.models import (
    Attempt,
    Checkpoint,
    MetricRow,
    ModelVersion,
    Run,
    RunEvent,
    TrajectoryRecord,
)
from tests.console.runs_cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def launch(api: Any, document: dict[str, Any]) -> dict[str, Any]:
    response = api.post(
        "/api/runs", data=json.dumps({"spec": document}), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    return dict(response.json())


def state_of(run_id: int) -> str:
    return str(Run.objects.get(pk=run_id).state)


def agent_done(run: Run, cluster: Cluster) -> Attempt:
    """The run's last attempt once its agent saw the job exit (it records the exit code after
    the job's last output is in the log)."""
    ended = Attempt.objects.filter(run=run, exit_code__isnull=False).order_by("-number")
    return wait_for(
        lambda: ended.first(), timeout=60, what="the agent to see the job exit", cluster=cluster
    )


def per_step_counts(run_id: int) -> Counter[int]:
    return Counter(TrajectoryRecord.objects.filter(run_id=run_id).values_list("step", flat=True))


def test_a_run_launched_through_the_api_learns_and_everything_lands_in_postgres(
    cluster, parity, api_client_as
):
    cluster.start_agent("gpu-a")
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name="parity-api", max_steps=40)
    document["eval"].update(every_steps=20)
    run = launch(api_client_as("owner"), document)
    assert run["state"] == "queued"
    assert run["pins"]["domains"][0]["rubric_version"] == 1

    wait_for(
        lambda: state_of(run["id"]) in ("completed", "failed", "cancelled"),
        timeout=900,
        what="the run to end",
        cluster=cluster,
    )
    final = Run.objects.get(pk=run["id"])
    assert final.state == "completed", f"{final.state_reason}\n{final.error}\n{cluster.logs()}"

    # Every trajectory the loop produced: 40 steps x 16 prompts x 8 samples, each step whole.
    counts = per_step_counts(final.pk)
    assert sorted(counts) == list(range(1, 41))
    assert set(counts.values()) == {16 * 8}
    sample = TrajectoryRecord.objects.filter(run=final).first()
    assert sample is not None and sample.domain == "parity"
    assert sample.task_id.isdigit()  # the registry task's id
    assert sample.rubric_version == 1  # the registry's version number it was scored with
    # Per-step metrics, held-out evaluations at 0, 20 and 40, and reward that rose.
    metrics = {row.step: row.values for row in MetricRow.objects.filter(run=final)}
    assert set(range(1, 41)) <= set(metrics)
    held_out = {
        step: values["eval/reward/parity/mean"]
        for step, values in metrics.items()
        if "eval/reward/parity/mean" in values
    }
    assert sorted(held_out) == [0, 20, 40]
    assert held_out[40] > held_out[0] + 0.2, held_out
    newest = Checkpoint.objects.filter(run=final).order_by("-step").first()
    assert newest is not None
    # Promoted, the checkpoint is a model a run can start from: its Hugging Face weights.
    response = api_client_as("owner").post(
        f"/api/checkpoints/{newest.pk}/promote",
        data=json.dumps({"slug": "parity-tuned"}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    weights = Path(ModelVersion.objects.get(model__slug="parity-tuned").path)
    assert (weights / "config.json").is_file() and list(weights.glob("*.safetensors"))
    kinds = set(RunEvent.objects.filter(run=final).values_list("kind", flat=True))
    assert {"run.queued", "attempt.scheduled", "run.started", "run.completed"} <= kinds
    attempt = agent_done(final, cluster)
    assert attempt.state == "completed" and attempt.exit_code == 0
    assert "attempt 1 of run parity-api" in attempt.log_text


def test_a_killed_host_agent_hands_the_run_to_another_host_without_gap_or_duplicate(
    cluster, parity, api_client_as
):
    cluster.start_agent("host-a")
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name="parity-failover", max_steps=12)
    document["batch"].update(prompts_per_step=4, group_size=4)
    document["checkpoint"].update(every_steps=3)
    document["eval"].update(at_start=False, at_end=False)
    # Held after its fourth step until host A's agent is killed (see runs_hold.py): on an idle
    # machine the 12 steps can be over before the test gets to the kill.
    cluster.hold("parity-failover", after_step=4)
    run = launch(api_client_as("owner"), document)

    # Once a checkpoint is recorded (and a step or more beyond it is done) on host A ...
    cluster.wait_held("parity-failover")
    wait_for(
        lambda: (
            Checkpoint.objects.filter(run_id=run["id"], step__gte=3).exists()
            and Run.objects.get(pk=run["id"]).last_step >= 4
        ),
        timeout=600,
        what="a checkpoint on the first host",
        cluster=cluster,
    )
    first = Attempt.objects.get(run_id=run["id"], number=1)
    assert first.host.name == cluster.host_name("host-a")
    cluster.start_agent("host-b")
    cluster.kill("host-a")  # its job dies with it (the kernel's parent-death signal)
    cluster.release("parity-failover")

    wait_for(
        lambda: state_of(run["id"]) in ("completed", "failed", "cancelled"),
        timeout=900,
        what="the run to end on the second host",
        cluster=cluster,
    )
    final = Run.objects.get(pk=run["id"])
    assert final.state == "completed", f"{final.state_reason}\n{final.error}\n{cluster.logs()}"
    attempts = list(Attempt.objects.filter(run=final).order_by("number"))
    assert [a.state for a in attempts] == ["lost", "completed"]
    assert attempts[1].host.name == cluster.host_name("host-b")
    assert attempts[1].start_step >= 3
    # No gap and no duplicate: every step 1..12 holds exactly its 4 x 4 samples.
    counts = per_step_counts(final.pk)
    assert sorted(counts) == list(range(1, 13))
    assert set(counts.values()) == {16}
    assert final.dropped_trajectories == 0


def test_operators_steer_a_running_run_preempt_it_and_cancel_it(cluster, parity, api_client_as):
    cluster.start_agent("host-c")
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name="parity-steered", max_steps=500)
    document["batch"].update(prompts_per_step=2, group_size=2)
    document["eval"].update(at_start=False, at_end=False)
    api = api_client_as("owner")
    run = launch(api, document)
    wait_for(
        lambda: Run.objects.get(pk=run["id"]).last_step >= 2,
        timeout=300, what="the run to be training", cluster=cluster,
    )  # fmt: skip

    def post(path: str, body: dict[str, Any]) -> Any:
        url = f"/api/runs/{run['id']}/{path}"
        return api.post(url, data=json.dumps(body), content_type="application/json")

    def kinds() -> list[str]:
        return list(
            RunEvent.objects.filter(run_id=run["id"]).order_by("id").values_list("kind", flat=True)
        )

    assert post("overrides", {"temperature": 0.7, "reason": "less noise"}).status_code == 200
    wait_for(lambda: "sampling.temperature_changed" in kinds(), timeout=120, what="the override")
    # Preempt: a checkpoint, the attempt ends, the run queues and resumes from that step.
    assert post("preempt", {"reason": "make room"}).status_code == 200
    wait_for(
        lambda: Attempt.objects.filter(run_id=run["id"], number=2, state="running").exists(),
        timeout=300, what="the preempted run to resume", cluster=cluster,
    )  # fmt: skip
    first, second = Attempt.objects.filter(run_id=run["id"]).order_by("number")
    assert first.state == "preempted"
    preempt_checkpoint = Checkpoint.objects.get(run_id=run["id"], reason="preempt")
    assert second.start_step == preempt_checkpoint.step > 0
    assert second.resume_from == preempt_checkpoint.path
    # Cancel: the job stops at its next step; the run ends cancelled.
    assert post("cancel", {"reason": "enough"}).status_code == 200
    # The resumed job reads its commands between steps, after loading the checkpoint: as long
    # as a resume, on a loaded machine (120 s was too short once with the whole suite).
    wait_for(
        lambda: state_of(run["id"]) == "cancelled",
        timeout=300, what="the cancel", cluster=cluster,
    )  # fmt: skip
    second.refresh_from_db()
    assert second.state == "cancelled"
    assert {"control.delivered", "run.preempted", "run.cancelled"} <= set(kinds())
    # The second attempt started where the preemption checkpointed.
    resumed = RunEvent.objects.filter(run_id=run["id"], kind="run.started").order_by("-id")[0]
    assert resumed.data["step"] == preempt_checkpoint.step


def test_a_job_that_fails_puts_its_traceback_on_the_run(
    cluster, parity, api_client_as, people, tmp_path
):
    from console.runs import services

    # A model whose directory has a config but no weights: the job fails while loading it.
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    services.model_register(
        actor=people.owner, team=people.team, slug="broken", title="Broken", path=str(broken)
    )
    cluster.start_agent("host-d")
    document = default_document(model="broken", domains=[("parity", 1.0)])
    document.update(name="parity-broken", max_steps=2)
    run = launch(api_client_as("owner"), document)
    wait_for(
        lambda: Run.objects.get(pk=run["id"]).is_terminal,
        timeout=300, what="the run to end", cluster=cluster,
    )  # fmt: skip
    final = Run.objects.get(pk=run["id"])
    assert final.state == "failed"
    assert "Traceback (most recent call last)" in final.error
    attempt = agent_done(final, cluster)
    assert attempt.state == "failed" and attempt.exit_code == 1
    logs = api_client_as("owner").get(f"/api/runs/{run['id']}/logs").json()
    assert "Traceback" in logs[0]["text"]


def test_a_killed_job_resumes_from_its_checkpoint_on_the_same_host(cluster, parity, api_client_as):
    import os
    import signal

    cluster.start_agent("host-e")
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name="parity-oom", max_steps=10)
    document["batch"].update(prompts_per_step=4, group_size=4)
    document["checkpoint"].update(every_steps=3)
    document["eval"].update(at_start=False, at_end=False)
    # Held after its fourth step until its job is killed (as above: 10 steps can be over first).
    cluster.hold("parity-oom", after_step=4)
    run = launch(api_client_as("owner"), document)
    cluster.wait_held("parity-oom")
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run["id"], step__gte=3).exists()
        and Run.objects.get(pk=run["id"]).last_step >= 4,
        timeout=600, what="a checkpoint", cluster=cluster,
    )  # fmt: skip
    first = Attempt.objects.get(run_id=run["id"], number=1)
    os.kill(first.pid, signal.SIGKILL)  # what the OOM killer does to the job, not the agent
    cluster.release("parity-oom")

    wait_for(
        lambda: state_of(run["id"]) in ("completed", "failed", "cancelled"),
        timeout=900, what="the run to end", cluster=cluster,
    )  # fmt: skip
    final = Run.objects.get(pk=run["id"])
    assert final.state == "completed", f"{final.state_reason}\n{final.error}\n{cluster.logs()}"
    attempts = list(Attempt.objects.filter(run=final).order_by("number"))
    assert [(a.state, a.outcome) for a in attempts] == [
        ("lost", "died"),
        ("completed", "completed"),
    ]
    assert attempts[0].exit_code == -signal.SIGKILL
    assert "signal 9" in attempts[0].error
    counts = per_step_counts(final.pk)
    assert sorted(counts) == list(range(1, 11))
    assert set(counts.values()) == {16}
    # The count the run page shows is the rows kept: the lost attempt's redone steps left it.
    assert final.trajectories_stored == 10 * 16
    # Each attempt saved in its own directory. Once attempt 2's checkpoints were recorded, what
    # they superseded went, attempt 1's directory with its resume point: keep_last (2) remain.
    root = Path(final.checkpoint_dir)
    assert Path(attempts[1].resume_from).parent == root / "attempt-1"
    on_disk = sorted(str(path.relative_to(root)) for path in root.iterdir())
    assert on_disk == ["attempt-2"], on_disk
    saved = sorted(path.name for path in (root / "attempt-2").glob("step_*"))
    assert saved == ["step_00000009", "step_00000010"], saved
