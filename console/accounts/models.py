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
