"""How a run reaches a driver: a Celery worker, or this process ("inline").

Either way the hand-over happens only after the current transaction commits
(``transaction.on_commit``), so a run started inside a transaction that rolls back is
never driven — and was never written. A lost Celery message costs at most one recovery
interval: beat recovery re-enqueues every unfinished run whose lease is free.

So a broker that cannot be reached never fails what already committed: ``send_to_celery``
logs a warning and leaves the run to recovery, and a caller that wants to say so (the
webhook's answer, the admin's message) collects such hand-overs with ``deferred()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.db import transaction

from ..conf import get_settings

log = logging.getLogger("durable_agents.dispatch")


@dataclass(frozen=True)
class Deferred:
    """A run committed for a driver whose Celery message could not be sent: recovery hands
    it over on its next pass (``RECOVERY_INTERVAL``)."""

    run_id: str
    error: Exception

    def __str__(self) -> str:
        return (
            f"run {self.run_id} is recorded, but the broker could not be reached to hand it "
            f"to a worker ({type(self.error).__name__}: {self.error}); beat recovery hands it "
            f"over within {get_settings().recovery_interval:g} seconds"
        )


_watching: ContextVar[list[Deferred] | None] = ContextVar("durable_agents_deferred", default=None)


@contextmanager
def deferred() -> Iterator[list[Deferred]]:
    """The hand-overs the broker refused while this block ran (inner blocks see their own).
    One made after the block — a transaction that commits later — is only logged."""
    found: list[Deferred] = []
    token = _watching.set(found)
    try:
        yield found
    finally:
        _watching.reset(token)


def enqueue(run_id: str) -> None:
    """Hand ``run_id`` to a driver once the current transaction commits."""
    settings = get_settings()
    if settings.dispatch == "celery":
        transaction.on_commit(lambda: send_to_celery(run_id), using=settings.database)
    else:
        transaction.on_commit(lambda: drive_inline(run_id), using=settings.database)


def send_to_celery(run_id: str) -> None:
    from ..otel import handover_headers
    from .site_app import task
    from .tasks import DRIVE_RUN

    settings = get_settings()
    # With telemetry on, the worker's drive links to the span that handed the run over.
    headers = handover_headers()
    try:
        drive_run = task(DRIVE_RUN)  # the site's app, from any thread
        if headers:
            drive_run.apply_async(args=[run_id], queue=settings.celery_queue, headers=headers)
        else:
            drive_run.apply_async(args=[run_id], queue=settings.celery_queue)
    except Exception as exc:
        # The run is committed: whatever stopped the message (the broker down, a network
        # error, a full queue), recovery sends it again. Raising here would turn a success
        # the caller already made durable into an error it would retry.
        late = Deferred(run_id, exc)
        log.warning("%s", late, extra={"run_id": run_id})
        watching = _watching.get()
        if watching is not None:
            watching.append(late)


def drive_inline(run_id: str) -> None:
    from ..engine.commands.runs import drive_quietly

    outcome = drive_quietly(run_id)
    log.debug("run %s driven inline: %s", run_id, outcome)
