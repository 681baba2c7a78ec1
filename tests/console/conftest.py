"""Fixtures for console tests: one team, a person in every role, and clients acting as each.

The role matrix (names in `tests.console.factories`):

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import Client

from console.accounts.models import Role, Team
from console.accounts.services import api_token_create
from tests.console.factories import (
    ANONYMOUS,
    OUTSIDER,
    OWNER,
    TEAMMATE_ADMIN,
    TEAMMATE_ANNOTATOR,
    TEAMMATE_RESEARCHER,
    MembershipFactory,
    TeamFactory,
    UserFactory,
)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class People:
    team: Team
    other_team: Team
    owner: Any
    teammate_researcher: Any
    teammate_annotator: Any
    teammate_admin: Any
    outsider: Any
    tokens: dict[str, str] = field(default_factory=dict)

    def user(self, who: str) -> Any:
        if who == ANONYMOUS:
            return None
        return getattr(self, who)

    def team_of(self, who: str) -> Team:
        return self.other_team if who == OUTSIDER else self.team

    def token(self, who: str) -> str:
        """The API token secret of `who` (created on first use)."""
        if who not in self.tokens:
            _, secret = api_token_create(user=self.user(who), team=self.team_of(who), name="tests")
            self.tokens[who] = secret
        return self.tokens[who]


@pytest.fixture
def team(db: None) -> Team:
    return TeamFactory(slug="lab", name="Lab")


@pytest.fixture
def other_team(db: None) -> Team:
    return TeamFactory(slug="other-lab", name="Other lab")


@pytest.fixture
def people(team: Team, other_team: Team) -> People:
    def member(username: str, member_team: Team, role: str) -> Any:
        user = UserFactory(username=username)
        MembershipFactory(user=user, team=member_team, role=role)
        return user

    # The outsider's team has an admin of its own, so it is a well-formed team.
    member("other_admin", other_team, Role.ADMIN)
    return People(
        team=team,
        other_team=other_team,
        owner=member(OWNER, team, Role.RESEARCHER),
        teammate_researcher=member(TEAMMATE_RESEARCHER, team, Role.RESEARCHER),
        teammate_annotator=member(TEAMMATE_ANNOTATOR, team, Role.ANNOTATOR),
        teammate_admin=member(TEAMMATE_ADMIN, team, Role.ADMIN),
        outsider=member(OUTSIDER, other_team, Role.RESEARCHER),
    )


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
