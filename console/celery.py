import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Registers the `console_info` remote-control command the status page asks workers.
import console.status.worker_commands  # noqa: E402, F401
