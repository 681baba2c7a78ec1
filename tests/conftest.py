"""Shared test configuration. Each part has its own conftest under tests/<part>/.

`team`, `other_team` and `people` (the role matrix, documented in tests/console/conftest.py)
live here so that console tests and browser tests (tests/e2e/) use the same people."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.console.factories import (
    ANONYMOUS,
    OUTSIDER,
    OWNER,
    TEAMMATE_ADMIN,
    TEAMMATE_ANNOTATOR,
    TEAMMATE_RESEARCHER,
)


@dataclass
class People:
    team: Any
    other_team: Any
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

    def team_of(self, who: str) -> Any:
        return self.other_team if who == OUTSIDER else self.team

    def token(self, who: str) -> str:
        """The API token secret of `who` (created on first use)."""
        from console.accounts.services import api_token_create

        if who not in self.tokens:
            _, secret = api_token_create(user=self.user(who), team=self.team_of(who), name="tests")
            self.tokens[who] = secret
        return self.tokens[who]


@pytest.fixture
def team(db: None) -> Any:
    from tests.console.factories import TeamFactory

    return TeamFactory(slug="lab", name="Lab")


@pytest.fixture
def other_team(db: None) -> Any:
    from tests.console.factories import TeamFactory

    return TeamFactory(slug="other-lab", name="Other lab")


@pytest.fixture
def people(team: Any, other_team: Any) -> People:
    from console.accounts.models import Role
    from tests.console.factories import MembershipFactory, UserFactory

    def member(username: str, member_team: Any, role: str) -> Any:
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
