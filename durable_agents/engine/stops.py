"""A stop reaches the whole tree: a run's cancel or its saga's abort holds for every run below.

``run:cancelled`` and ``saga:abort`` in a run are recorded before anything below it is
touched: they are the intent for its whole subtree. Each run below obeys the nearest of
them above it, recording its own stop under its own lease — ``run:cancelled`` (cause
``run.ancestor_cancelled``: it is cancelled plainly, its effects stay) or ``saga:abort``
(cause ``saga.parent_aborted``: it rolls back what it did) — whoever touches it next:

* the canceller, at once, for a run nobody drives (``commands.runs.cancel``);
* the run's own driver, when its drive begins and before each step (a model call, a
  claimed call before it runs, a new approval request): a sub-run busy when its root was
  cancelled finishes the call in flight, then stops;
* a decision, an answer, a signal or a message for the run: refused, and the run handed to
  a driver, which stops it;
* recovery (a queued, running or compensating run) and the sweep (a paused one, throttled
  included), which hand it to a driver.

So a cancel that dies after its own record leaves no run below it that can go on: nothing
new starts under a cancelled or aborted root. A rollback already under way in a run goes on
whatever is above it (undoing is never stopped half-way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import lifecycle, names, runtime, tree
from .approvals import withdraw_pending
from .errors import RunBusy
from .imported import foreign_sub_run
from .journal import Journal
from .leases import HeldLease
from .ports import (
    CANCELLED,
    COMPENSATED,
    FINISHED,
    NOT_IMPORTED,
    RunInfo,
    Store,
)
from .records import decode

CANCEL = "cancel"
ABORT = "abort"
ANCESTOR_CANCELLED = "run.ancestor_cancelled"
STOP_NAMES = (names.RUN_CANCELLED, names.SAGA_ABORT)
PARENT_ABORTED = "saga.parent_aborted"


@dataclass(frozen=True)
class Stop:
    """The nearest stopped ancestor of a run: ``run_id``, and how it stopped (``kind``:
    cancelled, or its saga aborted) with its record's body."""

    kind: str
    run_id: str
    body: dict[str, Any]

    @property
    def code(self) -> str:
        return ANCESTOR_CANCELLED if self.kind == CANCEL else PARENT_ABORTED

    def describe(self) -> str:
        said = "was cancelled" if self.kind == CANCEL else "aborted its saga"
        by = self.body.get("by")
        return f"its ancestor {self.run_id!r} {said}" + (f" by {by}" if by else "")


class TreeStopped(Exception):
    """Raised inside a drive that found its tree stopped before a step: the driver records
    the run's own stop (``Driver._obey``). Never leaves the drive."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.describe())
        self.stop = stop


def ancestors(store: Store, parent: str | None) -> list[str]:
    """``parent`` and the runs above it, nearest first (a row read per level)."""
    chain: list[str] = []
    current = parent
    while current and current not in chain and len(chain) <= runtime.subagent_depth():
        row = store.get_run(current)
        if row is None:
            break
        chain.append(current)
        current = row.parent_run_id
    return chain


def stop_above(store: Store, parent: str | None, chain: list[str] | None = None) -> Stop | None:
    """The nearest of ``parent`` and its ancestors (``chain``, if the caller read it) that
    was cancelled (``run:cancelled``) or whose saga aborted (``saga:abort``), or None. The
    records are looked for in one read (``Store.find``): a stop recorded before it is seen,
    wherever it is in the tree."""
    chain = ancestors(store, parent) if chain is None else chain
    if not chain:
        return None
    found = {(e.run_id, e.name): e for e in store.find(chain, STOP_NAMES)}
    for run_id in chain:
        for name, kind in ((names.RUN_CANCELLED, CANCEL), (names.SAGA_ABORT, ABORT)):
            entry = found.get((run_id, name))
            if entry is not None:
                return Stop(kind, run_id, dict(decode(entry.data)))
    return None


def unrecorded_stop(store: Store, run_id: str, parent: str | None) -> Stop | None:
    """The stop above run ``run_id`` that it has not recorded a stop of its own for yet
    (its drive must), or None: nothing stopped above it, or it obeyed already (a run rolling
    back, or halted in its rollback, is its own rollback's, or a person's, from then on).
    One read of the records, besides the rows."""
    chain = ancestors(store, parent)
    if not chain:
        return None
    found = store.find([run_id, *chain], STOP_NAMES)
    if any(e.run_id == run_id for e in found):
        return None
    return stop_above(store, parent, chain) if found else None


def cancelled_body(stop: Stop) -> dict[str, Any]:
    """A run's own ``run:cancelled`` under a cancelled ancestor."""
    reason = str(stop.body.get("reason") or "")
    return names.cancelled_body(
        stop.body.get("by"),
        stop.body.get("by_id"),
        f"{stop.describe()}" + (f": {reason}" if reason else ""),
        cause={"code": ANCESTOR_CANCELLED, "run_id": stop.run_id},
    )


def abort_body(stop_run_id: str, message: Any) -> dict[str, Any]:
    """A run's own ``saga:abort`` under an ancestor whose saga aborted (``stop_run_id``)."""
    return names.abort_body(
        {
            "code": PARENT_ABORTED,
            "message": f"its parent run {stop_run_id!r} aborted: {message}",
            "parent": stop_run_id,
        }
    )


def abort_message(stop: Stop) -> Any:
    return (stop.body.get("cause") or {}).get("message")


def close_cancelled(store: Store, run_id: str, fence: str | None = None) -> None:
    """Bring a cancelled run's rows in step with its ``run:cancelled`` record: the run
    cancelled, its open approval requests withdrawn and its open halts orphaned. Idempotent,
    so a cancel that stopped half-way is finished by the next one, or by a drive."""
    lifecycle.move(store, run_id, CANCELLED, lifecycle.DRIVER, fence=fence)
    withdraw_pending(store, run_id)
    store.orphan_halts(run_id)


def stop_now(store: Store, run_id: str, stop: Stop) -> bool:
    """Record run ``run_id``'s own stop now, as ``stop`` asks, under its lease: ``RunBusy``
    while a driver holds it (that driver obeys the stop before its next step). A run that
    finished meanwhile, or already stopped the other way (a rollback goes on; a plain
    cancel keeps its effects), is left as it is. True if this call recorded it."""
    journal = Journal(store)
    with HeldLease(store, run_id, runtime.lease_ttl()) as lease:
        if journal.get(run_id, names.RUN_COMPLETE) is not None:
            return False
        if stop.kind == CANCEL:
            if journal.get(run_id, names.SAGA_ABORT) is not None:
                return False
            _, inserted = lifecycle.record_in(
                journal,
                run_id,
                names.RUN_CANCELLED,
                cancelled_body(stop),
                lifecycle.DRIVER,
                fence=lease.token,
            )
            close_cancelled(store, run_id, lease.token)
            return inserted
        if journal.get(run_id, names.RUN_CANCELLED) is not None:
            return False
        body = abort_body(stop.run_id, abort_message(stop))
        _, inserted = lifecycle.record_in(
            journal, run_id, names.SAGA_ABORT, body, lifecycle.DRIVER, fence=lease.token
        )
    withdraw_pending(store, run_id)
    return inserted


def stop_below(store: Store, run_id: str) -> list[str]:
    """Stop now, depth first, every unfinished run below ``run_id`` (which stopped) that
    nobody drives, each as the nearest stopped run above it asks; return the ones being
    driven right now, which stop themselves before their next step. An aborted run's
    rollback drives the rollbacks of the runs below it; a cancelled one's stay cancelled."""
    busy: list[str] = []
    stop = stop_above(store, run_id)
    if stop is None:
        return busy
    here: RunInfo | None = None
    for child in tree.children_of(store, run_id):
        row = store.get_run(child)
        # A fork's reference to its source's sub-run is the source's, never the fork's; an
        # import at a sub-run's id is nobody's (it names the run its parent if it likes).
        if row is None or row.parent_run_id != run_id:
            continue
        if row.imported:
            here = here or store.get_run(run_id)
            if foreign_sub_run(row, here.imported if here is not None else NOT_IMPORTED):
                continue
        if row.status in (FINISHED, CANCELLED, COMPENSATED):
            continue
        try:
            stop_now(store, child, stop)
        except RunBusy:
            busy.append(child)
            continue
        busy += stop_below(store, child)
    return busy
