"""The Celery beat entries durable_agents needs, built from your ``DURABLE_AGENTS`` dict.

In ``settings.py``, after ``DURABLE_AGENTS``::

    from durable_agents.celery.schedule import beat_schedule

    CELERY_BEAT_SCHEDULE = {**beat_schedule(DURABLE_AGENTS)}

The entries send to ``CELERY_QUEUE``: recovery every ``RECOVERY_INTERVAL`` seconds, the
timer sweep every ``TIMER_SWEEP_INTERVAL`` seconds, when ``RETENTION`` is set the prune
every ``RETENTION["EVERY"]`` seconds (docs/retention.md), and when ``NOTIFY`` has channels
the notification outbox's delivery pass every ``NOTIFY["INTERVAL"]`` seconds
(docs/notifications.md), so the schedule
cannot drift from the settings the workers use. (Django settings are not configured yet
while ``settings.py`` runs, so the dict is passed in rather than read.)
"""

from __future__ import annotations

from typing import Any

from ..conf import parse
from ..engine.errors import ConfigError

RECOVER_TASK = "durable_agents.tasks.recover_runs"
WAKE_TASK = "durable_agents.tasks.wake_timers"
PRUNE_TASK = "durable_agents.tasks.prune"
NOTIFY_TASK = "durable_agents.tasks.deliver_notifications"


def beat_schedule(durable_agents: Any = None) -> dict[str, dict[str, Any]]:
    """Celery beat entries for ``durable_agents`` (your ``DURABLE_AGENTS`` dict).

    ``ConfigError`` naming every problem if the dict is invalid (the system check would
    refuse it too)."""
    settings, problems = parse(durable_agents)
    if problems:
        raise ConfigError(
            "invalid DURABLE_AGENTS setting: " + "; ".join(problems), code="config.settings"
        )
    interval = settings.recovery_interval
    entries: dict[str, dict[str, Any]] = {
        "durable-agents-recover": {
            "task": RECOVER_TASK,
            "schedule": interval,
            # A pass that waited longer than the interval is superseded by the next one.
            "options": {"queue": settings.celery_queue, "expires": interval},
        },
        # A lost ETA message delays a timer's wake by at most one sweep.
        "durable-agents-wake-timers": {
            "task": WAKE_TASK,
            "schedule": settings.timer_sweep_interval,
            "options": {
                "queue": settings.celery_queue,
                "expires": settings.timer_sweep_interval,
            },
        },
    }
    retention = settings.retention
    if retention is not None:
        # Off unless RETENTION is set. A prune that waited longer than its interval is
        # superseded by the next; two that overlap skip each other's rows.
        entries["durable-agents-prune"] = {
            "task": PRUNE_TASK,
            "schedule": retention.every,
            "options": {"queue": settings.celery_queue, "expires": retention.every},
        }
    notify = settings.notify
    if notify.channels:
        # Reconciles, then sends what is due. A pass that waited longer than the interval
        # is superseded by the next; two that overlap claim different rows.
        entries["durable-agents-notify"] = {
            "task": NOTIFY_TASK,
            "schedule": notify.interval,
            "options": {"queue": settings.celery_queue, "expires": notify.interval},
        }
    return entries
