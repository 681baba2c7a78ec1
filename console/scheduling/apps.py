from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "console.scheduling"
    label = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"
