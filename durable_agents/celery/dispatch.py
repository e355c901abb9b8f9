"""How a run reaches a driver: a Celery worker, or this process ("inline").

Either way the hand-over happens only after the current transaction commits
(``transaction.on_commit``), so a run started inside a transaction that rolls back is
never driven — and was never written. A lost Celery message costs at most one recovery
interval: beat recovery re-enqueues every unfinished run whose lease is free.
"""

from __future__ import annotations

import logging

from django.db import transaction

from ..conf import get_settings

log = logging.getLogger("durable_agents.dispatch")


def enqueue(run_id: str) -> None:
    """Hand ``run_id`` to a driver once the current transaction commits."""
    settings = get_settings()
    if settings.dispatch == "celery":
        transaction.on_commit(lambda: send_to_celery(run_id), using=settings.database)
    else:
        transaction.on_commit(lambda: drive_inline(run_id), using=settings.database)


def send_to_celery(run_id: str) -> None:
    from ..telemetry import handover_headers
    from .tasks import drive_run

    settings = get_settings()
    # With telemetry on, the worker's drive links to the span that handed the run over.
    headers = handover_headers()
    if headers:
        drive_run.apply_async(args=[run_id], queue=settings.celery_queue, headers=headers)
    else:
        drive_run.apply_async(args=[run_id], queue=settings.celery_queue)


def drive_inline(run_id: str) -> None:
    from ..engine.commands.runs import drive_quietly

    outcome = drive_quietly(run_id)
    log.debug("run %s driven inline: %s", run_id, outcome)
