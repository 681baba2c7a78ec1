from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    ANNOTATOR = "annotator", "Annotator"
    RESEARCHER = "researcher", "Researcher"
    ADMIN = "admin", "Admin"


# A higher rank includes everything a lower one may do: admins change the registry too.
ROLE_RANK = {Role.ANNOTATOR: 1, Role.RESEARCHER: 2, Role.ADMIN: 3}


class Team(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.RESEARCHER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} as {self.role}"

    def has_role(self, role: str) -> bool:
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]


class ApiToken(models.Model):
    """A bearer token for the JSON API, acting as `user` within `team`.

    Only a SHA-256 digest of the secret is stored; the secret is shown once, when created.
    The token works only while the user is still a member of the team (checked per request),
    so removing someone from a team also disables their tokens for it."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters of the secret, shown in lists so users can tell tokens apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class LoginFailure(models.Model):
    """One failed password check, kept for the throttle window (console.accounts.throttle).

    Stored in PostgreSQL rather than a per-process cache so that every web process sees the
    same count, and a restart does not reset it."""

    username = models.CharField(max_length=150)
    address = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["username", "at"], name="login_failure_by_username"),
            models.Index(fields=["address", "at"], name="login_failure_by_address"),
            models.Index(fields=["at"], name="login_failure_by_time"),
        ]

    def __str__(self) -> str:
        return f"{self.username} from {self.address} at {self.at:%Y-%m-%d %H:%M:%S}"
