"""Celery tasks, thin on purpose: they call engine commands.

* ``drive_run(run_id)`` drives a run under its lease (``acks_late``: a message comes back if
  the worker process dies). It answers in ``drive_quietly``'s words (``finished``,
  ``paused``, ``busy``, ``lease_lost``, ``stopped``, ``failed``). ``RunBusy`` is not a
  failure: another driver has the run. A
  retryable failure (provider 5xx, rate limit, database blip) is retried with backoff; a
  non-retryable one leaves the run ``failed`` with its error.
* ``recover_runs()`` is one recovery pass, for Celery beat.
* ``prune()`` runs the prune ``RETENTION`` describes (docs/retention.md), for Celery beat;
  nothing when it is unset.
* ``wake_timers()`` hands over paused runs whose timer or signal deadline is due, for Celery
  beat. A sleeping run also gets a ``drive_run`` with an ETA at its wake time; the sweep
  covers that message being lost.
* ``deliver_notifications()`` is one pass of the notification outbox (docs/notifications.md),
  for Celery beat and sent after a fact commits; nothing when ``NOTIFY`` has no channels.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import shared_task
from django.db import close_old_connections

from ..conf import get_settings
from ..engine.commands import runs
from ..engine.errors import DurableAgentsError, Pause
from ..otel import HEADER, handed_over
from .site_app import task

log = logging.getLogger("durable_agents.tasks")


DRIVE_RUN = "durable_agents.tasks.drive_run"


@shared_task(  # type: ignore[untyped-decorator]
    name=DRIVE_RUN,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def drive_run(self: Any, run_id: str) -> str:
    close_old_connections()
    try:
        with handed_over(_header(self.request, HEADER)):
            runs.resume(run_id)
        return runs.FINISHED_OUTCOME
    except (Pause, DurableAgentsError) as exc:
        # The words are ``drive_quietly``'s: a pause, a busy run, a lost lease or a shutdown
        # is an outcome (recovery covers a run another driver had, if that driver dies).
        said = runs.outcome(exc)
        if isinstance(exc, Pause) and exc.details.get("wake_ms") is not None:
            _drive_at(run_id, exc.details["wake_ms"])
        if said is not None:
            return said
        assert isinstance(exc, DurableAgentsError)
        if not exc.retryable:
            log.warning("run %s failed: %s", run_id, exc)
            return runs.FAILED_OUTCOME
        policy = get_settings().retry
        run = runs.get_run(run_id)
        if run.attempts >= policy.max_attempts:
            log.warning("run %s failed %d times in a row: %s", run_id, run.attempts, exc)
            return runs.FAILED_OUTCOME
        raise self.retry(countdown=policy.delay(run.attempts), max_retries=None) from exc
    finally:
        close_old_connections()


def _header(request: Any, name: str) -> str | None:
    """A custom header of the message (Celery puts them on the request; some versions
    nest them under ``headers``)."""
    value = request.get(name) or (getattr(request, "headers", None) or {}).get(name)
    return str(value) if value else None


# Timers further off than this get no ETA message: the sweep wakes them. A worker holds an
# ETA message unacknowledged until it is due, and the Redis transport hands an unacknowledged
# message out again after its visibility timeout (an hour by default), so a days-long ETA
# would pile up copies in the workers' memory.
ETA_HORIZON = 600.0


def _drive_at(run_id: str, wake_ms: int) -> None:
    """Hand the run over again at its wake time. Sent only by the driver that paused it;
    an early or duplicate message just finds it still sleeping (or busy)."""
    eta = datetime.fromtimestamp(int(wake_ms) / 1000, tz=UTC)
    if (eta - datetime.now(UTC)).total_seconds() > ETA_HORIZON:
        return
    task(DRIVE_RUN).apply_async(args=[run_id], queue=get_settings().celery_queue, eta=eta)


@shared_task(name="durable_agents.tasks.wake_timers", ignore_result=True)  # type: ignore[untyped-decorator]
def wake_timers() -> int:
    from ..engine.commands.timers import wake_timers as sweep

    close_old_connections()
    try:
        return len(sweep())
    finally:
        close_old_connections()


@shared_task(name="durable_agents.tasks.recover_runs", ignore_result=True)  # type: ignore[untyped-decorator]
def recover_runs() -> int:
    from ..engine.commands.recovery import recover

    close_old_connections()
    try:
        return len(recover())
    finally:
        close_old_connections()


@shared_task(name="durable_agents.tasks.prune", ignore_result=True)  # type: ignore[untyped-decorator]
def prune() -> int:
    from datetime import timedelta

    from django.utils import timezone

    from ..database.retention import prune as run_prune

    retention = get_settings().retention
    if retention is None:
        return 0
    close_old_connections()
    try:
        report = run_prune(
            finished_before=timezone.now() - timedelta(days=retention.finished_for),
            by=retention.by,
            export_dir=retention.export_dir,
            batch=retention.batch,
        )
        if report.kept:
            log.info("prune kept %d finished tree(s)", len(report.kept))
        return len(report.pruned)
    finally:
        close_old_connections()


@shared_task(name="durable_agents.tasks.deliver_notifications", ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_notifications() -> int:
    from ..notifications import deliver

    close_old_connections()
    try:
        done = deliver()
        if done.failed:
            log.warning("%d notification(s) given up this pass (see the admin)", done.failed)
        return done.sent
    finally:
        close_old_connections()
