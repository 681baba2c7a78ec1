from __future__ import annotations

from django.db import models


class WorkerSighting(models.Model):
    """A Celery worker that answered the status probe at least once.

    Kept so that a worker which stops answering shows as down (with when it was last seen)
    instead of silently vanishing from the page."""

    name = models.CharField(max_length=200, unique=True)  # celery's node name, e.g. control@host
    queues = models.JSONField(default=list)
    celery_version = models.CharField(max_length=50, blank=True)
    python_version = models.CharField(max_length=50, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
