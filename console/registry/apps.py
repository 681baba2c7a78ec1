from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "console.registry"
    label = "registry"
