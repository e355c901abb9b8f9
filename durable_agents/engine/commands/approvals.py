"""The approve command: a person's decision on a gated tool call, counted by the call's
policy (``engine.approvals``), journaled when final, and the run handed back to a driver."""

from __future__ import annotations

from typing import Any

from .. import failpoints, identity, names, runtime
from ..approvals import (
    NOT_SHOWN,
    ApprovalOutcome,
    check_may_decide,
    decision_name,
    incarnation_of,
    resolve_approver,
    tally,
    verify_signature,
)
from ..errors import (
    ApprovalAlreadyDecided,
    ApprovalArgumentsChanged,
    ApprovalError,
    ApprovalNotFound,
    ApprovalOrphaned,
)
from ..identity import Actor
from ..journal import Journal, now_ms
from ..ports import (
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_PENDING,
    APPROVAL_WITHDRAWN,
    AWAITING_APPROVAL,
    NOT_TERMINAL_STATUSES,
    QUEUED,
    TERMINAL_STATUSES,
    ApprovalRequestInfo,
    DecisionInfo,
    Store,
)
from ..records import encode, refuse_nul


def approve(
    run_id: str,
    call_id: str,
    approved: bool,
    by: Any,
    note: str = "",
    *,
    signature: str | None = None,
    arguments: Any = NOT_SHOWN,
    store: Store | None = None,
) -> ApprovalOutcome:
    """Record ``by``'s decision on call ``call_id`` of run ``run_id``.

    ``by`` is a user object, a username or a resolved ``identity.Actor``; it must name one
    active user who may decide (``check_may_decide``). 1-of-1: the first decision wins; a
    second, different one is refused with the standing one. Quorum: each eligible approver
    counts once; the gate passes at ``need`` approvals and fails as soon as it cannot. A
    final decision is journaled and the run handed back to a driver. ``signature`` (base64
    Ed25519 over ``decision_bytes``) is checked against the keys registered to the user.

    ``arguments`` are the arguments the person was shown: if the request asks about others
    by now (a drive under new code asked again meanwhile), the decision is refused
    (``approval.arguments_changed``) and nothing is written — a decision never lands on
    arguments its maker did not see. Pass them whenever a person looked at a page first.

    The journal is the truth: a decision that stopped after its record (a crash before the
    request and the run were updated) is finished by the next decision on the call, and by
    the drive that runs it.
    """
    if not isinstance(approved, bool):
        raise ApprovalError("approved must be True or False")
    if not isinstance(note, str | None):
        raise ApprovalError("note must be a string")
    note = note or ""
    refuse_nul({"note": note}, "the decision")
    store = store or runtime.store()
    journal = Journal(store)
    request = store.get_approval_request(run_id, call_id)
    if request is None:
        raise ApprovalNotFound(f"run {run_id!r} has no call {call_id!r} awaiting approval")
    if arguments is not NOT_SHOWN and encode(arguments) != encode(request.arguments):
        raise ApprovalArgumentsChanged(
            f"call {call_id!r} of run {run_id!r} now asks about other arguments than the ones "
            f"shown: {encode(request.arguments)} (shown: {encode(arguments)}); look at it "
            "again before deciding",
            arguments=request.arguments,
            shown=arguments,
        )
    actor = resolve_approver(by)
    if signature is not None:  # before anything is read as this approver's, or written
        incarnation = incarnation_of(store, run_id)
        verify_signature(request, actor, approved, note, signature, incarnation=incarnation)
    policy = dict(request.policy)
    eligible = (
        list(runtime.eligible_approvers(str(policy["group"])))
        if policy.get("kind") == "quorum"
        else [actor.username]
    )
    check_may_decide(actor, policy, eligible)
    by_name = actor.username
    name = decision_name(call_id, request.arguments, again=request.previous_arguments is not None)
    standing = journal.get(run_id, name) if store.get_run(run_id) is not None else None
    if standing is not None:
        if finish_decision(store, run_id, call_id, standing):
            runtime.dispatch(run_id)
        return _standing(request, standing, approved)
    _refuse_orphans(store, journal, request, actor)
    decision = DecisionInfo(run_id, call_id, by_name, approved, note, signature)
    recorded = store.save_decision(decision)
    if not recorded:
        mine = next(d for d in store.list_decisions(run_id, call_id) if d.approver == by_name)
        if mine.approved != approved:
            raise ApprovalAlreadyDecided(
                f"{by_name!r} already {'approved' if mine.approved else 'denied'} this call; a "
                "decision cannot be changed",
                standing={"approved": mine.approved, "by": by_name},
            )
    decisions = store.list_decisions(run_id, call_id)
    if policy.get("kind") != "quorum":
        decisions = [d for d in decisions if d.approver == by_name]
    count = tally(policy, decisions, eligible)
    if recorded:  # an approver repeating the same decision is not a new action
        store.log_action(
            identity.logged(
                actor,
                "approve" if approved else "deny",
                run_id,
                call_id,
                {"note": note, "signed": signature is not None},
            )
        )
    if not (count.passed or count.unreachable):
        return ApprovalOutcome(run_id, call_id, APPROVAL_PENDING, count.to_json())
    final, inserted = journal.write(
        run_id,
        name,
        {
            "kind": "approval",
            "approved": count.passed,
            "by": by_name,
            "by_id": actor.id,
            "note": note,
            "tally": count.to_json(),
            "at": now_ms(),
            "arguments": request.arguments,
        },
    )
    if not inserted:
        return _standing(request, final, approved)
    failpoints.hit(f"after-decision:{call_id}")
    status = APPROVAL_APPROVED if count.passed else APPROVAL_DENIED
    # Queued, not awaiting approval: if the hand-over below fails (a broker down), recovery
    # picks the run up. Only while the run is unfinished: a cancel that landed since the
    # check above keeps the run cancelled, and the decision is refused as orphaned. The run
    # before the request: a crash between leaves a queued run whose drive finishes the
    # request, never a run awaiting a request nobody is shown any more.
    changes = {"status": QUEUED, "attempts": 0, "last_error": None}
    moved = store.update_run(run_id, changes, if_status=NOT_TERMINAL_STATUSES)
    decided = store.set_approval_status(run_id, call_id, status, if_status=[APPROVAL_PENDING])
    cancelled = not (decided and moved) and (
        store.get_run(run_id) is None or journal.get(run_id, names.RUN_CANCELLED) is not None
    )
    # Otherwise the run or the request had moved on already: another approver's repeated
    # decision, or a drive, carried this decision on from the journal. It stands.
    if cancelled:
        store.set_approval_status(run_id, call_id, APPROVAL_WITHDRAWN)
        why = "the run was cancelled while the decision was being recorded"
        store.log_action(identity.logged(actor, "withdraw", run_id, call_id, {"why": why}))
        raise ApprovalOrphaned(
            f"the approval of call {call_id!r} in run {run_id!r} is orphaned ({why}); "
            "nothing was run"
        )
    if moved:
        runtime.dispatch(run_id)
    return ApprovalOutcome(
        run_id, call_id, APPROVAL_APPROVED if count.passed else APPROVAL_DENIED, count.to_json()
    )


def finish_decision(store: Store, run_id: str, call_id: str, decision: Any) -> bool:
    """Bring the rows in step with a decision the journal holds: a run still awaiting
    approval queued again, then a request still pending marked decided. Idempotent; True
    if the run was queued (hand it to a driver)."""
    run = store.get_run(run_id)
    if run is None or run.status in TERMINAL_STATUSES:
        return False  # a cancel closes its requests itself
    queued = False
    if run.status == AWAITING_APPROVAL:
        queued = store.update_run(
            run_id,
            {"status": QUEUED, "attempts": 0, "last_error": None},
            if_status=[AWAITING_APPROVAL],
        )
    status = APPROVAL_APPROVED if decision.get("approved") else APPROVAL_DENIED
    store.set_approval_status(run_id, call_id, status, if_status=[APPROVAL_PENDING])
    return queued


def _refuse_orphans(
    store: Store, journal: Journal, request: ApprovalRequestInfo, actor: Actor
) -> None:
    run = store.get_run(request.run_id)
    start = journal.get(request.run_id, names.RUN_START) if run is not None else None
    why = None
    if run is None:
        why = "the run was deleted"
    elif request.status == APPROVAL_WITHDRAWN:
        why = "the request was withdrawn"
    elif run.status in TERMINAL_STATUSES:
        why = f"the run is {run.status}"
    elif journal.get(request.run_id, names.RUN_CANCELLED) is not None:
        why = "the run is cancelled"
    elif start is None or start.seq != request.start_seq:
        why = "the run was started again under the same id"
    if why is None:
        return
    if run is not None:
        store.set_approval_status(request.run_id, request.call_id, APPROVAL_WITHDRAWN)
        store.log_action(
            identity.logged(actor, "withdraw", request.run_id, request.call_id, {"why": why})
        )
    raise ApprovalOrphaned(
        f"the approval of call {request.call_id!r} in run {request.run_id!r} is orphaned "
        f"({why}); nothing was run"
    )


def _standing(request: ApprovalRequestInfo, standing: Any, approved: bool) -> ApprovalOutcome:
    was = bool(standing.get("approved"))
    if was != approved:
        raise ApprovalAlreadyDecided(
            f"call {request.call_id!r} of run {request.run_id!r} was already "
            f"{'approved' if was else 'denied'} by {standing.get('by')!r}; the first decision "
            "stands",
            standing={"approved": was, "by": standing.get("by"), "note": standing.get("note")},
        )
    status = APPROVAL_APPROVED if was else APPROVAL_DENIED
    return ApprovalOutcome(request.run_id, request.call_id, status, standing.get("tally") or {})
