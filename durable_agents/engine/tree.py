"""A durable tree's bookkeeping, below the loop: which runs a run started (``child:<call>``
records), handing a paused parent over when its child ends, and whether a child a parent
paused on has ended. ``subagents`` (above the loop) starts and drives the children."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import lifecycle, names, runtime
from .errors import ConfigError
from .imported import foreign_sub_run
from .journal import Journal
from .model import Usage
from .ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    COMPENSATED,
    FAILED,
    HALTED,
    NOT_IMPORTED,
    SLEEPING,
    RunInfo,
    Store,
)
from .transcript import RunState


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The derived id of the child run a parent's call starts."""
    return f"{parent_run_id}/{call_id}"


def subtree_totals(
    store: Store, children: list[str], imported: str = NOT_IMPORTED
) -> tuple[Usage, Usage]:
    """What ``children`` and their own descendants used and spent: a finished child's
    totals from its ``run:complete`` (which rolls up its own children); an unfinished one's
    (paused, failed, being driven) from its journal and, the same way, its own children's:
    its row's totals date from its last turn, before what its children spent since. An
    import at a child's id counts nothing: none of it ran for the parent (whose
    ``RunInfo.imported`` is ``imported``), whatever its file says it spent."""
    journal = Journal(store)
    usage, spend = Usage(), Usage()
    for child in children:
        row = store.get_run(child)
        if foreign_sub_run(row, imported):
            continue
        complete = journal.get(child, names.RUN_COMPLETE)
        if complete is not None:
            used = Usage.from_json(dict(complete.get("usage") or {}))
            spent = complete.get("spend")
            usage = usage + used
            spend = spend + (Usage.from_json(dict(spent)) if spent else used)
            continue
        state = RunState.of(journal.records(child))
        below = subtree_totals(
            store, list(state.children.values()), row.imported if row else NOT_IMPORTED
        )
        usage = usage + state.usage() + below[0]
        spend = spend + state.spend() + below[1]
    return usage, spend


# The statuses a parent pauses in while a child is unfinished (its child's pause, mirrored;
# a throttled child's parent awaits input). Every paused status is ``lifecycle.PAUSED``.
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
    moved = lifecycle.hand_over(store, str(parent), lifecycle.SUB_RUN)
    return str(parent) if moved else None


def failed_for_good(run: RunInfo | None) -> bool:
    """Whether ``run`` failed and nothing will retry it: an error no retry fixes, or a
    retryable one with no attempt left (recovery gave up, or will not try again)."""
    if run is None or run.status != FAILED:
        return False
    error = run.last_error or {}
    return not error.get("retryable") or run.attempts >= runtime.retry_policy().max_attempts


def ended_without_answer(run: RunInfo | None) -> bool:
    """Whether ``run`` ended for good with no answer: cancelled, compensated, or failed for
    good. Its parent's call has its outcome: an error."""
    return run is not None and (run.status in (CANCELLED, COMPENSATED) or failed_for_good(run))


def hand_over_parent(store: Store, start: Any) -> None:
    """A child that ended (finished, failed for good, cancelled, compensated) hands its
    parent over, if the parent is paused: queued first (if the hand-over is lost, recovery
    picks a queued run up), then to a driver. A parent being driven right now is left
    alone; its driver looks at its children again after it pauses (``children_done``)."""
    parent = start.get("parent") if start is not None else None
    if not parent:
        return
    if lifecycle.hand_over(store, str(parent), lifecycle.SUB_RUN):
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
        if ended_without_answer(store.get_run(child)):
            return True
    return False


def ended_at(store: Store, child: str, *, rollback: bool = False) -> datetime | None:
    """When sub-run ``child`` ended for a parent paused on it (by the store's clock), or
    None if it has not: going forward, as ``children_done`` judges; ``rollback``: when its
    rollback ended (or it was cancelled)."""
    journal = Journal(store)
    ends = [names.RUN_COMPENSATED, names.RUN_CANCELLED]
    if not rollback and journal.get(child, names.SAGA_ABORT) is None:
        ends.append(names.RUN_COMPLETE)
    times = [rec.created_at for name in ends if (rec := journal.get(child, name)) is not None]
    if not times and not rollback:
        run = store.get_run(child)
        if run is not None and ended_without_answer(run):
            # (A failure's time is its row's last change: when it failed, or when recovery
            # gave up on it.)
            times.append(run.finished_at or run.updated_at)
    known = [t for t in times if t is not None]
    return min(known) if known else None  # (a store keeping no times: not judged)


def rollback_may_go_on(store: Store, child: str) -> bool:
    """True if a parent paused on the rollback of sub-run ``child`` may go on: the rollback
    ended (``run:compensated``), the child was cancelled, or nobody drives it and nothing
    but its parent will (its abort could not be journaled while another driver held it, or
    its rollback was left mid-way). A child whose rollback pauses on a person or a wait
    hands its parent over when it ends."""
    journal = Journal(store)
    if journal.get(child, names.RUN_COMPENSATED) is not None:
        return True
    if journal.get(child, names.RUN_CANCELLED) is not None:
        return True
    lease = store.get_lease(child)
    if lease is not None and lease.live:
        return False
    if journal.get(child, names.SAGA_ABORT) is None:
        return True
    run = store.get_run(child)
    # (Throttled too: its retry drives it, and its end hands the parent over.)
    return run is not None and run.status not in lifecycle.PAUSED


def children_of(store: Store, run_id: str) -> list[str]:
    """The child runs ``run_id``'s calls started, in the order they started."""
    return [
        str(rec.get("run_id"))
        for rec in Journal(store).records(run_id)
        if rec.name.startswith(names.CHILD)
    ]


def runs_below(store: Store, run_id: str) -> list[str]:
    """Every run below ``run_id`` that is its tree's own: its sub-runs, theirs, and so on,
    parents before their children. A ``child:`` record naming a run that is not this one's
    (a fork's reference to its source's sub-run, an inert import at the id) is left out, as
    is a sub-run whose row is gone."""
    found: list[str] = []
    here = store.get_run(run_id)
    imported = here.imported if here is not None else NOT_IMPORTED
    for child in children_of(store, run_id):
        row = store.get_run(child)
        if row is None or row.parent_run_id != run_id or foreign_sub_run(row, imported):
            continue
        found.append(child)
        found += runs_below(store, child)
    return found


def ancestor_budgets(store: Store, run_id: str, parent: str | None) -> list[tuple[str, int, Usage]]:
    """For each ancestor of a sub-run (from its ``parent`` up) whose agent has a
    ``token_budget``: the ancestor's id, its budget, and what its tree spent *outside* the
    sub-run's own subtree (its own turns and its other children's, and so on up). The
    sub-run may spend the rest. Reads one row per ancestor, and, only up to the highest one
    with a budget, its journal and its other children's totals: a bounded number of reads
    (the tree's depth is), once per drive."""
    from .registry import get_agent  # the registry imports the loop's modules: import late

    chain: list[tuple[str, int | None, str]] = []
    current = parent
    while current and len(chain) <= runtime.subagent_depth():
        row = store.get_run(current)
        if row is None:
            break
        try:
            budget = get_agent(row.agent).token_budget
        except ConfigError:  # an agent no longer loaded: its budget is unknown here
            budget = None
        chain.append((current, budget, row.imported))
        current = row.parent_run_id
    while chain and chain[-1][1] is None:
        chain.pop()
    out: list[tuple[str, int, Usage]] = []
    outside = Usage()
    below = run_id  # the ancestor's child on the way down to the sub-run
    journal = Journal(store)
    for ancestor, budget, imported in chain:
        state = RunState.of(journal.records(ancestor))
        others = [c for c in state.children.values() if c != below]
        outside = outside + state.spend() + subtree_totals(store, others, imported)[1]
        if budget is not None:
            out.append((ancestor, budget, outside))
        below = ancestor
    return out
