"""Sagas across a tree of sub-agents: how an aborted saga rolls back a sub-run it started.

A saga's call of a sub-agent (``agent.as_tool()``) is undone by rolling the child run back
in the child's own journal, under the child's own lease, with the rules of any saga's
rollback (``sagas``): the abort is journaled in the child first (``saga:abort``, cause
``saga.parent_aborted``), then each of its completed compensable calls is undone, latest
first, each at most once behind its attempt marker, its own sub-runs recursively, and the
child ends ``compensated``. A finished child is rolled back too (its ``run:complete`` stays;
the ``saga:abort`` after it says the run was undone); an unfinished one (paused, or failed
for good) stops going forward and rolls back.

The parent records the child's rollback as the call's undo (``compensate:<call>``: the
sub-run and what it undid). Rolling a child back is retry-safe, so the parent takes no
attempt marker for it: driven again, the child's rollback goes on from its own journal and
a finished one answers from its ``run:compensated``. A child whose rollback halts (an
unknown outcome) or is driven elsewhere pauses the parent (``ChildPending``): the tree's
pause, as on the forward path; the child's end hands the parent over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import failpoints, lifecycle, names, runtime, sagas, stops
from .approvals import withdraw_pending
from .errors import ChildPending, Pause, ProtocolError, RunBusy, SagaAborted
from .imported import foreign_sub_run
from .journal import Journal
from .leases import HeldLease
from .loop import drive
from .ports import AWAITING_INPUT, NOT_IMPORTED, Store

if TYPE_CHECKING:
    from .definition import AgentDefinition


def abort_subrun(store: Store, child_id: str, parent_run_id: str, cause: dict[str, Any]) -> bool:
    """Journal the abort of sub-run ``child_id`` because its parent's saga aborted (under the
    child's lease: ``RunBusy`` while a driver holds it) and withdraw its pending approval
    requests. True if this call wrote the abort (False: it was there already)."""
    body = stops.abort_body(parent_run_id, cause.get("message"))
    with HeldLease(store, child_id, runtime.lease_ttl()) as lease:
        _, inserted = lifecycle.record_in(
            Journal(store), child_id, names.SAGA_ABORT, body, lifecycle.DRIVER, fence=lease.token
        )
    withdraw_pending(store, child_id)
    return inserted


def rollback_child(
    agent: AgentDefinition,
    store: Store,
    parent_run_id: str,
    child_id: str,
    cause: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    """Roll sub-run ``child_id`` back to its end; return the parent's undo outcome for the
    call and whether it is an error (the child's undos failed, or it was cancelled plainly
    with effects left). Raise ``ChildPending`` when the child cannot end now."""
    journal = Journal(store)
    outcome: dict[str, Any] = {"sub_run": child_id, "undone": [], "failed": []}
    row = store.get_run(child_id)
    if row is None:
        return outcome, False  # the parent journaled the child, then stopped: never run
    parent = store.get_run(parent_run_id) if row.imported else None
    if row.imported and foreign_sub_run(row, parent.imported if parent else NOT_IMPORTED):
        # An import at the child's id (the parent journaled the child, then died before its
        # row): none of it ran here, so there is nothing of the parent's to undo.
        return {**outcome, "imported": True}, False
    if not sagas.has_undos(agent) and journal.get(child_id, names.RUN_COMPLETE) is not None:
        # Rolled back only to stop it going on (``sagas._calls``), and it ended on its own
        # before its parent recorded the call's outcome: nothing to stop, nothing to undo.
        return outcome, False
    done = journal.get(child_id, names.RUN_COMPENSATED)
    if done is None and journal.get(child_id, names.RUN_CANCELLED) is not None:
        # Cancelled plainly (by a person, before): its effects stay; a person finishes them.
        left = sagas.effects_in(store, agent, child_id)
        if not left:
            return outcome, False
        return {
            **outcome,
            "failed": left,
            "error": f"sub-run {child_id!r} was cancelled without compensation; the "
            f"effects of its call(s) {', '.join(left)} stay: undo them by hand",
        }, True
    if done is None:
        try:
            abort_subrun(store, child_id, parent_run_id, cause)
            failpoints.hit(f"after-subrun-abort:{child_id}")
            drive(agent, child_id, None, store=store, derived_id=True)
        except SagaAborted:
            pass  # its rollback ended: ``run:compensated`` says how
        except Pause as pause:
            raise ChildPending(
                f"run {parent_run_id!r} waits for the rollback of its sub-run {child_id!r}: "
                f"{pause.message}",
                run_id=parent_run_id,
                child_run_id=child_id,
                child_status=pause.status,
                cause=type(pause).__name__,
                child_details={
                    **{k: v for k, v in pause.details.items() if k in ("calls", "halts")},
                    "paused_run_id": pause.details.get("paused_run_id") or child_id,
                },
            ) from None
        except RunBusy:
            raise ChildPending(
                f"run {parent_run_id!r} waits for the rollback of its sub-run {child_id!r}, "
                "which is being driven elsewhere",
                run_id=parent_run_id,
                child_run_id=child_id,
                child_status=AWAITING_INPUT,
                cause="busy",
            ) from None
        done = journal.get(child_id, names.RUN_COMPENSATED)
        if done is None:  # a rollback ends only in ``run:compensated`` or a pause
            raise ProtocolError(f"sub-run {child_id!r} was rolled back but did not end")
    failed = list(done.get("failed") or ())
    outcome.update(undone=list(done.get("undone") or ()), failed=failed)
    return outcome, bool(failed)
