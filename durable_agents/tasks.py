"""Where Celery's autodiscovery looks for an app's tasks (``<app>.tasks``).

The tasks live in ``durable_agents.celery.tasks``; their names are ``durable_agents.tasks.*``
whatever module holds them, so a message queued by an older release is still understood.
"""

from .celery.tasks import deliver_notifications, drive_run, prune, recover_runs, wake_timers

__all__ = ["deliver_notifications", "drive_run", "prune", "recover_runs", "wake_timers"]
