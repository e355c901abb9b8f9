from django.apps import AppConfig


class DurableAgentsConfig(AppConfig):
    name = "durable_agents"
    verbose_name = "Durable agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # checks registers the system checks; audit, the SQL function SQLite's journal
        # trigger calls (on every new connection).
        from . import checks, signals  # noqa: F401
        from .agent_loader import load_agents
        from .celery import worker_start
        from .celery.dispatch import enqueue
        from .celery.shutdown import shutting_down
        from .conf import get_settings
        from .database import audit  # noqa: F401
        from .database.events import events
        from .database.store import site_store
        from .engine import runtime
        from .notifications import outbox
        from .people import approver_keys, eligible_approvers, resolve_actor

        runtime.configure(
            store_factory=site_store,
            agent_loader=load_agents,
            lease_ttl=lambda: get_settings().lease_ttl,
            on_drift=lambda: get_settings().on_drift,
            dispatcher=enqueue,
            should_stop=shutting_down,
            eligible_approvers=eligible_approvers,
            approver_keys=approver_keys,
            resolve_actor=resolve_actor,
            halt_min_age=lambda: get_settings().effective_halt_min_age,
            retry_policy=lambda: get_settings().retry,
            recovery_interval=lambda: get_settings().recovery_interval,
            subagent_depth=lambda: get_settings().subagent_depth,
            model_rates=lambda: get_settings().model_rates,
            events=events,
        )
        # The notification outbox's receivers; they do nothing unless NOTIFY has channels.
        outbox.connect()
        # A Celery worker with a bad AGENTS setting exits before it consumes a message.
        worker_start.connect()
        _enable_telemetry()


def _enable_telemetry() -> None:
    """Spans and metrics when ``TELEMETRY`` is on (read once, here: turning it on or off
    takes a restart). Otherwise nothing of OpenTelemetry is imported. An invalid setting is
    left to the system check (``durable_agents.E001``)."""
    from django.conf import settings as django_settings

    from .conf import parse

    settings, problems = parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if settings.telemetry and not problems:
        from .otel import enable

        enable()
