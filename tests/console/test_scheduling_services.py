"""The scheduler service on the real database: a pass places runs through the runs' own
placement path, records waiting reasons once, respects cordoned and draining hosts, files
preemption requests with an impact preview, and admins' approve / reject / expiry do what
they say (victims told to checkpoint and stop, or left alone), audited and drawn as events.
No workers: the Celery messages go out after commit, which these tests never reach."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from console.audit.models import AuditEntry
from console.runs import services as runs_services
from console.runs.launch import LaunchError, default_document
from console.runs.models import Attempt, AttemptState, Host, HostState, Run, RunCommand, RunState
from console.scheduling import policy, services
from console.scheduling.models import (
    DecisionKind,
    PreemptionPurpose,
    PreemptionRequest,
    PreemptionState,
    PreemptionVictim,
    PriorityClass,
    SchedulingDecision,
)
from tests.console import test_runs_views
from tests.console.test_runs_views import Lab

pytestmark = pytest.mark.django_db
lab = test_runs_views.lab  # the fixture: a model, the parity domain, a run


def host(name: str, *, cpu_slots: int = 1, state: str = HostState.READY) -> Host:
    return Host.objects.create(
        name=name, cpu_slots=cpu_slots, state=state, heartbeat_at=timezone.now()
    )


def launch(lab: Lab, name: str, **options: Any) -> Run:
    document = default_document(model="base", domains=[("parity", 1.0)])
    document.update(name=name, max_steps=4)
    return runs_services.run_launch(
        actor=lab.people.owner, team=lab.people.team, document=document, **options
    )


def make_running(run: Run) -> Attempt:
    """What the host agent and the job do when they start (no agent in these tests)."""
    attempt = run.attempts.get(state=AttemptState.SCHEDULED)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.RUNNING, started_at=timezone.now()
    )
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    return attempt


def urgent_class(**changes: Any) -> PriorityClass:
    values = {"name": "urgent", "value": 1000, "can_preempt": True, "preemptible": False}
    values.update(changes)
    return PriorityClass.objects.create(**values)


@pytest.fixture
def full_fleet(lab: Lab) -> tuple[Lab, Run]:
    """One CPU host, busy with a running run of the default class."""
    lab.run.delete()  # the fixture's own run (failed attempt) is not needed here
    host("cpu-a")
    victim = launch(lab, "victim")
    services.schedule_pass()
    make_running(Run.objects.get(pk=victim.pk))
    return lab, Run.objects.get(pk=victim.pk)


def test_a_pass_places_a_queued_run_and_records_why(lab: Lab) -> None:
    lab.run.delete()
    host("cpu-a")
    run = launch(lab, "first")
    result = services.schedule_pass()
    assert result.ran and [a.run_id for a in result.placed] == [run.pk]
    run.refresh_from_db()
    assert run.state == RunState.SCHEDULED
    assert run.attempts.get().host.name == "cpu-a"
    decision = SchedulingDecision.objects.get(run=run)
    assert decision.kind == DecisionKind.PLACED and "cpu-a" in decision.reason


def test_a_waiting_run_gets_its_reason_once_however_many_passes(lab: Lab) -> None:
    lab.run.delete()
    host("cpu-a")
    launch(lab, "first")
    second = launch(lab, "second")
    for _ in range(3):
        services.schedule_pass()
    second.refresh_from_db()
    assert second.state == RunState.QUEUED
    assert second.state_reason.startswith("waiting")
    waits = SchedulingDecision.objects.filter(run=second, kind=DecisionKind.WAITING)
    assert [w.reason for w in waits] == [second.state_reason]


def test_cordoned_and_draining_hosts_get_nothing_and_an_empty_draining_host_is_cordoned(
    lab: Lab,
) -> None:
    lab.run.delete()
    host("cordoned", state=HostState.CORDONED)
    draining = host("draining", state=HostState.DRAINING)
    run = launch(lab, "homeless")
    services.schedule_pass()
    run.refresh_from_db()
    assert run.state == RunState.QUEUED and not run.attempts.exists()
    draining.refresh_from_db()
    assert draining.state == HostState.CORDONED


def test_a_higher_class_on_a_full_fleet_files_one_request_with_an_impact_preview(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    urgent_class()
    requester = launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    services.schedule_pass()  # a second pass does not file another
    request = PreemptionRequest.objects.get()
    assert request.state == PreemptionState.PENDING and not request.auto
    assert request.requester_id == requester.pk
    [impact] = request.victims.all()
    assert impact.run_id == victim.pk
    assert impact.gpu_hours_since_checkpoint >= 0 and impact.steps_lost >= 0
    assert request.expires_at > timezone.now()
    victim.refresh_from_db()
    assert victim.state == RunState.RUNNING  # nothing happens before an admin decides
    assert not RunCommand.objects.filter(run=victim).exists()
    assert victim.events.filter(kind="preemption.requested").exists()


def test_approving_tells_the_victim_to_checkpoint_and_stop_and_is_audited(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    urgent_class()
    requester = launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    admin = lab.people.teammate_admin
    services.preemption_approve(actor=admin, request=request)
    request.refresh_from_db()
    assert request.state == PreemptionState.APPROVED and request.decided_by == admin
    victim.refresh_from_db()
    assert victim.state == RunState.PREEMPTING
    command = RunCommand.objects.get(run=victim)
    assert command.kind == "preempt" and f"request #{request.pk}" in command.reason
    for run in (victim, requester):
        assert run.events.filter(kind="preemption.approved").exists()
    assert AuditEntry.objects.filter(action="preemption.approve", actor=admin).exists()
    with pytest.raises(ValidationError):
        services.preemption_approve(actor=admin, request=request)  # decided once


def test_once_the_victim_stops_the_requester_is_placed_and_the_request_is_done(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    urgent_class()
    requester = launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    services.preemption_approve(actor=lab.people.teammate_admin, request=request)
    attempt = victim.attempts.get(state=AttemptState.RUNNING)
    runs_services.attempt_finished(attempt_id=attempt.pk, status="preempted", step=2)
    Attempt.objects.filter(pk=attempt.pk).update(exit_code=3)  # the agent saw the job exit
    services.schedule_pass()
    request.refresh_from_db()
    requester.refresh_from_db()
    victim.refresh_from_db()
    assert request.state == PreemptionState.DONE
    assert requester.state == RunState.SCHEDULED
    assert victim.state == RunState.QUEUED  # back in the queue, behind the requester


def test_rejecting_needs_a_reason_leaves_the_victim_alone_and_is_not_asked_again_soon(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    urgent_class()
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    admin = lab.people.teammate_admin
    with pytest.raises(ValidationError) as error:
        services.preemption_reject(actor=admin, request=request, reason="  ")
    assert "reason" in error.value.message_dict
    request.refresh_from_db()
    assert request.state == PreemptionState.PENDING  # nothing half-saved
    services.preemption_reject(actor=admin, request=request, reason="the victim is a paper run")
    request.refresh_from_db()
    assert request.state == PreemptionState.REJECTED
    assert request.rejection_reason == "the victim is a paper run"
    services.schedule_pass()
    assert PreemptionRequest.objects.count() == 1
    victim.refresh_from_db()
    assert victim.state == RunState.RUNNING
    assert not RunCommand.objects.filter(run=victim).exists()
    assert AuditEntry.objects.filter(action="preemption.reject").exists()


def test_an_undecided_request_expires(full_fleet: tuple[Lab, Run]) -> None:
    lab, victim = full_fleet
    urgent_class()
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    services.schedule_pass(now=request.expires_at + dt.timedelta(seconds=1))
    request.refresh_from_db()
    assert request.state == PreemptionState.EXPIRED
    assert victim.events.filter(kind="preemption.expired").exists()
    victim.refresh_from_db()
    assert victim.state == RunState.RUNNING


def test_a_class_that_auto_approves_preempts_a_recently_checkpointed_victim_at_once(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    PriorityClass.objects.filter(name="normal").update(
        approval="auto_recent_checkpoint", auto_approve_minutes=30
    )
    attempt = victim.attempts.get(state=AttemptState.RUNNING)
    victim.checkpoints.create(attempt=attempt, step=1, path="/nowhere/ckpt-1", reason="periodic")
    urgent_class()
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    assert request.state == PreemptionState.APPROVED and request.auto
    assert request.decided_by is None
    victim.refresh_from_db()
    assert victim.state == RunState.PREEMPTING


@pytest.mark.parametrize(
    ("started_min_ago", "checkpoint_min_ago", "auto"),
    [
        (1, None, True),  # just started, nothing saved yet: a minute of work at risk
        (1, 120, True),  # just resumed from a checkpoint saved two hours ago
        (120, None, False),  # two hours unsaved: a person decides
        (120, 90, False),  # saved during this attempt, 90 minutes ago
        (120, 5, True),
    ],
)
def test_auto_approval_counts_the_work_a_stop_would_lose_from_the_attempts_start_or_its_checkpoint(
    full_fleet: tuple[Lab, Run],
    started_min_ago: int,
    checkpoint_min_ago: int | None,
    auto: bool,
) -> None:
    lab, victim = full_fleet
    PriorityClass.objects.filter(name="normal").update(
        approval="auto_recent_checkpoint", auto_approve_minutes=30
    )
    now = timezone.now()
    attempt = victim.attempts.get(state=AttemptState.RUNNING)
    Attempt.objects.filter(pk=attempt.pk).update(
        started_at=now - dt.timedelta(minutes=started_min_ago)
    )
    if checkpoint_min_ago is not None:
        saved = victim.checkpoints.create(attempt=attempt, step=1, path="/x/1", reason="periodic")
        type(saved).objects.filter(pk=saved.pk).update(
            created_at=now - dt.timedelta(minutes=checkpoint_min_ago)
        )
    urgent_class()
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass(now=now)
    request = PreemptionRequest.objects.get()
    assert request.auto == auto
    assert (request.state == PreemptionState.APPROVED) == auto


def test_a_run_without_a_class_launches_in_the_default_one_and_an_unknown_class_is_refused(
    lab: Lab,
) -> None:
    run = launch(lab, "plain")
    assert run.priority_class is not None and run.priority_class.name == "normal"
    count = Run.objects.count()
    with pytest.raises(LaunchError) as error:
        launch(lab, "odd", priority_class="nope")
    assert "priority_class" in error.value.errors
    with pytest.raises(LaunchError) as error:
        launch(lab, "odd", priority=5000)
    assert "priority" in error.value.errors
    assert Run.objects.count() == count


def test_a_pass_while_another_holds_the_lock_does_nothing(lab: Lab) -> None:
    from django.db import connections

    lab.run.delete()
    host("cpu-a")
    run = launch(lab, "first")
    # Another connection (another control worker) holds the scheduler's lock.
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [services.SCHEDULER_LOCK_KEY])
        assert services.schedule_pass().ran is False
        run.refresh_from_db()
        assert run.state == RunState.QUEUED
    finally:
        other.close()


def test_a_slot_frees_only_once_the_agent_has_seen_the_preempted_job_exit(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    attempt = victim.attempts.get(state=AttemptState.RUNNING)
    runs_services.attempt_finished(attempt_id=attempt.pk, status="preempted", step=2)
    waiting = launch(lab, "next")
    services.schedule_pass()
    waiting.refresh_from_db()
    # The job reported, but its process is still tearing down: the agent is busy with it.
    assert waiting.state == RunState.QUEUED
    Attempt.objects.filter(pk=attempt.pk).update(exit_code=0)  # what the agent records
    services.schedule_pass()
    placed = {r.name for r in Run.objects.filter(state=RunState.SCHEDULED)}
    assert placed & {"next", "victim"}


def test_a_class_that_preempts_only_after_a_long_wait_does_not_ask_when_the_wait_is_short(
    full_fleet: tuple[Lab, Run],
) -> None:
    lab, victim = full_fleet
    # The victim's remaining time is unknown yet (no steps): estimated at an hour.
    urgent_class(preempt_after_wait_s=2 * 3600)
    requester = launch(lab, "patient", priority_class="urgent")
    services.schedule_pass()
    assert not PreemptionRequest.objects.exists()
    requester.refresh_from_db()
    assert requester.state == RunState.QUEUED and requester.state_reason.startswith("waiting")
    PriorityClass.objects.filter(name="urgent").update(preempt_after_wait_s=600)
    services.schedule_pass()
    assert PreemptionRequest.objects.filter(requester=requester).exists()


def test_a_gathering_gangs_host_is_lent_to_a_batch_run_which_stops_when_the_gang_can_start(
    lab: Lab,
) -> None:
    lab.run.delete()
    host("cpu-a")
    host("cpu-b")
    PriorityClass.objects.create(
        name="batch",
        value=10,
        preemptible=True,
        approval="auto_recent_checkpoint",
        auto_approve_minutes=30,
    )
    blocker = launch(lab, "blocker")
    services.schedule_pass()
    blocking = make_running(blocker)
    # a step of its 4 done in 10 minutes: it ends in about 30 minutes
    Attempt.objects.filter(pk=blocking.pk).update(
        started_at=timezone.now() - dt.timedelta(minutes=10)
    )
    Run.objects.filter(pk=blocker.pk).update(last_step=1)
    gang = launch(lab, "gang", hosts=2)
    filler = launch(lab, "filler", priority_class="batch")  # runs about an hour
    services.schedule_pass()
    gang.refresh_from_db()
    filler.refresh_from_db()
    assert gang.state == RunState.QUEUED
    assert filler.state == RunState.SCHEDULED
    placed = SchedulingDecision.objects.get(run=filler, kind=DecisionKind.PLACED)
    assert placed.lent_to_id == gang.pk  # the loan, as data; the reason says it for people
    assert f"by backfill until run {gang.pk} can start (then stopped for it)" in placed.reason
    lent = make_running(filler)
    filler.checkpoints.create(attempt=lent, step=1, path="/nowhere/ckpt-1", reason="periodic")
    services.schedule_pass()
    assert not PreemptionRequest.objects.exists()  # the blocker still runs: the loan goes on

    runs_services.attempt_finished(attempt_id=blocking.pk, status="completed", step=4)
    Attempt.objects.filter(pk=blocking.pk).update(exit_code=0)
    services.schedule_pass()
    request = PreemptionRequest.objects.get()
    assert request.requester_id == gang.pk and request.auto
    assert request.purpose == PreemptionPurpose.BACKFILL
    assert "stopping backfilled run(s)" in request.reason
    assert [v.run_id for v in request.victims.all()] == [filler.pk]
    filler.refresh_from_db()
    assert filler.state == RunState.PREEMPTING
    command = RunCommand.objects.get(run=filler)
    assert command.kind == "preempt"
    assert command.reason.startswith(f"backfill ended: stopped for gang (request #{request.pk}")

    runs_services.attempt_finished(attempt_id=lent.pk, status="preempted", step=2)
    Attempt.objects.filter(pk=lent.pk).update(exit_code=3)
    services.schedule_pass()
    gang.refresh_from_db()
    filler.refresh_from_db()
    assert gang.state == RunState.SCHEDULED
    assert gang.attempts.get().allocations.count() == 2
    assert filler.state == RunState.QUEUED  # back in the queue, one loan ended
    assert services._loans({}) == (set(), {filler.pk: 1})


def test_backfill_state_is_read_from_fields_not_from_the_reasons_wording(lab: Lab) -> None:
    """A loan whose reason was reworded is still a loan, and a reason that merely contains the
    wording policy uses for loans (typed by a person, say) makes nothing a loan: the lent runs,
    the ended loans and the stop command's wording all follow `lent_to` and `purpose`."""
    # a request's purpose is the policy's plan kind, stored as it is
    assert set(PreemptionPurpose.values) == set(policy.PLAN_KINDS)
    lab.run.delete()
    host("cpu-a")
    host("cpu-b")
    lent, other = launch(lab, "lent"), launch(lab, "other")
    services.schedule_pass()
    live = {run.pk: make_running(run) for run in (lent, other)}
    head, stopped, preempted = launch(lab, "head"), launch(lab, "stopped"), launch(lab, "kept")
    SchedulingDecision.objects.filter(run=lent, kind=DecisionKind.PLACED).update(
        lent_to=head, reason="placed on cpu-a, lent (reworded)"
    )
    SchedulingDecision.objects.filter(run=other, kind=DecisionKind.PLACED).update(
        reason=f"placed on cpu-b{policy.LENT_MARK}{head.pk} can start (then stopped for it)"
    )
    now = timezone.now()
    for victim, purpose, reason in [
        (stopped, PreemptionPurpose.BACKFILL, "loan over (reworded)"),
        (preempted, PreemptionPurpose.PREEMPT, f"needs cpu-a{policy.LOAN_END_MARK}{lent.pk}"),
    ]:
        done = PreemptionRequest.objects.create(
            requester=head,
            state=PreemptionState.DONE,
            purpose=purpose,
            reason=reason,
            expires_at=now,
        )
        PreemptionVictim.objects.create(request=done, run=victim)
    assert services._loans(live) == ({lent.pk}, {stopped.pk: 1})

    for requester, victim, purpose, reason in [
        (head, lent, PreemptionPurpose.BACKFILL, "can start (reworded)"),
        (stopped, other, PreemptionPurpose.PREEMPT, f"needs cpu-b{policy.LOAN_END_MARK}1"),
    ]:
        request = PreemptionRequest.objects.create(
            requester=requester, purpose=purpose, reason=reason, expires_at=now
        )
        PreemptionVictim.objects.create(request=request, run=victim)
        services.preemption_approve(actor=lab.people.owner, request=request)
    assert RunCommand.objects.get(run=lent).reason.startswith("backfill ended: stopped for head")
    assert RunCommand.objects.get(run=other).reason.startswith("preempted for stopped")
