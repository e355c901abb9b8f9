"""Carrying out an expiry the journal holds (``commands.deadlines``): its request marked
``expired``, then what its deadline's ``on_expiry`` asks of the run. Whoever meets the
expiry first finishes it — the sweep that wrote it, the next sweep, a person's decision that
came too late — so each of its writes is conditional on what it changes."""

from __future__ import annotations

import logging
from typing import Any

from .. import deadlines, events, failpoints, lifecycle, names
from ..errors import Conflict, RunBusy
from ..identity import Actor
from ..journal import Journal
from ..ports import (
    APPROVAL_EXPIRED,
    AWAITING_APPROVAL,
    TERMINAL_STATUSES,
    ApprovalRequestInfo,
    RunInfo,
    Store,
)
from ..records import Record
from .runs import cancel

log = logging.getLogger("durable_agents.deadlines")

# Who the action log names for the cancel an expiry asks for: the deadline, not a user.
ACTOR = Actor(id="", username=deadlines.BY, channel=deadlines.BY)

_EVENTS = {
    deadlines.REMIND: events.APPROVAL_REMINDED,
    deadlines.ESCALATE: events.APPROVAL_ESCALATED,
    deadlines.EXPIRE: events.APPROVAL_EXPIRED,
}


def finish_expiry(
    store: Store,
    run_id: str,
    call_id: str,
    decision: Record,
    *,
    by: str,
    announce: bool = False,
) -> bool:
    """Bring the rows in step with an expiry the journal holds (``decision``): its request
    ``expired``, then what ``on_expiry`` asks of the run — queued for a driver (``deny``,
    ``halt``: the drive tells the model, or halts) or cancelled as the deadline (``cancel``).
    Idempotent; True if the run was queued (hand it to a driver). ``announce``: this caller
    wrote the expiry, so it tells the host (once the request says expired)."""
    marked = lifecycle.move_request(
        store,
        run_id,
        call_id,
        APPROVAL_EXPIRED,
        by,
        if_arguments=decision.get("arguments"),
        if_asked_again=decision.name != names.decision(call_id, None),
        # Only the request about the definition of its tool it names (an MCP server's): a
        # worker under a newer one may have asked again, about the same arguments, meanwhile.
        if_tool_digest=decision.get("tool_digest") or None,
    )
    if marked:
        failpoints.hit(f"after-expiry:{call_id}")
    run = store.get_run(run_id)
    if run is None:
        return False
    if announce:
        request = store.get_approval_request(run_id, call_id)
        if request is not None:
            announce_step(store, run, request, deadlines.EXPIRE, decision)
    journal = Journal(store)
    if run.status in TERMINAL_STATUSES or journal.get(run_id, names.tool(call_id)) is not None:
        return False  # the run ended, or the call was settled: nothing left to carry out
    if decision.get("on_expiry") == deadlines.ON_EXPIRY_CANCEL:
        _cancel(store, run_id, call_id)
        return False
    return lifecycle.hand_over(store, run_id, by, only_from=AWAITING_APPROVAL)


def _cancel(store: Store, run_id: str, call_id: str) -> None:
    try:
        cancel(
            run_id,
            by=ACTOR,
            reason=f"nobody decided call {call_id!r} in time: its approval request expired",
            store=store,
        )
    except RunBusy:
        # A driver holds the run: it meets the expiry before the call and cancels the run
        # itself; failing that, the next sweep cancels it (``finish_stopped_expiries``).
        log.info("run %s is busy; its expiry's cancel is left to its driver", run_id)
    except Conflict:
        pass  # it finished, or a person cancelled it meanwhile: nothing to cancel


def announce_step(
    store: Store, run: RunInfo, request: ApprovalRequestInfo, step: str, record: Record
) -> None:
    """Tell the host a deadline step happened (``events``), with the details signals.py
    documents: only the process whose write made the step true calls it."""
    # As it stands after the step: the step's record holds it (an escalation's, merged).
    policy = dict(record.get("policy") or request.policy)
    details: dict[str, Any] = {
        "run_id": run.run_id,
        "agent": run.agent,
        "call_id": request.call_id,
        "tool": request.tool_name,
        "arguments": request.arguments,
        "policy": policy,
        "step": step,
        "rule": policy.get("rule"),
    }
    if step == deadlines.EXPIRE:
        details["on_expiry"] = record.get("on_expiry") or deadlines.ON_EXPIRY_DENY
    events.announce(store, _EVENTS[step], **details)
