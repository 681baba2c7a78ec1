"""factory-boy factories for the console's accounts, the role matrix every view test uses, and
`attempt_create` (a run's attempt with its allocation, as the scheduler makes them).

Every factory user has the password `password-<username>` (see `password_for`)."""

from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model

from console.accounts.models import Membership, Role, Team
from console.runs import services as runs_services
from console.runs.models import Attempt, Host, Run

# Who a view test acts as (the fixtures in tests/console/conftest.py build each of them).
OWNER = "owner"  # a researcher of the team who created the objects under test
TEAMMATE_RESEARCHER = "teammate_researcher"
TEAMMATE_ANNOTATOR = "teammate_annotator"
TEAMMATE_ADMIN = "teammate_admin"
OUTSIDER = "outsider"  # a researcher of another team only
ANONYMOUS = "anonymous"

EVERYONE = (OWNER, TEAMMATE_RESEARCHER, TEAMMATE_ANNOTATOR, TEAMMATE_ADMIN, OUTSIDER, ANONYMOUS)
# What each role may do with the team's objects
# (docs/ARCHITECTURE.md: higher roles include lower ones).
READERS = frozenset({OWNER, TEAMMATE_RESEARCHER, TEAMMATE_ANNOTATOR, TEAMMATE_ADMIN})
WRITERS = frozenset({OWNER, TEAMMATE_RESEARCHER, TEAMMATE_ADMIN})
ADMINS = frozenset({TEAMMATE_ADMIN})


def password_for(username: str) -> str:
    return f"password-{username}"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.test")

    @factory.post_generation
    def password(self, create: bool, extracted: str | None, **kwargs: object) -> None:
        self.set_password(extracted or password_for(self.username))
        if create:
            self.save(update_fields=["password"])


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda team: team.slug.replace("-", " ").title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    role = Role.RESEARCHER


# An attempt's states whose node keeps that state; a node of an attempt in any other state
# (completed, failed, preempted, cancelled) has exited (migration runs 0005's backfill too).
NODE_STATES = frozenset({"scheduled", "starting", "running", "lost"})


def attempt_create(run: Run, host: Host, *, number: int = 1, **fields: Any) -> Attempt:
    """An attempt of `run` on `host` as the scheduler leaves it: with node 0's allocation (made
    by the scheduler's own `allocations_create`), in the state the attempt's implies."""
    attempt = Attempt.objects.create(run=run, number=number, host=host, **fields)
    [node] = runs_services.allocations_create(attempt=attempt, hosts=[host])
    node.state = attempt.state if attempt.state in NODE_STATES else "exited"
    node.pid, node.exit_code = attempt.pid, attempt.exit_code
    node.started_at, node.ended_at = attempt.started_at, attempt.ended_at
    node.save(update_fields=["state", "pid", "exit_code", "started_at", "ended_at"])
    return attempt
