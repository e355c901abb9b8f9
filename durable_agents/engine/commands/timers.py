"""Waking runs whose time has come: a timer (``ctx.sleep`` / ``ctx.wait_until``) that is due,
or a signal await whose deadline passed.

A sleeping run is normally woken by the hand-over its pause scheduled for its wake time (a
Celery message with an ETA). That message can be lost (a purged queue, a broker restart), so
a periodic sweep (``wake_timers``) hands over every paused run whose journal says a timed
wait is due. Handing over early is harmless: the wait reads its journaled time and pauses
again without a second record; the sweep only makes sure a wake is late by at most one sweep.
"""

from __future__ import annotations

import logging

from .. import runtime
from ..journal import Journal
from ..ports import AWAITING_INPUT, QUEUED, SLEEPING, Store
from ..waits import next_wake

log = logging.getLogger("durable_agents.timers")

TIMED_STATUSES = (SLEEPING, AWAITING_INPUT)


def wake_timers(*, store: Store | None = None, batch: int = 500) -> list[str]:
    """One sweep; returns the run ids it handed to a driver. The cost is one journal read per
    paused run (sleeping or awaiting input)."""
    store = store or runtime.store()
    journal = Journal(store)
    now = store.now()
    woken: list[str] = []
    after: str | None = None
    while True:
        runs = store.list_unfinished(limit=batch, after=after, statuses=TIMED_STATUSES)
        for run in runs:
            due = next_wake(journal.records(run.run_id))
            if due is None or now < due:
                continue
            # Queued first (only from the status it was seen in): if the hand-over is lost,
            # recovery picks a queued run up.
            if store.update_run(
                run.run_id,
                {"status": QUEUED, "attempts": 0, "last_error": None},
                if_status=[run.status],
            ):
                runtime.dispatch(run.run_id)
                woken.append(run.run_id)
        if len(runs) < batch:
            break
        after = runs[-1].run_id
    if woken:
        log.info("woke %d run(s) whose timer or deadline was due", len(woken))
    return woken
