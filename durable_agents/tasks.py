"""Celery tasks, thin on purpose: they call engine commands.

* ``drive_run(run_id)`` drives a run under its lease (``acks_late``: a message comes back if
  the worker process dies). ``RunBusy`` is not a failure: another driver has the run. A
  retryable failure (provider 5xx, rate limit, database blip) is retried with backoff; a
  non-retryable one leaves the run ``failed`` with its error.
* ``recover_runs()`` is one recovery pass, for Celery beat.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import close_old_connections

from .conf import get_settings
from .engine import commands
from .engine.errors import DriveStopped, DurableAgentsError, LeaseLost, Pause, RunBusy

log = logging.getLogger("durable_agents.tasks")


@shared_task(  # type: ignore[untyped-decorator]
    name="durable_agents.tasks.drive_run",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def drive_run(self: Any, run_id: str) -> str:
    close_old_connections()
    try:
        commands.resume(run_id)
        return "finished"
    except Pause:
        return "paused"
    except (RunBusy, LeaseLost):
        return "busy"  # another driver has it; recovery covers it if that driver dies
    except DriveStopped:
        return "stopped"  # shutting down; recovery hands it to another worker
    except DurableAgentsError as exc:
        if not exc.retryable:
            log.warning("run %s failed: %s", run_id, exc)
            return "failed"
        policy = get_settings().retry
        run = commands.get_run(run_id)
        if run.attempts >= policy.max_attempts:
            log.warning("run %s failed %d times in a row: %s", run_id, run.attempts, exc)
            return "failed"
        raise self.retry(countdown=policy.delay(run.attempts), max_retries=None) from exc
    finally:
        close_old_connections()


@shared_task(name="durable_agents.tasks.recover_runs", ignore_result=True)  # type: ignore[untyped-decorator]
def recover_runs() -> int:
    from .recovery import recover

    close_old_connections()
    try:
        return len(recover())
    finally:
        close_old_connections()
