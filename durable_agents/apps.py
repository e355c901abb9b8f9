from django.apps import AppConfig


class DurableAgentsConfig(AppConfig):
    name = "durable_agents"
    verbose_name = "Durable agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
