"""Recovery: find unfinished runs nobody is driving and hand them to a driver again.

A pass lists, through the partial index of unfinished runs, the runs that are queued,
running (their driver died: the lease is expired or gone) or failed with a retryable error
and retries left — skipping runs paused on a person (approval, halt, input) — and
re-enqueues them. Its cost depends on the unfinished runs, not on how many have finished.
"""

from __future__ import annotations

import logging

from .conf import get_settings
from .engine import runtime
from .engine.ports import FAILED, QUEUED, RUNNING

log = logging.getLogger("durable_agents.recovery")

RECOVERABLE = (QUEUED, RUNNING, FAILED)


def recover(*, batch: int = 500) -> list[str]:
    """One recovery pass; returns the run ids it handed to a driver."""
    settings = get_settings()
    store = runtime.store()
    sent: list[str] = []
    after: str | None = None
    while True:
        runs = store.list_unfinished(
            limit=batch, after=after, statuses=RECOVERABLE, lease_free=True
        )
        for run in runs:
            if run.status == FAILED:
                error = run.last_error or {}
                if not error.get("retryable") or run.attempts >= settings.retry.max_attempts:
                    continue  # it would fail the same way: a person must look at it
            runtime.dispatch(run.run_id)
            sent.append(run.run_id)
        if len(runs) < batch:
            break
        after = runs[-1].run_id
    if sent:
        log.info("recovery re-enqueued %d run(s)", len(sent))
    return sent
