"""A durable tree's bookkeeping, below the loop: which runs a run started (``child:<call>``
records), handing a paused parent over when its child ends, and whether a child a parent
paused on has ended. ``subagents`` (above the loop) starts and drives the children."""

from __future__ import annotations

from typing import Any

from . import names, runtime
from .journal import Journal
from .model import Usage
from .ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    COMPENSATED,
    HALTED,
    QUEUED,
    SLEEPING,
    Store,
)


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The derived id of the child run a parent's call starts."""
    return f"{parent_run_id}/{call_id}"


def subtree_totals(store: Store, children: list[str]) -> tuple[Usage, Usage]:
    """What ``children`` and their own descendants used and spent: a finished child's
    totals from its ``run:complete`` (which rolls up its own children), an unfinished one's
    from its row (as far as it got)."""
    journal = Journal(store)
    usage, spend = Usage(), Usage()
    for child in children:
        complete = journal.get(child, names.RUN_COMPLETE)
        if complete is not None:
            used, spent = complete.get("usage"), complete.get("spend")
        else:
            run = store.get_run(child)
            if run is None:
                continue
            used, spent = run.usage, run.spend
        usage = usage + Usage.from_json(dict(used or {}))
        spend = spend + Usage.from_json(dict(spent or used or {}))
    return usage, spend


# The statuses a parent pauses in while a child is unfinished (its child's pause, mirrored).
PARENT_PAUSE_STATUSES = (AWAITING_APPROVAL, AWAITING_INPUT, SLEEPING, HALTED)


def queue_parent(store: Store, start: Any) -> str | None:
    """Queue a paused parent before its child records its end; return the parent's id if
    it was queued (the caller dispatches it once the end is recorded). A process dying
    between the two leaves a queued parent, which recovery hands over: the parent drives the
    child to its end itself. A parent being driven right now is left alone; its driver looks
    at its children again after it pauses (``children_done``)."""
    parent = start.get("parent") if start is not None else None
    if not parent:
        return None
    moved = store.update_run(
        str(parent),
        {"status": QUEUED, "attempts": 0, "last_error": None},
        if_status=list(PARENT_PAUSE_STATUSES),
    )
    return str(parent) if moved else None


def hand_over_parent(store: Store, start: Any) -> None:
    """A child that finished (or failed for good, or was cancelled) hands its parent over,
    if the parent is paused: queued first (if the hand-over is lost, recovery picks a queued
    run up), then to a driver. A parent being driven right now is left alone; its driver
    looks at its children again after it pauses (``children_done``)."""
    parent = start.get("parent") if start is not None else None
    if not parent:
        return
    moved = store.update_run(
        str(parent),
        {"status": QUEUED, "attempts": 0, "last_error": None},
        if_status=list(PARENT_PAUSE_STATUSES),
    )
    if moved:
        runtime.dispatch(str(parent))


def children_done(store: Store, children: list[str]) -> bool:
    """True if one of ``children`` ended: its parent, which paused on it, goes on."""
    journal = Journal(store)
    for child in children:
        # A finished child that a saga rolls back has ended only once that is over.
        finished = journal.get(child, names.RUN_COMPLETE) is not None
        if finished and journal.get(child, names.SAGA_ABORT) is None:
            return True
        if journal.get(child, names.RUN_COMPENSATED) is not None:
            return True
        run = store.get_run(child)
        if run is not None and run.status in (CANCELLED, COMPENSATED):  # ended, no answer
            return True
    return False


def children_of(store: Store, run_id: str) -> list[str]:
    """The child runs ``run_id``'s calls started, in the order they started."""
    return [
        str(rec.get("run_id"))
        for rec in Journal(store).records(run_id)
        if rec.name.startswith(names.CHILD)
    ]
