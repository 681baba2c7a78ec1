"""The scheduler's API (/api/scheduling/): the role matrix for every endpoint (owner, teammates
of each role, outsider, anonymous), what each role sees, and bad input answered in the one
error shape with nothing saved."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from console.runs.models import Host, HostState, Run, RunCommand
from console.scheduling import services
from console.scheduling.models import PreemptionRequest, PreemptionState, PriorityClass, TeamQuota
from tests.console import test_runs_views
from tests.console.factories import ADMINS, ANONYMOUS, EVERYONE, OUTSIDER, TEAMMATE_ADMIN
from tests.console.test_runs_views import Lab
from tests.console.test_scheduling_services import full_fleet, launch  # noqa: F401

pytestmark = pytest.mark.django_db
lab = test_runs_views.lab  # the fixture: a model, the parity domain, a run
API = "/api/scheduling"


def send(client: Any, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body) if body is not None else None
    return getattr(client, method)(f"{API}{path}", data=data, content_type="application/json")


def admin_only(response: Any, who: str, ok: int = 200) -> None:
    expected = 401 if who == ANONYMOUS else ok if who in ADMINS else 403
    assert response.status_code == expected, (who, response.content)
    if response.status_code >= 400:
        assert "detail" in response.json()  # the one error shape


def members(response: Any, who: str) -> None:
    assert response.status_code == (401 if who == ANONYMOUS else 200), (who, response.content)


@pytest.fixture
def pending(full_fleet: tuple[Lab, Run]) -> PreemptionRequest:  # noqa: F811
    lab, _ = full_fleet
    PriorityClass.objects.create(name="urgent", value=1000, can_preempt=True, preemptible=False)
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    return PreemptionRequest.objects.get()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_queue_answers_members_with_their_team_and_admins_with_every_team(
    who: str, api_client_as: Any, pending: PreemptionRequest
) -> None:
    response = send(api_client_as(who), "get", "/queue")
    members(response, who)
    if who == ANONYMOUS:
        return
    body = response.json()
    names = {row["name"] for row in body["pending"]} | {row["name"] for row in body["running"]}
    assert names == (set() if who == OUTSIDER else {"urgent-run", "victim"})
    if who != OUTSIDER:
        waiting = next(row for row in body["pending"] if row["name"] == "urgent-run")
        assert waiting["priority_class"] == "urgent" and waiting["reason"]


@pytest.mark.parametrize("who", EVERYONE)
def test_the_fleet_answers_members_and_hides_other_teams_runs(
    who: str,
    api_client_as: Any,
    full_fleet: tuple[Lab, Run],  # noqa: F811
) -> None:
    response = send(api_client_as(who), "get", "/fleet")
    members(response, who)
    if who == ANONYMOUS:
        return
    host = next(h for h in response.json() if h["name"] == "cpu-a")
    assert host["cpu_used"] == 1
    [run] = host["runs"]
    assert (run["name"] == "victim") == (who != OUTSIDER)
    assert (run["run_id"] is None) == (who == OUTSIDER)


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_cordon_drain_and_uncordon(who: str, api_client_as: Any, lab: Lab) -> None:
    Host.objects.create(name="cpu-a", cpu_slots=1, heartbeat_at=timezone.now())
    client = api_client_as(who)
    response = send(client, "post", "/hosts/cpu-a/drain", {"reason": "kernel update"})
    admin_only(response, who)
    host = Host.objects.get(name="cpu-a")
    assert (host.state == HostState.DRAINING) == (who == TEAMMATE_ADMIN)
    if who == TEAMMATE_ADMIN:
        assert "kernel update" in response.json()["state_reason"]
        assert send(client, "post", "/hosts/cpu-a/uncordon", {}).json()["state"] == "ready"
        assert send(client, "post", "/hosts/cpu-a/explode", {}).status_code == 404
        assert send(client, "post", "/hosts/nope/cordon", {}).status_code == 404


@pytest.mark.parametrize("who", EVERYONE)
def test_members_read_classes_pools_and_quotas(who: str, api_client_as: Any, lab: Lab) -> None:
    client = api_client_as(who)
    for path in ("/classes", "/pools", "/quotas"):
        members(send(client, "get", path), who)
    if who != ANONYMOUS:
        names = [c["name"] for c in send(client, "get", "/classes").json()]
        assert "normal" in names


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_manage_classes(who: str, api_client_as: Any, lab: Lab) -> None:
    client = api_client_as(who)
    body = {"name": "batch", "value": 10, "grace_s": 30}
    admin_only(send(client, "post", "/classes", body), who, ok=201)
    assert PriorityClass.objects.filter(name="batch").exists() == (who == TEAMMATE_ADMIN)
    PriorityClass.objects.get_or_create(name="batch", defaults={"value": 10})
    admin_only(send(client, "put", "/classes/batch", {**body, "value": 20}), who)
    assert (PriorityClass.objects.get(name="batch").value == 20) == (who == TEAMMATE_ADMIN)
    admin_only(send(client, "delete", "/classes/batch"), who, ok=204)
    assert PriorityClass.objects.filter(name="batch").exists() == (who != TEAMMATE_ADMIN)


def test_a_bad_class_is_a_422_naming_each_field_and_saves_nothing(
    api_client_as: Any, lab: Lab
) -> None:
    client = api_client_as(TEAMMATE_ADMIN)
    count = PriorityClass.objects.count()
    response = send(client, "post", "/classes", {"name": "x y", "value": "high", "grace_s": 0})
    assert response.status_code == 422
    assert {"name", "value", "grace_s"} <= set(response.json()["errors"])
    body = {"name": "normal", "value": 1, "approval": "auto_recent_checkpoint"}
    response = send(client, "post", "/classes", body)
    assert response.status_code == 422
    assert {"name", "auto_approve_minutes"} <= set(response.json()["errors"])
    assert PriorityClass.objects.count() == count


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_create_pools_and_set_quotas(who: str, api_client_as: Any, lab: Lab) -> None:
    client = api_client_as(who)
    admin_only(send(client, "post", "/pools", {"name": "h200"}), who, ok=201)
    services.default_pool()
    body = {"team": lab.people.team.slug, "pool": "default", "gpus": 8}
    admin_only(send(client, "put", "/quotas", body), who)
    assert TeamQuota.objects.filter(gpus=8).exists() == (who == TEAMMATE_ADMIN)


def test_a_quota_for_an_unknown_team_or_pool_is_a_422(api_client_as: Any, lab: Lab) -> None:
    response = send(
        api_client_as(TEAMMATE_ADMIN), "put", "/quotas", {"team": "nope", "pool": "nope", "gpus": 1}
    )
    assert response.status_code == 422
    assert set(response.json()["errors"]) == {"team", "pool"}
    assert not TeamQuota.objects.exists()


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_see_preemption_requests_with_their_impact(
    who: str, api_client_as: Any, pending: PreemptionRequest
) -> None:
    client = api_client_as(who)
    admin_only(send(client, "get", "/preemptions"), who)
    response = send(client, "get", f"/preemptions/{pending.pk}")
    admin_only(response, who)
    if who == TEAMMATE_ADMIN:
        body = response.json()
        assert body["state"] == "pending" and body["requester"] == "urgent-run"
        assert body["purpose"] == "preempt"  # a class preempts (not a move, not a loan's end)
        [victim] = body["victims"]
        assert victim["name"] == "victim" and "gpu_hours_since_checkpoint" in victim
        assert send(client, "get", "/preemptions/999999").status_code == 404
        assert send(client, "get", "/preemptions?state=bogus").status_code == 422


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_approve_through_the_api(
    who: str, api_client_as: Any, pending: PreemptionRequest
) -> None:
    response = send(api_client_as(who), "post", f"/preemptions/{pending.pk}/approve")
    admin_only(response, who)
    approved = who == TEAMMATE_ADMIN
    pending.refresh_from_db()
    assert (pending.state == PreemptionState.APPROVED) == approved
    victim = pending.victims.get().run
    assert RunCommand.objects.filter(run=victim, kind="preempt").exists() == approved
    if approved:
        again = send(api_client_as(who), "post", f"/preemptions/{pending.pk}/approve")
        assert again.status_code == 409 and "already approved" in again.json()["detail"]


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_reject_and_a_reason_is_required(
    who: str, api_client_as: Any, pending: PreemptionRequest
) -> None:
    client = api_client_as(who)
    path = f"/preemptions/{pending.pk}/reject"
    if who == TEAMMATE_ADMIN:
        response = send(client, "post", path, {"reason": "   "})
        assert response.status_code == 422 and "reason" in response.json()["errors"]
        pending.refresh_from_db()
        assert pending.state == PreemptionState.PENDING
    admin_only(send(client, "post", path, {"reason": "deadline"}), who)
    pending.refresh_from_db()
    assert (pending.state == PreemptionState.REJECTED) == (who == TEAMMATE_ADMIN)


def test_launching_through_the_api_takes_a_class_and_a_priority(
    api_client_as: Any, lab: Lab
) -> None:
    from console.runs.launch import default_document

    PriorityClass.objects.create(name="urgent", value=1000)
    document = default_document(model="base", domains=[("parity", 1.0)])
    document.update(name="api-classy", max_steps=4)
    client = api_client_as("owner")
    body = {"spec": document, "priority_class": "urgent", "priority": 3}
    response = client.post("/api/runs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["priority_class"] == "urgent" and response.json()["priority"] == 3
    body["priority_class"] = "nope"
    response = client.post("/api/runs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 422 and "priority_class" in response.json()["errors"]
