"""Approvals: tool calls waiting for a decision, and deciding them.

Deciding calls ``durable_agents.approve``: 1-of-1 gates are decided by the first decision,
quorum gates count each eligible approver once. A decision that completes the gate is
journaled and hands the run back to a driver.

Two ways to decide, one rule for both (``engine.approvals.check_may_decide``: one active
user holding ``approve_toolcall``, a member of the quorum's group where there is one):

* as the caller (``POST /runs/{run_id}/approvals/{call_id}``): the decision is the caller's.
* for an external approver (``.../signed``): a caller who may read approvals relays it; the
  authority is the signature, by a key registered to ``approver`` (``ApproverKey``), over
  the format-2 decision bytes (this start of the run, the call, tool, arguments, approver,
  verdict and note). The history row names the approver, and the relay in its channel.

Either may be a deputy's decision for an approver who is away (``for_approver``,
``engine.delegation``); a signed one binds that approver. The list shows who decided for
whom (``deputy``) and, for approvers yet to decide, the deputy who may decide for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from ninja import Router

from ..database import reads
from ..engine.approvals import (
    NOT_SHOWN,
    ApprovalOutcome,
    arguments_digest,
    deciding_groups,
    resolve_approver,
    tally,
)
from ..engine.commands.approvals import approve
from ..engine.ports import IMPORTED_INERT, DecisionInfo, DelegationInfo
from ..engine.views import Start
from ..models import ApprovalRequest
from ..people import eligible_approvers
from ..rule_state import RuleState, rule_state
from .auth import check, require
from .schemas import (
    ERRORS,
    ApprovalOut,
    ApprovalPage,
    ApprovalStatus,
    Cursor,
    DeadlineOut,
    DecideIn,
    DecisionOut,
    DecisionResult,
    Limit,
    MovedOut,
    Offset,
    Progress,
    RuleOut,
    SignedDecisionIn,
    checked_call_id,
    checked_run_id,
    page,
)

router = Router(tags=["approvals"])


def approval_rows(rows: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
    """``rows`` as ``approvals_out`` reads them: with their decisions, and the database's
    clock (deadlines are counted on it) in the same query."""
    return rows.prefetch_related("decisions").annotate(db_now=Now())


def _groups(row: ApprovalRequest) -> tuple[str, ...]:
    return deciding_groups(row.policy or {})


def approvals_out(rows: Sequence[ApprovalRequest]) -> list[ApprovalOut]:
    """Requests with their decisions prefetched, and progress: one query per deciding group
    on the page (for who is eligible), none per request."""
    groups = sorted({g for row in rows for g in _groups(row)})
    eligible = {group: eligible_approvers(group) for group in groups}
    # Each run's current start (which incarnation the request belongs to), in one query.
    starts = reads.starts(r.run_id for r in rows)
    members = {u for users in eligible.values() for u in users}
    # One read of the delegations in force for the page's approvers (none without groups).
    deputies = reads.delegations_in_force(members)
    return [approval_out(row, eligible, starts, deputies) for row in rows]


def approval_out(
    row: ApprovalRequest,
    eligible: Mapping[str, Sequence[str]],
    starts: Mapping[str, Start],
    delegations: Sequence[DelegationInfo] = (),
) -> ApprovalOut:
    decisions = list(row.decisions.all())
    infos = [
        DecisionInfo(
            row.run_id,
            row.call_id,
            d.approver,
            d.approved,
            d.note,
            d.signature,
            d.created_at,
            d.arguments,
            deputy=d.deputy,
        )
        for d in decisions
    ]
    groups = _groups(row)
    if groups:
        members = [u for g in groups for u in eligible.get(g, ())]
        count = tally(row.policy, infos, list(dict.fromkeys(members)))
        progress = Progress(
            need=count.need,
            approved_by=list(count.approved_by),
            denied_by=list(count.denied_by),
            eligible=list(count.eligible),
            pending=list(count.pending),
            deputies={
                d.approver: d.deputy
                for d in delegations
                if d.approver in count.pending and d.covers(row.tool_name, groups)
            },
        )
    else:
        count = tally({"need": 1}, infos, [d.approver for d in decisions])
        progress = Progress(
            need=1,
            approved_by=list(count.approved_by),
            denied_by=list(count.denied_by),
            eligible=None,
            pending=None,
        )
    start = starts.get(row.run_id)
    rule, deadline = _rule(rule_state(row))
    return ApprovalOut(
        incarnation=start.incarnation if start is not None and start.seq == row.start_seq else None,
        arguments_sha256=arguments_digest(row.arguments).hex(),
        run_id=row.run_id,
        call_id=row.call_id,
        tool_name=row.tool_name,
        arguments=row.arguments,
        previous_arguments=row.previous_arguments,
        tool_digest=row.tool_digest,
        policy=row.policy or {},
        status=row.status,
        created_at=row.created_at,
        decided_at=row.decided_at,
        due_at=row.due_at,
        progress=progress,
        decisions=[
            DecisionOut(
                approver=d.approver,
                approved=d.approved,
                note=d.note,
                signed=bool(d.signature),
                created_at=d.created_at,
                arguments=d.arguments,
                deputy=d.deputy,
            )
            for d in decisions
        ],
        rule=rule,
        deadline=deadline,
    )


def _rule(state: RuleState) -> tuple[RuleOut | None, DeadlineOut | None]:
    """The request's rule and deadline as the API gives them (``rule_state``: the card's
    reading)."""
    rule = None
    if state.rule is not None:
        rule = RuleOut(
            name=state.rule,
            explain=state.explain,
            need=state.need,
            groups=list(state.groups),
            requester=state.requester,
            requester_may_decide=not state.separate,
            moved_by_edit=MovedOut(from_rule=state.moved_from, arguments=state.moved_arguments)
            if state.moved
            else None,
            text=state.text,
        )
    d = state.deadline
    deadline = (
        DeadlineOut(
            remind_at=d.remind_at,
            escalate_at=d.escalate_at,
            escalate_to=d.escalate_to,
            expire_at=d.expire_at,
            on_expiry=d.on_expiry,
            escalated_to=d.escalated_to,
            next_step=d.next_step,
            next_at=d.next_at,
            text=d.text,
        )
        if d is not None
        else None
    )
    return rule, deadline


@router.get("/approvals", response={200: ApprovalPage, **ERRORS})
def list_approvals(
    request: HttpRequest,
    status: ApprovalStatus = "pending",
    run_id: str | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
    cursor: Cursor | None = None,
    count: bool = True,
) -> ApprovalPage:
    """Tool calls awaiting a decision, newest first (``status`` to see decided ones), each
    with its decisions and quorum progress (needs ``view_approvalrequest`` or
    ``approve_toolcall``)."""
    check(request, "view_approvals")
    rows = approval_rows(ApprovalRequest.objects.order_by("-created_at", "-id"))
    if status != "all":
        rows = rows.filter(status=status)
    if run_id is not None:
        rows = rows.filter(run_id=checked_run_id(run_id))
    else:  # an inert import's requests are evidence, read by its run id, never work
        rows = rows.exclude(run__imported=IMPORTED_INERT)
    got = page(rows, limit, offset, cursor=cursor, count=count, name="approvals")
    items = got.items
    return ApprovalPage(
        count=got.count,
        limit=limit,
        offset=offset,
        next_cursor=got.next_cursor,
        items=approvals_out(items),
    )


def _result(outcome: ApprovalOutcome) -> DecisionResult:
    return DecisionResult(
        run_id=outcome.run_id, call_id=outcome.call_id, status=outcome.status, tally=outcome.tally
    )


# Registered before the plain decision: run ids may contain "/", so the more specific path
# must be tried first.
@router.post(
    "/runs/{path:run_id}/approvals/{call_id}/signed", response={200: DecisionResult, **ERRORS}
)
def decide_signed(
    request: HttpRequest, run_id: str, call_id: str, payload: SignedDecisionIn
) -> DecisionResult:
    """Relay an external approver's signed decision (the relay needs
    ``view_approvalrequest`` or ``approve_toolcall``). The signature must verify, by a key
    registered to ``approver``, over exactly this start of the run, call, tool, arguments,
    verdict and note (400 ``approval.bad_signature``, or ``approval.signature_format`` for
    the retired format 1; nothing recorded); the approver must be an active user who may
    decide (403 ``approval.not_eligible``). A deputy's decision names the approver it is for
    (``for_approver``), and its signature is the deputy's over bytes binding them."""
    relay = require(request, "relay")
    run_id, call_id = checked_run_id(run_id), checked_call_id(call_id)
    approver = resolve_approver(payload.approver).via(
        f"signature via {relay.username} ({relay.channel})"
    )
    return _result(
        approve(
            run_id,
            call_id,
            payload.approved,
            approver,
            payload.note,
            signature=payload.signature,
            edit=payload.edit,
            for_approver=payload.for_approver,
        )
    )


@router.post("/runs/{path:run_id}/approvals/{call_id}", response={200: DecisionResult, **ERRORS})
def decide(request: HttpRequest, run_id: str, call_id: str, payload: DecideIn) -> DecisionResult:
    """Approve or deny a tool call as the caller (needs ``approve_toolcall``).

    1-of-1: the first decision stands; the same decision again is accepted, a different one
    is 409 ``approval.already_decided`` with the standing decision in ``details``. Quorum:
    ``status`` stays ``pending`` until enough eligible approvers agreed (or too few remain).

    Three kinds: approve; deny (``note`` is the message the model reads as the call's
    result); edit and approve (``edit``: the arguments that run instead, validated against
    the tool's schema — 400 ``approval.edit_invalid``, nothing recorded).

    ``for_approver``: decide as their deputy (a delegation in force); without it, a caller
    who may not decide the call but is the deputy of exactly one approver who may decides
    for them, and of several is answered 400 ``approval.for_approver_needed``
    (``details.candidates``).
    """
    by = require(request, "decide")
    run_id, call_id = checked_run_id(run_id), checked_call_id(call_id)
    shown = payload.arguments if payload.arguments is not None else NOT_SHOWN
    return _result(
        approve(
            run_id,
            call_id,
            payload.approved,
            by,
            payload.note,
            edit=payload.edit,
            arguments=shown,
            for_approver=payload.for_approver,
        )
    )
