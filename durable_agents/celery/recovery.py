"""Recovery for Django sites: one pass of ``durable_agents.engine.commands.recovery.recover`` on the
configured store, with the ``RETRY`` policy of the settings (the app wires both into the
engine's runtime). Celery beat runs it (``durable_agents.tasks.recover_runs``); cron users run
``manage.py durable_agents recover``; it is also ``durable_agents.recover()``.
"""

from __future__ import annotations

from ..engine.commands.recovery import RECOVERABLE
from ..engine.commands.recovery import recover as _recover

__all__ = ["RECOVERABLE", "recover"]


def recover(*, batch: int = 500, interval: float | None = None) -> list[str]:
    """One recovery pass; returns the run ids it handed to a driver. A run handed over less
    than ``interval`` seconds ago (``RECOVERY_INTERVAL`` by default) is not sent again."""
    return _recover(batch=batch, interval=interval)
