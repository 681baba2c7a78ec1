"""factory-boy factories for the console's accounts, and the role matrix every view test uses.

Every factory user has the password `password-<username>` (see `password_for`)."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from console.accounts.models import Membership, Role, Team

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
