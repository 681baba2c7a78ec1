"""Seed the demo: team "Demo lab" with a researcher, an annotator and an admin, then the
registry colleague's demo objects. Idempotent: a rerun keeps existing data and resets only the
three demo users' passwords, so the logins it prints always work."""

from __future__ import annotations

import importlib
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from console.accounts import services
from console.accounts.models import Membership, Role, Team

TEAM_SLUG = "demo-lab"
TEAM_NAME = "Demo lab"
# Demo-only accounts on a private, loopback-bound server; documented in README.md.
DEMO_USERS = [
    ("researcher", Role.RESEARCHER, "researcher-demo-pass"),
    ("annotator", Role.ANNOTATOR, "annotator-demo-pass"),
    ("admin", Role.ADMIN, "admin-demo-pass"),
]


class Command(BaseCommand):
    help = "Create (or refresh) the demo team, its three users and demo registry objects."

    def handle(self, *args: Any, **options: Any) -> None:
        team, users = self.seed_team()
        self.seed_registry(team, users["researcher"])
        self.seed_models(team, users["researcher"])
        self.stdout.write(f"\nDemo team “{team.name}”. Logins (username / password):")
        for username, role, password in DEMO_USERS:
            self.stdout.write(f"  {username:<11} {password:<22} {Role(role).label}")

    @transaction.atomic
    def seed_team(self) -> tuple[Team, dict[str, Any]]:
        user_model = get_user_model()
        users: dict[str, Any] = {}
        for username, _role, password in DEMO_USERS:
            user, _ = user_model.objects.get_or_create(
                username=username, defaults={"email": f"{username}@demo.invalid"}
            )
            user.set_password(password)
            # A team admin manages one team's members inside the console; Django's staff and
            # superuser flags open /admin/, which shows every team's objects. Team roles and
            # staff status are different things, so no demo user is staff (a rerun also
            # demotes one an older seed made superuser). Platform staff come from
            # `manage.py createsuperuser`.
            user.is_staff = user.is_superuser = False
            user.save(update_fields=["password", "is_staff", "is_superuser"])
            users[username] = user
        admin = users["admin"]
        team = Team.objects.filter(slug=TEAM_SLUG).first()
        if team is None:
            team = services.team_create(actor=admin, name=TEAM_NAME, slug=TEAM_SLUG)
        for username, role, _ in DEMO_USERS:
            if not Membership.objects.filter(team=team, user=users[username]).exists():
                services.membership_add(actor=admin, team=team, username=username, role=role)
        return team, users

    def seed_models(self, team: Team, researcher: Any) -> None:
        from console.runs.demo import seed_models

        self.stdout.write("Demo model (built on first use; a few minutes on a CPU) ...")
        version = seed_models(team=team, user=researcher, log=self.stdout.write)
        self.stdout.write(f"Model {version} registered at {version.path}.")

    def seed_registry(self, team: Team, researcher: Any) -> None:
        try:
            demo = importlib.import_module("console.registry.demo")
        except ModuleNotFoundError:
            self.stdout.write("(no registry demo data: console.registry.demo does not exist yet)")
            return
        seed_registry = getattr(demo, "seed_registry", None)
        if seed_registry is None:
            self.stdout.write("(no registry demo data: no console.registry.demo.seed_registry)")
            return
        seed_registry(team=team, user=researcher)
        self.stdout.write("Registry demo data seeded.")
