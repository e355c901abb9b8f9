"""The steps of pending requests' deadlines (``da.Deadline``; docs/approvals.md
"Deadlines"), taken by the timer sweep (``commands.timers.wake_timers``) on the database's
clock.

Each step is journaled once, ``deadline:<call>:<step>`` (first writer wins), then projected:

* ``remind``: nothing changes but the request's ``due_at``; ``approval_reminded`` tells its
  approvers again;
* ``escalate``: the request's policy gains ``escalated_to`` (its members may decide too:
  ``approvals.deciding_groups``; ``need`` never drops);
* ``expire``: an automatic denial under the decision's own name (``approval:<call>``,
  ``by: "deadline"``, ``expired: true``), first writer wins against a person's decision; the
  request ``expired``; then ``on_expiry``: ``deny`` hands the run to a driver, whose model
  reads that the request expired; ``halt`` hands it over too, and the drive halts on the
  call for a person to record its result (``resolve_halt``); ``cancel`` cancels the run with
  the engine's cancel command, as the deadline.

A decision journaled before the expiry wins: the expiry is then a no-op (the decision is
finished as the person's next try would). A person deciding after the expiry is refused
(``approval.expired``). A step that stops half-way (a crash anywhere) is finished by the
next sweep — the request stays due until its step is projected, and a run left awaiting
approval with its expiry journaled is handed over by the sweep's pass over paused runs
(``finish_stopped_expiries``) — exactly once: each write is conditional on what it changes.

Announced once per step (``events``), by the process whose write made it true: the step's
record, or for an expiry the expiry's denial. A process that dies before announcing loses
the signal, not the fact (the notification outbox's reconciling pass reads the record).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import deadlines, failpoints, lifecycle, names, runtime
from ..approvals import arguments_tag, decision_name
from ..journal import Journal, now_ms
from ..ports import (
    AWAITING_APPROVAL,
    TERMINAL_STATUSES,
    ApprovalRequestInfo,
    RunInfo,
    Store,
)
from ..records import Record
from .approvals import finish_decision
from .expiry import announce_step, finish_expiry

log = logging.getLogger("durable_agents.deadlines")


def sweep(store: Store, *, batch: int = 500) -> list[str]:
    """Take the deadline steps due: one indexed read of at most ``batch`` requests
    (``Store.list_due_approval_requests``), then a few reads and writes per due request.
    Returns the runs it handed to a driver."""
    due = store.list_due_approval_requests(limit=batch)
    if not due:
        return []
    # Read after the rows: every row the store found due is due by this clock too.
    now = store.now()
    journal = Journal(store)
    woken: list[str] = []
    for request in due:
        try:
            if _step(store, journal, request, now):
                runtime.dispatch(request.run_id)
                woken.append(request.run_id)
        except Exception:  # one request's failure must not hold up the others' steps
            log.exception(
                "could not take the deadline step of call %s in run %s; the next sweep will",
                request.call_id,
                request.run_id,
            )
    return woken


def _step(store: Store, journal: Journal, request: ApprovalRequestInfo, now: Any) -> bool:
    """The step due for ``request``; True if its run was queued (hand it over)."""
    run = store.get_run(request.run_id)
    args = request.arguments
    if (
        run is None
        or run.inert
        or run.status in TERMINAL_STATUSES
        or journal.get(run.run_id, names.RUN_CANCELLED) is not None
        or journal.get(run.run_id, names.SAGA_ABORT) is not None
    ):
        # Evidence, or a run that ended or stopped: nothing of it will be decided again.
        # Its clock stops (the request leaves the due index); the stop closes the request
        # (``timers._finish_stopped_cancels``, a saga's rollback).
        store.advance_deadline(request.run_id, request.call_id, next_after=None, if_arguments=args)
        return False
    again = request.previous_arguments is not None
    standing = journal.get(
        run.run_id,
        decision_name(request.call_id, args, again=again, tool_digest=request.tool_digest),
    )
    if standing is not None:
        # Decided (or expired) before this step: its maker stopped before the rows caught
        # up. Finish it as its maker's next try would; no step is taken after a decision,
        # so the clock stops whatever the rows say.
        queued = finish_decision(store, run.run_id, request.call_id, standing, by=lifecycle.SWEEP)
        store.advance_deadline(run.run_id, request.call_id, next_after=None, if_arguments=args)
        return queued
    policy = dict(request.policy)
    asked = request.created_at or now
    step = deadlines.due(policy, asked, now)
    if step is None:
        # Not due by the policy it holds now (an edit moved it since its due time was set):
        # due again at its next step.
        later = [a for _, a in deadlines.steps(policy) if (asked - now).total_seconds() + a > 0]
        store.advance_deadline(
            run.run_id, request.call_id, next_after=later[0] if later else None, if_arguments=args
        )
        return False
    tag = arguments_tag(args, request.tool_digest) if again else None
    name = names.deadline(request.call_id, step, tag)
    if step == deadlines.EXPIRE:
        return _expire(store, journal, run, request, name, policy)
    merge: dict[str, Any] = {}
    if step == deadlines.ESCALATE:
        merge["escalated_to"] = str(deadlines.of(policy).get("escalate_to") or "")
    after = {**policy, **merge}
    record, inserted = journal.write(
        run.run_id,
        name,
        {
            "kind": "deadline",
            "step": step,
            "call_id": request.call_id,
            "tool": request.tool_name,
            "rule": policy.get("rule"),
            "policy": after,
            **merge,
            "arguments": args,
            "at": now_ms(),
        },
    )
    failpoints.hit(f"after-deadline:{request.call_id}:{step}")
    store.advance_deadline(
        run.run_id,
        request.call_id,
        next_after=deadlines.after_step(policy, step),
        merge=merge or None,
        if_arguments=args,
    )
    if inserted:
        announce_step(store, run, request, step, record)
    return False


def _expire(
    store: Store,
    journal: Journal,
    run: RunInfo,
    request: ApprovalRequestInfo,
    name: str,
    policy: dict[str, Any],
) -> bool:
    on_expiry = deadlines.on_expiry(policy)
    journal.write(
        run.run_id,
        name,
        {
            "kind": "deadline",
            "step": deadlines.EXPIRE,
            "call_id": request.call_id,
            "tool": request.tool_name,
            "rule": policy.get("rule"),
            "policy": policy,
            "on_expiry": on_expiry,
            "arguments": request.arguments,
            "at": now_ms(),
        },
    )
    failpoints.hit(f"after-deadline:{request.call_id}:{deadlines.EXPIRE}")
    again = request.previous_arguments is not None
    decision, inserted = journal.write(
        run.run_id,
        decision_name(
            request.call_id, request.arguments, again=again, tool_digest=request.tool_digest
        ),
        {
            "kind": "approval",
            "approved": False,
            "by": deadlines.BY,
            "expired": True,
            "on_expiry": on_expiry,
            "call_id": request.call_id,
            "rule": policy.get("rule"),
            "note": deadlines.expiry_note(policy),
            "arguments": request.arguments,
            **({"tool_digest": request.tool_digest} if request.tool_digest else {}),
            "at": now_ms(),
        },
    )
    if not deadlines.is_expiry(decision):
        # A person's decision was journaled first: it stands, and this expiry is a no-op.
        return finish_decision(store, run.run_id, request.call_id, decision, by=lifecycle.SWEEP)
    failpoints.hit(f"after-expiry-decision:{request.call_id}")
    return finish_expiry(
        store, run.run_id, request.call_id, decision, by=lifecycle.SWEEP, announce=inserted
    )


def unfinished_expiries(run: RunInfo, records: list[Record]) -> list[Record]:
    """The expiries journaled in a run awaiting approval for calls that have no result:
    each stopped after its record (its process died, or the run was busy when it asked for
    a cancel). The sweep finishes them, and reads the run again until it has."""
    if run.status != AWAITING_APPROVAL:
        return []
    settled = {rec.name for rec in records if rec.name.startswith(names.TOOL)}
    return [
        rec
        for rec in records
        if rec.name.startswith(names.APPROVAL)
        and deadlines.is_expiry(rec)
        and rec.get("call_id")
        and names.tool(str(rec.get("call_id"))) not in settled
    ]


def finish_stopped_expiries(store: Store, run: RunInfo, records: list[Record]) -> bool:
    """Finish the expiries ``unfinished_expiries`` finds, as the next expiry would; True
    if the run was queued."""
    queued = False
    for rec in unfinished_expiries(run, records):
        call_id = str(rec.get("call_id"))
        queued = finish_expiry(store, run.run_id, call_id, rec, by=lifecycle.SWEEP) or queued
    return queued
