"""The scheduler on real parts: a control worker (the scheduler's passes) and a host agent
that runs real training jobs, against the test database. A high-class run arriving on a full
host files a preemption request; rejecting it leaves the victim running untouched; approving
it checkpoints the victim through its Control, starts the requester, and the victim later
resumes from that checkpoint and finishes with every step's metrics and trajectories exactly
once; a class whose policy auto-approves preempts without a person."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from console.runs.launch import default_document
from console.runs.models import (
    Attempt,
    Checkpoint,
    MetricRow,
    Run,
    RunCommand,
    RunEvent,
    TrajectoryRecord,
)
from console.scheduling.models import PreemptionRequest, PriorityClass
from tests.console.runs_cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster_env() -> dict[str, str]:
    # A rejected request may be filed again at once (the test then approves the second one).
    return {"PREEMPTION_REFILE_AFTER_S": "0"}


@pytest.fixture
def parity(parity: Any) -> Any:
    """The shared fixture's model and domain, and the two priority classes these tests use."""
    PriorityClass.objects.get_or_create(
        name="normal", defaults={"value": 100, "preemptible": True, "approval": "ask"}
    )
    PriorityClass.objects.create(
        name="urgent", value=1000, can_preempt=True, preemptible=False, grace_s=60
    )
    return parity


def launch(api: Any, name: str, max_steps: int, **options: Any) -> int:
    document = default_document(model="demo", domains=[("parity", 1.0)])
    document.update(name=name, max_steps=max_steps)
    document["batch"].update(prompts_per_step=2, group_size=2)
    document["checkpoint"].update(every_steps=2)
    document["eval"].update(at_start=False, at_end=False)
    response = api.post(
        "/api/runs",
        data=json.dumps({"spec": document, **options}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def run_of(run_id: int) -> Run:
    return Run.objects.get(pk=run_id)


def wait_until_ended(run_id: int, cluster: Cluster) -> Run:
    wait_for(
        lambda: run_of(run_id).state in ("completed", "failed", "cancelled"),
        timeout=900, what=f"run {run_id} to end", cluster=cluster,
    )  # fmt: skip
    run = run_of(run_id)
    assert run.state == "completed", f"{run.state_reason}\n{run.error}\n{cluster.logs()}"
    return run


def pending_request(requester: int, cluster: Cluster) -> PreemptionRequest:
    return wait_for(
        lambda: PreemptionRequest.objects.filter(requester_id=requester, state="pending").first(),
        timeout=120, what="a preemption request", cluster=cluster,
    )  # fmt: skip


def started_attempts(run: Run) -> list[Attempt]:
    """The run's attempts that a host agent started. (An attempt placed on a host whose agent
    is still seeing the previous job out can be re-queued by the sweep before the agent takes
    it; the run is placed again. Not what these tests are about.)"""
    return list(Attempt.objects.filter(run=run, started_at__isnull=False).order_by("number"))


def assert_every_step_once(run_id: int, max_steps: int) -> None:
    counts = Counter(TrajectoryRecord.objects.filter(run_id=run_id).values_list("step", flat=True))
    assert sorted(counts) == list(range(1, max_steps + 1))
    assert set(counts.values()) == {2 * 2}
    steps = sorted(MetricRow.objects.filter(run_id=run_id).values_list("step", flat=True))
    assert [s for s in steps if s >= 1] == list(range(1, max_steps + 1))


def test_rejecting_leaves_the_victim_alone_and_approving_preempts_and_resumes_it(
    cluster, parity, api_client_as
):
    cluster.start_agent("host-a")
    owner, admin = api_client_as("owner"), api_client_as("teammate_admin")
    # The victim waits after its third step (a checkpoint behind it) until the preemption is
    # approved (see runs_hold.py). A step takes ~0.2 s on an idle machine: a victim left to run
    # could end before a request was filed, rejected, filed again and approved, and then there
    # would be nothing to preempt.
    cluster.hold("victim", after_step=3)
    victim = launch(owner, "victim", max_steps=24)
    cluster.wait_held("victim")
    urgent = launch(owner, "urgent", max_steps=3, priority_class="urgent")

    # The first request: an owner may not decide it; the admin rejects it, with a reason.
    first = pending_request(urgent, cluster)
    preview = admin.get(f"/api/scheduling/preemptions/{first.pk}").json()
    assert [v["run_id"] for v in preview["victims"]] == [victim]
    url = f"/api/scheduling/preemptions/{first.pk}"
    assert owner.post(f"{url}/approve").status_code == 403
    rejected = admin.post(
        f"{url}/reject", data=json.dumps({"reason": "paper deadline"}),
        content_type="application/json",
    )  # fmt: skip
    assert rejected.status_code == 200, rejected.content
    assert not RunCommand.objects.filter(run_id=victim).exists()
    assert run_of(victim).state == "running"
    assert run_of(urgent).state == "queued"

    # Filed again (PREEMPTION_REFILE_AFTER_S is 0 here); approved this time.
    second = pending_request(urgent, cluster)
    approved = admin.post(f"/api/scheduling/preemptions/{second.pk}/approve")
    assert approved.status_code == 200, approved.content
    # The approval stored the victim's preempt command: released, its Control reads it at once.
    cluster.release("victim")

    urgent_run = wait_until_ended(urgent, cluster)
    victim_run = wait_until_ended(victim, cluster)
    first_attempt, second_attempt = started_attempts(victim_run)
    assert first_attempt.state == "preempted"
    checkpoint = Checkpoint.objects.get(run=victim_run, reason="preempt")
    assert second_attempt.start_step == checkpoint.step > 0
    assert second_attempt.resume_from == checkpoint.path
    # The requester started only after the victim's first attempt had stopped.
    [urgent_attempt] = started_attempts(urgent_run)
    assert urgent_attempt.scheduled_at >= first_attempt.ended_at
    assert second_attempt.scheduled_at >= urgent_attempt.scheduled_at
    assert_every_step_once(victim, 24)
    kinds = set(RunEvent.objects.filter(run=victim_run).values_list("kind", flat=True))
    assert {"preemption.rejected", "preemption.approved", "run.preempted"} <= kinds
    second.refresh_from_db()
    assert second.state == "done"


def test_a_class_that_auto_approves_preempts_without_a_person(cluster, parity, api_client_as):
    PriorityClass.objects.filter(name="normal").update(
        approval="auto_recent_checkpoint", auto_approve_minutes=60
    )
    cluster.start_agent("host-b")
    owner = api_client_as("owner")
    # Held after its third step until the class's policy has approved (as above).
    cluster.hold("victim-auto", after_step=3)
    victim = launch(owner, "victim-auto", max_steps=16)
    cluster.wait_held("victim-auto")
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=victim).exists(),
        timeout=600, what="the victim's first checkpoint", cluster=cluster,
    )  # fmt: skip
    urgent = launch(owner, "urgent-auto", max_steps=3, priority_class="urgent")
    wait_for(
        lambda: RunCommand.objects.filter(run_id=victim, kind="preempt").exists(),
        timeout=120, what="the policy's approval to preempt the victim", cluster=cluster,
    )  # fmt: skip
    cluster.release("victim-auto")
    wait_until_ended(urgent, cluster)
    request = PreemptionRequest.objects.get(requester_id=urgent)
    assert request.auto and request.decided_by is None
    victim_run = wait_until_ended(victim, cluster)
    assert [a.state for a in started_attempts(victim_run)] == ["preempted", "completed"]
    assert_every_step_once(victim, 16)
