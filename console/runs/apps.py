from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "console.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"
