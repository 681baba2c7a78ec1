from django.contrib import admin

from console.status.models import WorkerSighting


@admin.register(WorkerSighting)
class WorkerSightingAdmin(admin.ModelAdmin):
    """Deleting a retired worker here removes it from the status page."""

    list_display = ("name", "queues", "celery_version", "last_seen_at", "first_seen_at")
    readonly_fields = ("name", "queues", "celery_version", "python_version", "first_seen_at")
