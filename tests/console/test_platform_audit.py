from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from console.accounts.models import Membership
from console.audit.models import AuditEntry
from console.audit.services import audit_record
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS


def record(people, *, action="thing.create", actor=None, team=None, label_target=None):
    target = label_target or Membership.objects.get(user=people.owner)
    return audit_record(
        actor=actor or people.owner, team=team or people.team, action=action, target=target,
        before=None, after={"role": "researcher", "when": timezone.now()},
    )  # fmt: skip


def test_audit_record_stores_who_what_and_the_states_as_json(people):
    entry = record(people)
    entry.refresh_from_db()
    assert entry.actor_name == "owner"
    assert entry.target_type == "accounts.membership"
    assert entry.target_id == str(Membership.objects.get(user=people.owner).pk)
    assert entry.before is None
    assert entry.after["role"] == "researcher"
    assert isinstance(entry.after["when"], str)  # datetimes are stored as ISO text


def test_audit_record_refuses_an_unsaved_target(people):
    with pytest.raises(ValueError, match="saved target"):
        audit_record(
            actor=people.owner, team=people.team, action="x.create",
            target=Membership(team=people.team, user=people.owner), before=None, after=None,
        )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_audit_record_refuses_to_write_outside_a_transaction(people):
    with pytest.raises(RuntimeError, match="inside the writing service's transaction"):
        record(people)
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_entry_rolls_back_with_the_change_it_records(people):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        record(people)
        1 / 0  # noqa: B018  the writing service fails after recording
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("who", EVERYONE)
def test_the_audit_page_shows_only_the_own_teams_entries(who, client_as, people):
    record(people, action="lab.secret_change")
    record(people, action="other.change", actor=people.outsider, team=people.other_team,
           label_target=Membership.objects.get(user=people.outsider))  # fmt: skip
    response = client_as(who).get("/audit/")
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
        return
    assert response.status_code == 200
    content = response.content.decode()
    if who in READERS:
        assert "lab.secret_change" in content
        assert "other.change" not in content
    else:
        assert who == OUTSIDER
        assert "other.change" in content
        assert "lab.secret_change" not in content


def test_the_audit_page_filters_by_actor_action_type_and_dates(owner_client, people):
    record(people, action="domain.create")
    record(people, action="domain.update", actor=people.teammate_admin)
    old = record(people, action="domain.delete")
    AuditEntry.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=10))

    def actions(query):
        response = owner_client.get("/audit/", query, headers={"HX-Request": "true"})
        assert response.status_code == 200
        return {a for a in ("domain.create", "domain.update", "domain.delete")
                if a in response.content.decode()}  # fmt: skip

    assert actions({}) == {"domain.create", "domain.update", "domain.delete"}
    assert actions({"actor": "teammate_admin"}) == {"domain.update"}
    assert actions({"action": "domain.create"}) == {"domain.create"}
    assert actions({"target_type": "accounts.membership"}) == {
        "domain.create", "domain.update", "domain.delete"
    }  # fmt: skip
    today = timezone.now().date()
    assert actions({"since": str(today - timedelta(days=1))}) == {"domain.create", "domain.update"}
    assert actions({"until": str(today - timedelta(days=5))}) == {"domain.delete"}


def test_an_htmx_request_gets_only_the_table(owner_client, people):
    record(people)
    full = owner_client.get("/audit/").content.decode()
    fragment = owner_client.get("/audit/", headers={"HX-Request": "true"}).content.decode()
    assert "<html" in full and 'id="entries"' in full
    assert "<html" not in fragment and fragment.strip().startswith('<div id="entries">')


def test_the_audit_page_pages_through_many_entries(owner_client, people):
    for n in range(55):
        record(people, action=f"bulk.n{n:02d}")
    htmx = {"HX-Request": "true"}
    first = owner_client.get("/audit/", headers=htmx).content.decode()
    second = owner_client.get("/audit/", {"page": 2}, headers=htmx).content.decode()
    assert "bulk.n54" in first and "bulk.n00" not in first
    assert "bulk.n00" in second and "page 2 of 2" in second


def test_a_bad_date_filter_shows_an_error_and_filters_nothing(owner_client, people):
    record(people, action="domain.create")
    response = owner_client.get("/audit/", {"since": "not-a-date"})
    assert response.status_code == 200
    assert "Enter a valid date" in response.content.decode()
    assert "domain.create" in response.content.decode()


def test_user_text_in_the_log_is_escaped(owner_client, people):
    membership = Membership.objects.get(user=people.owner)
    people.owner.username = "<script>alert(1)</script>"
    people.owner.save()
    audit_record(actor=people.owner, team=people.team, action="x.y", target=membership,
                 before=None, after={"note": "<b>hi</b>"})  # fmt: skip
    content = owner_client.get("/audit/").content.decode()
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;" in content
    assert "<b>hi</b>" not in content


def test_the_target_link_shows_everything_recorded_about_one_object(owner_client, people):
    mine = Membership.objects.get(user=people.owner)
    theirs = Membership.objects.get(user=people.teammate_admin)
    record(people, action="membership.first", label_target=mine)
    record(people, action="membership.second", label_target=theirs)
    page = owner_client.get("/audit/").content.decode()
    assert f"target_type=accounts.membership&amp;target_id={mine.pk}" in page
    fragment = owner_client.get(
        "/audit/",
        {"target_type": "accounts.membership", "target_id": mine.pk},
        headers={"HX-Request": "true"},
    ).content.decode()
    assert "membership.first" in fragment and "membership.second" not in fragment


# --- the page shows what changed, not whole objects ----------------------------------------------


def test_the_log_shows_only_the_fields_that_changed(people, client):
    unchanged = "unchanged text " * 400
    membership = Membership.objects.get(user=people.owner)
    with transaction.atomic():
        audit_record(
            actor=people.owner, team=people.team, action="thing.update", target=membership,
            before={"title": "Old", "notes": unchanged, "limits": {"cpu": 1, "pids": 64}},
            after={"title": "New", "notes": unchanged, "limits": {"cpu": 2, "pids": 64}},
        )  # fmt: skip
    client.force_login(people.owner)
    content = client.get("/audit/").content.decode()
    assert "unchanged text" not in content  # an unchanged field is not listed
    assert "2 fields: <code>limits.cpu</code>, <code>title</code>" in content
    assert '<td class="removed"><pre class="json">Old</pre>' in content
    assert '<td class="added"><pre class="json">New</pre>' in content
    assert "limits.pids" not in content


def test_a_creation_lists_the_new_fields_and_long_values_are_cut(people, client):
    membership = Membership.objects.get(user=people.owner)
    with transaction.atomic():
        audit_record(
            actor=people.owner, team=people.team, action="thing.create", target=membership,
            before=None, after={"source": "x" * 5000},
        )  # fmt: skip
    client.force_login(people.owner)
    content = client.get("/audit/").content.decode()
    assert "1 field: <code>source</code>" in content
    assert "x" * 5000 not in content and "(5,000 characters)" in content
