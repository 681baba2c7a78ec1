"""Fixtures for console tests: one team, a person in every role, and clients acting as each.

The role matrix (names in `tests.console.factories`; `team`, `other_team` and `people` live in
tests/conftest.py so that browser tests under tests/e2e/ use the same people):

- `team`: "Lab" — the team whose objects are under test. `other_team`: "Other lab".
- `people`: a `People` with the users `owner` (researcher of `team`, the one who creates the
  objects a test looks at), `teammate_researcher`, `teammate_annotator`, `teammate_admin`
  (members of `team` with that role) and `outsider` (researcher of `other_team` only);
  `people.user(who)` returns the user for a name from `EVERYONE` (None for `anonymous`).
- `client_as(who)`: a Django test `Client` logged in (session) as `who`; `anonymous` is not
  logged in. Shortcuts: `owner_client`, `teammate_researcher_client`, `teammate_annotator_client`,
  `teammate_admin_client`, `outsider_client`, `anonymous_client`.
- `api_client_as(who)`: a `Client` whose every request carries `Authorization: Bearer <token>`
  for an API token of `who` in their team (`team`, or `other_team` for the outsider);
  `anonymous` sends no token. `people.token(who)` is that token's secret.

Typical role-matrix test:

    @pytest.mark.parametrize("who", EVERYONE)
    def test_domain_page_is_shown_to_members_only(who, client_as, people):
        domain = DomainFactory(team=people.team, created_by=people.owner)
        response = client_as(who).get(domain_url(domain))
        expected = 200 if who in READERS else 302 if who == ANONYMOUS else 404
        assert response.status_code == expected

Passwords are hashed with MD5 here (fast); `factories.password_for(username)` gives them.

The cluster tests' fixtures (`cluster`, `cluster_env`, `parity`: a control worker, host agents
and real jobs) are in tests/console/runs_cluster.py, imported here.

Websocket tests (consumers built on `console.broadcast.TeamGroupConsumer`): see
test_platform_broadcast.py — they need `transactional_db` (the consumer reads the session from
another thread) and pass the client's session cookie to `WebsocketCommunicator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from tests.conftest import People
from tests.console.factories import (
    ANONYMOUS,
    OUTSIDER,
    OWNER,
    TEAMMATE_ADMIN,
    TEAMMATE_ANNOTATOR,
    TEAMMATE_RESEARCHER,
)
from tests.console.runs_cluster import cluster, cluster_env, parity  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client_as(people: People) -> Callable[[str], Client]:
    def make(who: str) -> Client:
        client = Client()
        user = people.user(who)
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture
def api_client_as(people: People) -> Callable[[str], Client]:
    def make(who: str) -> Client:
        if who == ANONYMOUS:
            return Client()
        return Client(headers={"Authorization": f"Bearer {people.token(who)}"})

    return make


@pytest.fixture
def owner_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(OWNER)


@pytest.fixture
def teammate_researcher_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(TEAMMATE_RESEARCHER)


@pytest.fixture
def teammate_annotator_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(TEAMMATE_ANNOTATOR)


@pytest.fixture
def teammate_admin_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(TEAMMATE_ADMIN)


@pytest.fixture
def outsider_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(OUTSIDER)


@pytest.fixture
def anonymous_client(client_as: Callable[[str], Client]) -> Client:
    return client_as(ANONYMOUS)
