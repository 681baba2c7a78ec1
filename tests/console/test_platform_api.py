import pytest

from console.accounts.models import ApiToken
from console.accounts.services import api_token_revoke, token_digest
from tests.console.factories import EVERYONE, OUTSIDER, OWNER


@pytest.mark.parametrize("who", EVERYONE)
def test_api_me_answers_with_the_tokens_user_and_team_or_401(who, api_client_as, people):
    response = api_client_as(who).get("/api/me")
    if who == "anonymous":
        assert response.status_code == 401
        return
    assert response.status_code == 200
    body = response.json()
    assert body["username"] == who
    assert body["team_slug"] == ("other-lab" if who == OUTSIDER else "lab")


def test_only_a_digest_of_the_token_is_stored(people):
    secret = people.token(OWNER)
    token = ApiToken.objects.get(user=people.owner)
    assert token.digest == token_digest(secret)
    stored = [str(value) for value in ApiToken.objects.values_list().get()]
    assert secret not in stored


def test_a_revoked_token_gets_401(api_client_as, people):
    client = api_client_as(OWNER)
    assert client.get("/api/me").status_code == 200
    api_token_revoke(user=people.owner, token=ApiToken.objects.get(user=people.owner))
    assert client.get("/api/me").status_code == 401


def test_a_token_stops_working_when_its_user_leaves_the_team(api_client_as, people):
    client = api_client_as(OWNER)
    people.owner.memberships.all().delete()
    assert client.get("/api/me").status_code == 401


def test_a_wrong_token_gets_401(client, people):
    response = client.get("/api/me", headers={"Authorization": "Bearer ptc_not-a-real-token"})
    assert response.status_code == 401


def test_the_openapi_schema_lists_the_endpoints_and_bearer_auth(client, db):
    schema = client.get("/api/openapi.json").json()
    assert "/api/me" in schema["paths"]
    assert any(
        s.get("scheme") == "bearer" for s in schema["components"]["securitySchemes"].values()
    )


def test_the_api_docs_page_is_served(client, db):
    response = client.get("/api/docs")
    assert response.status_code == 200
    assert "openapi.json" in response.content.decode()


def test_the_api_docs_page_loads_its_assets_from_this_server_not_a_cdn(client, db):
    import re

    from django.contrib.staticfiles import finders

    page = client.get("/api/docs").content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert any(url.endswith("swagger-ui-bundle.js") for url in assets)
    for url in assets:
        assert url.startswith("/static/"), url
        assert finders.find(url.removeprefix("/static/")), f"{url} is not a static file here"


def test_the_registry_router_is_mounted_under_the_api(client, db):
    schema = client.get("/api/openapi.json").json()
    assert any(path.startswith("/api/registry/") for path in schema["paths"])
