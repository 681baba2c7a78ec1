import pytest
from django.test import Client

from console.accounts.models import ApiToken
from tests.console.factories import EVERYONE, UserFactory

ADMIN_PAGES = [
    "/admin/",
    "/admin/accounts/team/",
    "/admin/accounts/apitoken/",
    "/admin/audit/auditentry/",
    "/admin/status/workersighting/",
    "/admin/accounts/loginfailure/",
    "/admin/scheduling/priorityclass/",
    "/admin/scheduling/resourcepool/",
    "/admin/scheduling/teamquota/",
    "/admin/scheduling/preemptionrequest/",
    "/admin/scheduling/schedulingdecision/",
]


@pytest.fixture
def staff_client(db):
    client = Client()
    client.force_login(UserFactory(username="staff", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize("url", ADMIN_PAGES)
def test_staff_open_the_admin_pages(staff_client, url):
    assert staff_client.get(url).status_code == 200


@pytest.mark.parametrize("who", EVERYONE)
def test_team_members_who_are_not_staff_are_sent_to_the_admin_login(who, client_as, people):
    response = client_as(who).get("/admin/accounts/apitoken/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_the_token_digest_never_appears_in_the_admin(staff_client, people):
    people.token("owner")
    token = ApiToken.objects.get()
    page = staff_client.get(f"/admin/accounts/apitoken/{token.pk}/change/").content.decode()
    assert token.prefix in page
    assert token.digest not in page
    assert staff_client.get("/admin/accounts/apitoken/add/").status_code == 403
