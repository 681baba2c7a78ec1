"""Writes for teams, memberships and API tokens. Each is one transaction and audit-logged."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from console.accounts.models import ApiToken, Membership, Role, Team
from console.audit.services import audit_record

TOKEN_PREFIX = "ptc_"  # noqa: S105  (a public marker, not a secret)


def token_digest(secret: str) -> str:
    # The secret has 256 bits of entropy, so a plain SHA-256 is enough (no slow KDF needed):
    # nobody can brute-force the digest back into the secret.
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def api_token_create(*, user: Any, team: Team, name: str) -> tuple[ApiToken, str]:
    """A new token for `user` in `team`; returns it with its secret, which is never stored."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the token a name, e.g. the script that will use it."})
    if len(name) > 100:
        raise ValidationError({"name": "At most 100 characters."})
    if not Membership.objects.filter(user=user, team=team).exists():
        raise ValidationError("You are not a member of this team.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, team=team, name=name, prefix=secret[: len(TOKEN_PREFIX) + 6],
        digest=token_digest(secret),
    )  # fmt: skip
    audit_record(
        actor=user, team=team, action="api_token.create", target=token, before=None,
        after={"name": token.name, "prefix": token.prefix},
    )  # fmt: skip
    return token, secret


@transaction.atomic
def api_token_revoke(*, user: Any, token: ApiToken) -> ApiToken:
    """Revoke `token` (idempotent). Only its owner revokes it."""
    locked = ApiToken.objects.select_for_update().get(pk=token.pk)
    if locked.user_id != user.pk:
        raise ValidationError("Only the token's owner can revoke it.")
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(
            actor=user, team=locked.team, action="api_token.revoke", target=locked,
            before={"revoked": False}, after={"revoked": True},
        )  # fmt: skip
    return locked


def api_token_authenticate(secret: str) -> ApiToken | None:
    """The active token for `secret` whose user is still an active member of its team."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    token = (
        ApiToken.objects.select_related("user", "team")
        .filter(digest=token_digest(secret), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None or not Membership.objects.filter(user=token.user, team=token.team).exists():
        return None
    now = timezone.now()
    # Touch at most once a minute: a busy script must not turn every read into a write.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def _admin_count(team: Team) -> int:
    return Membership.objects.filter(team=team, role=Role.ADMIN).count()


@transaction.atomic
def team_create(*, actor: Any, name: str, slug: str) -> Team:
    """A team with `actor` as its first admin."""
    team = Team.objects.create(name=name, slug=slug)
    Membership.objects.create(user=actor, team=team, role=Role.ADMIN)
    audit_record(
        actor=actor, team=team, action="team.create", target=team, before=None,
        after={"name": name, "slug": slug},
    )  # fmt: skip
    return team


@transaction.atomic
def membership_add(*, actor: Any, team: Team, username: str, role: str) -> Membership:
    """Add the user called `username` to `team` with `role`."""
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    user = get_user_model().objects.filter(username=username.strip()).first()
    if user is None:
        raise ValidationError({"username": f"There is no user called {username.strip()!r}."})
    if Membership.objects.filter(team=team, user=user).exists():
        raise ValidationError({"username": f"{user.username} is already a member of {team}."})
    membership = Membership.objects.create(team=team, user=user, role=role)
    audit_record(
        actor=actor, team=team, action="membership.add", target=membership, before=None,
        after={"user": user.username, "role": role},
    )  # fmt: skip
    return membership


@transaction.atomic
def membership_change_role(*, actor: Any, membership: Membership, role: str) -> Membership:
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    # Lock the team's admin rows so two admins demoting each other at once cannot both succeed.
    list(Membership.objects.select_for_update().filter(team=membership.team, role=Role.ADMIN))
    locked = Membership.objects.select_for_update().select_related("user").get(pk=membership.pk)
    before = locked.role
    if before == role:
        return locked
    if before == Role.ADMIN and _admin_count(locked.team) <= 1:
        raise ValidationError("A team needs at least one admin: make someone else admin first.")
    locked.role = role
    locked.save(update_fields=["role"])
    audit_record(
        actor=actor, team=locked.team, action="membership.change_role", target=locked,
        before={"user": locked.user.username, "role": before},
        after={"user": locked.user.username, "role": role},
    )  # fmt: skip
    return locked


@transaction.atomic
def membership_remove(*, actor: Any, membership: Membership) -> None:
    list(Membership.objects.select_for_update().filter(team=membership.team, role=Role.ADMIN))
    locked = Membership.objects.select_for_update().select_related("user").get(pk=membership.pk)
    if locked.role == Role.ADMIN and _admin_count(locked.team) <= 1:
        raise ValidationError("A team needs at least one admin: make someone else admin first.")
    audit_record(
        actor=actor, team=locked.team, action="membership.remove", target=locked,
        before={"user": locked.user.username, "role": locked.role}, after=None,
    )  # fmt: skip
    locked.delete()
