"""The scheduler's pages: the role matrix for every page and every POST (owner, teammates of
each role, outsider, anonymous), what each role sees, form errors that save nothing, and the
inbox's approve / reject. Real PostgreSQL; objects made with the services."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.audit.models import AuditEntry
from console.runs.models import Host, HostState, Run, RunCommand, RunState
from console.scheduling import services
from console.scheduling.models import PreemptionRequest, PreemptionState, PriorityClass, TeamQuota
from tests.console import test_runs_views
from tests.console.factories import ADMINS, ANONYMOUS, EVERYONE, OUTSIDER, TEAMMATE_ADMIN
from tests.console.test_runs_views import Lab
from tests.console.test_scheduling_services import full_fleet, launch  # noqa: F401

pytestmark = pytest.mark.django_db
lab = test_runs_views.lab  # the fixture: a model, the parity domain, a run
HTMX = {"HTTP_HX_REQUEST": "true"}


def is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and "/accounts/login/" in response["Location"]


def admin_only(response: Any, who: str, ok: int = 200) -> None:
    """Admins get `ok`; anonymous is sent to log in; every other role is refused (403)."""
    if who == ANONYMOUS:
        assert is_login_redirect(response)
    else:
        assert response.status_code == (ok if who in ADMINS else 403), who


@pytest.fixture
def pending(full_fleet: tuple[Lab, Run]) -> PreemptionRequest:  # noqa: F811
    lab, _ = full_fleet
    PriorityClass.objects.create(name="urgent", value=1000, can_preempt=True, preemptible=False)
    launch(lab, "urgent-run", priority_class="urgent")
    services.schedule_pass()
    return PreemptionRequest.objects.get()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_queue_is_for_members_and_shows_only_their_team_unless_admin(
    who: str, client_as: Any, lab: Lab
) -> None:
    Host.objects.create(name="cpu-a", cpu_slots=1, heartbeat_at=timezone.now())
    response = client_as(who).get(reverse("scheduling:queue"))
    if who == ANONYMOUS:
        assert is_login_redirect(response)
        return
    assert response.status_code == 200
    shows_run = lab.run.name in response.content.decode()
    assert shows_run == (who != OUTSIDER)


@pytest.mark.parametrize("who", EVERYONE)
def test_the_fleet_is_for_members_and_other_teams_runs_stay_unnamed(
    who: str,
    client_as: Any,
    full_fleet: tuple[Lab, Run],  # noqa: F811
) -> None:
    _, victim = full_fleet
    response = client_as(who).get(reverse("scheduling:fleet"))
    if who == ANONYMOUS:
        assert is_login_redirect(response)
        return
    assert response.status_code == 200
    page = response.content.decode()
    assert "cpu-a" in page
    if who == OUTSIDER:
        assert victim.name not in page and "a run of another team" in page
    else:
        assert victim.name in page
    assert ("Cordon</button>" in page) == (who == TEAMMATE_ADMIN)


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("action", ["cordon", "drain"])
def test_only_admins_cordon_or_drain_a_host(
    who: str, action: str, client_as: Any, lab: Lab
) -> None:
    host = Host.objects.create(name="cpu-a", cpu_slots=1, heartbeat_at=timezone.now())
    response = client_as(who).post(reverse(f"scheduling:host_{action}", args=[host.pk]))
    admin_only(response, who, ok=302)
    host.refresh_from_db()
    expected = HostState.CORDONED if action == "cordon" else HostState.DRAINING
    assert (host.state == expected) == (who == TEAMMATE_ADMIN)
    assert AuditEntry.objects.filter(action=f"host.{action}").exists() == (who == TEAMMATE_ADMIN)


def test_an_admin_uncordons_and_an_offline_host_cannot_be_made_ready(
    teammate_admin_client: Client, lab: Lab
) -> None:
    host = Host.objects.create(
        name="cpu-a", cpu_slots=1, heartbeat_at=timezone.now(), state=HostState.CORDONED
    )
    teammate_admin_client.post(reverse("scheduling:host_uncordon", args=[host.pk]))
    host.refresh_from_db()
    assert host.state == HostState.READY
    Host.objects.filter(pk=host.pk).update(state=HostState.OFFLINE)
    response = teammate_admin_client.post(
        reverse("scheduling:host_uncordon", args=[host.pk]), follow=True
    )
    assert "offline" in response.content.decode()
    host.refresh_from_db()
    assert host.state == HostState.OFFLINE


@pytest.mark.parametrize("who", EVERYONE)
def test_classes_and_quotas_page_is_for_admins(who: str, client_as: Any, lab: Lab) -> None:
    admin_only(client_as(who).get(reverse("scheduling:classes")), who)


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_create_classes(who: str, client_as: Any, lab: Lab) -> None:
    data = {"name": "batch", "value": 10, "approval": "ask", "auto_approve_minutes": 0,
            "grace_s": 30, "preemptible": "on"}  # fmt: skip
    response = client_as(who).post(reverse("scheduling:class_create"), data)
    admin_only(response, who, ok=302)
    assert PriorityClass.objects.filter(name="batch").exists() == (who == TEAMMATE_ADMIN)


def test_a_bad_class_shows_each_error_at_its_field_and_saves_nothing(
    teammate_admin_client: Client, lab: Lab
) -> None:
    services.default_class()
    data = {"name": "normal", "value": 10, "approval": "auto_recent_checkpoint",
            "auto_approve_minutes": 0, "grace_s": 0}  # fmt: skip
    response = teammate_admin_client.post(reverse("scheduling:class_create"), data)
    assert response.status_code == 422
    errors = response.context["class_form"].errors
    assert "grace_s" in errors  # below the minimum: the form says so before the service runs
    data["grace_s"] = 30
    response = teammate_admin_client.post(reverse("scheduling:class_create"), data)
    assert response.status_code == 422
    errors = response.context["class_form"].errors
    assert "exists" in str(errors["name"])
    assert "auto_approve_minutes" in errors
    assert PriorityClass.objects.count() == 1


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_edit_or_delete_a_class(who: str, client_as: Any, lab: Lab) -> None:
    cls = PriorityClass.objects.create(name="batch", value=10)
    client = client_as(who)
    admin_only(client.get(reverse("scheduling:class_edit", args=[cls.pk])), who)
    data = {"name": "batch", "value": 20, "approval": "ask", "auto_approve_minutes": 0,
            "grace_s": 30}  # fmt: skip
    admin_only(client.post(reverse("scheduling:class_edit", args=[cls.pk]), data), who, ok=302)
    cls.refresh_from_db()
    assert (cls.value == 20) == (who == TEAMMATE_ADMIN)
    admin_only(client.post(reverse("scheduling:class_delete", args=[cls.pk])), who, ok=302)
    assert PriorityClass.objects.filter(pk=cls.pk).exists() == (who != TEAMMATE_ADMIN)


def test_the_default_class_and_a_class_in_use_cannot_be_deleted(
    teammate_admin_client: Client, lab: Lab
) -> None:
    assert lab.run.priority_class is not None
    default = lab.run.priority_class
    response = teammate_admin_client.post(
        reverse("scheduling:class_delete", args=[default.pk]), follow=True
    )
    assert "cannot be deleted" in response.content.decode()
    assert PriorityClass.objects.filter(pk=default.pk).exists()


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_set_quotas_and_create_pools(who: str, client_as: Any, lab: Lab) -> None:
    client = client_as(who)
    response = client.post(reverse("scheduling:pool_create"), {"name": "h200"})
    admin_only(response, who, ok=302)
    services.default_pool()
    data = {"team": lab.people.team.slug, "pool": "default", "gpus": 8}
    admin_only(client.post(reverse("scheduling:quota_set"), data), who, ok=302)
    assert TeamQuota.objects.filter(gpus=8).exists() == (who == TEAMMATE_ADMIN)


def test_a_bad_quota_is_a_form_error(teammate_admin_client: Client, lab: Lab) -> None:
    services.default_pool()
    data = {"team": "no-such-team", "pool": "default", "gpus": -1}
    response = teammate_admin_client.post(reverse("scheduling:quota_set"), data)
    assert response.status_code == 422
    errors = response.context["quota_form"].errors
    assert "team" in errors and "gpus" in errors
    assert not TeamQuota.objects.exists()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_inbox_is_for_admins_and_shows_the_impact_preview(
    who: str, client_as: Any, pending: PreemptionRequest
) -> None:
    response = client_as(who).get(reverse("scheduling:inbox"))
    admin_only(response, who)
    if who == TEAMMATE_ADMIN:
        page = response.content.decode()
        assert f'id="preemption-{pending.pk}"' in page
        assert "GPU-hours since checkpoint" in page and "victim" in page
        assert '<span class="badge purpose">Preemption</span>' in page  # the request's purpose
        fragment = client_as(who).get(reverse("scheduling:inbox"), **HTMX)
        assert fragment.content.decode().lstrip().startswith('<div id="inbox"')


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_approve(who: str, client_as: Any, pending: PreemptionRequest) -> None:
    url = reverse("scheduling:preemption_approve", args=[pending.pk])
    admin_only(client_as(who).post(url), who, ok=302)
    pending.refresh_from_db()
    approved = who == TEAMMATE_ADMIN
    assert (pending.state == PreemptionState.APPROVED) == approved
    victim = pending.victims.get().run
    assert RunCommand.objects.filter(run=victim, kind="preempt").exists() == approved


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_reject(who: str, client_as: Any, pending: PreemptionRequest) -> None:
    url = reverse("scheduling:preemption_reject", args=[pending.pk])
    admin_only(client_as(who).post(url, {"reason": "not now"}), who, ok=302)
    pending.refresh_from_db()
    assert (pending.state == PreemptionState.REJECTED) == (who == TEAMMATE_ADMIN)


def test_a_rejection_without_a_reason_is_a_form_error_and_changes_nothing(
    teammate_admin_client: Client, pending: PreemptionRequest
) -> None:
    url = reverse("scheduling:preemption_reject", args=[pending.pk])
    response = teammate_admin_client.post(url, {"reason": ""})
    assert response.status_code == 422
    assert "This field is required" in response.content.decode()
    pending.refresh_from_db()
    assert pending.state == PreemptionState.PENDING
    victim = pending.victims.get().run
    victim.refresh_from_db()
    assert victim.state == RunState.RUNNING


def test_approving_twice_is_a_message_not_an_error(
    teammate_admin_client: Client, pending: PreemptionRequest
) -> None:
    url = reverse("scheduling:preemption_approve", args=[pending.pk])
    teammate_admin_client.post(url)
    response = teammate_admin_client.post(url, follow=True)
    assert response.status_code == 200
    assert "already approved" in response.content.decode()


def test_a_researcher_picks_a_class_and_a_priority_on_the_new_run_form(
    owner_client: Client, lab: Lab
) -> None:
    PriorityClass.objects.create(name="urgent", value=1000)
    data = test_runs_views.form_data(lab, name="classy", priority_class="urgent", priority=7)
    response = owner_client.post(reverse("runs:run_create"), data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = Run.objects.get(name="classy")
    assert run.priority_class is not None and run.priority_class.name == "urgent"
    assert run.priority == 7
