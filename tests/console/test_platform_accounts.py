import pytest
from django.test import Client

from console.accounts.models import ApiToken, Membership, Role
from console.audit.models import AuditEntry
from tests.console.factories import (
    ADMINS,
    ANONYMOUS,
    EVERYONE,
    OUTSIDER,
    TeamFactory,
    UserFactory,
    password_for,
)


def test_logging_in_with_the_password_leads_to_the_console(people):
    client = Client()
    response = client.post(
        "/accounts/login/", {"username": "owner", "password": password_for("owner")}
    )
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/accounts/tokens/").status_code == 200


def test_a_wrong_password_is_refused(people):
    response = Client().post("/accounts/login/", {"username": "owner", "password": "nope"})
    assert response.status_code == 200
    assert "enter a correct username and password" in response.content.decode().lower()


def test_logging_out_ends_the_session(owner_client):
    assert owner_client.post("/accounts/logout/").status_code == 302
    assert owner_client.get("/accounts/tokens/").status_code == 302


# --- team switcher


def test_the_team_switcher_changes_the_active_team_for_a_member_of_both(people):
    Membership.objects.create(user=people.owner, team=people.other_team, role=Role.ANNOTATOR)
    client = Client()
    client.force_login(people.owner)
    page = client.get("/accounts/tokens/").content.decode()
    assert 'name="team"' in page  # the switcher shows for two teams
    response = client.post("/accounts/team/", {"team": people.other_team.pk, "next": "/audit/"})
    assert response.status_code == 302 and response["Location"] == "/audit/"
    client.post("/accounts/tokens/", {"name": "in other lab"})
    assert ApiToken.objects.get(name="in other lab").team == people.other_team


@pytest.mark.parametrize("who", EVERYONE)
def test_switching_to_a_team_one_is_not_in_is_404(who, client_as, people):
    response = client_as(who).post("/accounts/team/", {"team": people.other_team.pk})
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    elif who == OUTSIDER:
        assert response.status_code == 302
    else:
        assert response.status_code == 404


def test_the_switcher_refuses_to_redirect_off_site(outsider_client, people):
    response = outsider_client.post(
        "/accounts/team/", {"team": people.other_team.pk, "next": "https://evil.example/"}
    )
    assert response["Location"] == "/"


# --- API tokens


@pytest.mark.parametrize("who", EVERYONE)
def test_everyone_logged_in_can_create_a_token_shown_once(who, client_as, people):
    client = client_as(who)
    response = client.post("/accounts/tokens/", {"name": "eval script"})
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert not ApiToken.objects.exists()
        return
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=people.user(who))
    assert token.team == people.team_of(who)
    page = response.content.decode()
    secret = page.split('<pre id="new-token">')[1].split("</pre>")[0]
    assert secret.startswith(token.prefix)
    # The token works, and the list page never shows the secret again.
    api = Client(headers={"Authorization": f"Bearer {secret}"})
    assert api.get("/api/me").json()["username"] == who
    assert secret not in client.get("/accounts/tokens/").content.decode()
    assert AuditEntry.objects.filter(action="api_token.create", actor=people.user(who)).exists()


def test_a_token_without_a_name_is_refused(owner_client, people):
    response = owner_client.post("/accounts/tokens/", {"name": "   "})
    assert response.status_code == 400
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("who", EVERYONE)
def test_only_the_owner_of_a_token_can_revoke_it(who, client_as, api_client_as, people):
    api_client_as("owner")  # creates the owner's token
    token = ApiToken.objects.get(user=people.owner)
    response = client_as(who).post(f"/accounts/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    if who == "owner":
        assert response.status_code == 302
        assert not token.is_active
        assert api_client_as("owner").get("/api/me").status_code == 401
    else:
        assert response.status_code == (302 if who == ANONYMOUS else 404)
        assert token.is_active


# --- members


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_see_the_member_page(who, client_as, people):
    response = client_as(who).get("/accounts/members/")
    if who in ADMINS:
        assert response.status_code == 200
        assert "teammate_annotator" in response.content.decode()
        assert "outsider" not in response.content.decode()
    elif who == ANONYMOUS:
        assert response.status_code == 302
    else:
        # The outsider is a researcher of their own team; the page is about that team.
        assert response.status_code == 403


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_add_members(who, client_as, people):
    UserFactory(username="newcomer")
    response = client_as(who).post(
        "/accounts/members/", {"username": "newcomer", "role": Role.ANNOTATOR}
    )
    added = Membership.objects.filter(user__username="newcomer").first()
    if who in ADMINS:
        assert response.status_code == 302
        assert added is not None and added.team == people.team and added.role == Role.ANNOTATOR
        entry = AuditEntry.objects.get(action="membership.add")
        assert entry.actor == people.teammate_admin
        assert entry.after == {"user": "newcomer", "role": "annotator"}
    else:
        assert added is None
        assert response.status_code == (302 if who == ANONYMOUS else 403)


def test_adding_an_unknown_or_existing_user_says_why(teammate_admin_client, people):
    response = teammate_admin_client.post(
        "/accounts/members/", {"username": "ghost", "role": Role.RESEARCHER}
    )
    assert response.status_code == 400
    assert "There is no user called" in response.content.decode()
    response = teammate_admin_client.post(
        "/accounts/members/", {"username": "owner", "role": Role.RESEARCHER}
    )
    assert response.status_code == 400
    assert "already a member" in response.content.decode()


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_change_roles(who, client_as, people):
    member = Membership.objects.get(user=people.teammate_annotator)
    client_as(who).post(f"/accounts/members/{member.pk}/role/", {"role": Role.RESEARCHER})
    member.refresh_from_db()
    assert member.role == (Role.RESEARCHER if who in ADMINS else Role.ANNOTATOR)


@pytest.mark.parametrize("who", EVERYONE)
def test_only_admins_remove_members(who, client_as, people):
    member = Membership.objects.get(user=people.teammate_researcher)
    client_as(who).post(f"/accounts/members/{member.pk}/remove/")
    assert Membership.objects.filter(pk=member.pk).exists() == (who not in ADMINS)


def test_an_admin_cannot_touch_another_teams_members(teammate_admin_client, people):
    foreign = Membership.objects.get(user=people.outsider)
    response = teammate_admin_client.post(f"/accounts/members/{foreign.pk}/remove/")
    assert response.status_code == 404
    response = teammate_admin_client.post(
        f"/accounts/members/{foreign.pk}/role/", {"role": Role.ADMIN}
    )
    assert response.status_code == 404
    foreign.refresh_from_db()
    assert foreign.role == Role.RESEARCHER


def test_the_last_admin_can_be_neither_removed_nor_demoted(teammate_admin_client, people):
    admin = Membership.objects.get(user=people.teammate_admin)
    response = teammate_admin_client.post(f"/accounts/members/{admin.pk}/remove/", follow=True)
    assert "at least one admin" in response.content.decode()
    teammate_admin_client.post(f"/accounts/members/{admin.pk}/role/", {"role": Role.ANNOTATOR})
    admin.refresh_from_db()
    assert admin.role == Role.ADMIN
    assert not AuditEntry.objects.filter(action__startswith="membership.").exists()


def test_with_a_second_admin_the_first_may_step_down(teammate_admin_client, people):
    Membership.objects.filter(user=people.owner).update(role=Role.ADMIN)
    admin = Membership.objects.get(user=people.teammate_admin)
    teammate_admin_client.post(f"/accounts/members/{admin.pk}/role/", {"role": Role.RESEARCHER})
    admin.refresh_from_db()
    assert admin.role == Role.RESEARCHER
    entry = AuditEntry.objects.get(action="membership.change_role")
    assert (entry.before["role"], entry.after["role"]) == ("admin", "researcher")


def test_a_user_in_no_team_is_told_so(db):
    lonely = UserFactory(username="lonely")
    TeamFactory()
    client = Client()
    client.force_login(lonely)
    assert client.get("/accounts/tokens/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin(people):
    import threading

    from django.core.exceptions import ValidationError
    from django.db import connection

    from console.accounts.services import membership_change_role

    first = Membership.objects.get(user=people.teammate_admin)
    second = Membership.objects.get(user=people.owner, team=people.team)
    Membership.objects.filter(pk=second.pk).update(role=Role.ADMIN)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def demote(actor, membership):
        try:
            barrier.wait()
            membership_change_role(actor=actor, membership=membership, role=Role.RESEARCHER)
            outcomes.append("demoted")
        except ValidationError:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [
        threading.Thread(target=demote, args=(people.teammate_admin, second)),
        threading.Thread(target=demote, args=(people.owner, first)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["demoted", "refused"]
    assert Membership.objects.filter(team=people.team, role=Role.ADMIN).count() == 1
