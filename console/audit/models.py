from __future__ import annotations

from django.conf import settings
from django.db import models

from console.accounts.models import Team
from console.audit.diff import FieldChange, field_changes


class AuditEntry(models.Model):
    """One write: who did what to which object of which team, when, with the state before and
    after. Rows are only ever inserted; the target is stored by type, id and label (not a
    foreign key) so the entry survives the object's deletion."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="audit_entries")
    # SET_NULL keeps the history when an account is deleted; actor_name keeps who it was.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=100)
    target_id = models.CharField(max_length=64)
    target_label = models.CharField(max_length=300)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["team", "-at"], name="audit_team_at"),
            models.Index(fields=["team", "action"], name="audit_team_action"),
            models.Index(fields=["team", "target_type", "target_id"], name="audit_team_target"),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target_label}"

    @property
    def changes(self) -> list[FieldChange]:
        """Only the fields this write changed (see console.audit.diff), for the log's page."""
        return field_changes(self.before, self.after)
