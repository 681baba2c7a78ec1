from django.apps import AppConfig


class StatusConfig(AppConfig):
    name = "console.status"
    label = "status"
