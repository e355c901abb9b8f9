"""The approve command: a person's decision on a gated tool call, counted by the call's
policy (``engine.approvals``), journaled when final, and the run handed back to a driver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn, overload

from .. import (
    deadlines,
    events,
    failpoints,
    identity,
    lifecycle,
    names,
    registry,
    rules,
    runtime,
    stops,
)
from ..approvals import (
    NOT_SHOWN,
    ApprovalOutcome,
    Tally,
    arguments_tag,
    decision_name,
    eligible_for,
    incarnation_of,
    resolve_approver,
    tally,
    verify_signature,
)
from ..delegation import Deciding, deciding_as, in_force_to, shown
from ..errors import (
    ActorError,
    ApprovalAlreadyDecided,
    ApprovalArgumentsChanged,
    ApprovalArgumentsDisagree,
    ApprovalEditInvalid,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalOrphaned,
    ApproverNotEligible,
    ConfigError,
    ToolArgumentsError,
)
from ..identity import Actor
from ..imported import refuse_inert
from ..journal import Journal, now_ms
from ..ports import (
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_PENDING,
    APPROVAL_WITHDRAWN,
    AWAITING_APPROVAL,
    QUEUED,
    TERMINAL_STATUSES,
    ApprovalRequestInfo,
    DecisionInfo,
    Store,
    asked_again,
)
from ..records import Record, encode, refuse_nul
from ..rules import Outcome
from .expiry import finish_expiry


def approve(
    run_id: str,
    call_id: str,
    approved: bool,
    by: Any,
    note: str = "",
    *,
    signature: str | None = None,
    arguments: Any = NOT_SHOWN,
    edit: Any = None,
    for_approver: Any = None,
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

    ``edit`` (approvals only): the arguments to run instead of the ones asked about. They
    are validated against the tool's schema (``approval.edit_invalid``, nothing written, if
    the schema refuses them or the tool says ``editable=False``), recorded with the
    original and the editor, bound by the signature (``decision_bytes(edited=...)``), and
    are exactly what the call runs with. An edit equal to the arguments asked about is a
    plain approval. In a quorum every approval must approve the same arguments: after an
    approver edits, the others approve with ``edit=`` the same arguments (or deny); an
    approval for other arguments is refused (``approval.arguments_disagree``).

    A denial's ``note`` is the message the model reads as the call's result.

    ``for_approver`` (a user object or a username): decide as their deputy
    (``engine.delegation``): the decision is theirs, made by ``by``, and counts once for
    them. Without it, a person who may not decide the call themselves but is the deputy of
    exactly one approver who may, and has not, decides for that approver; of several, the
    decision is refused (``approval.for_approver_needed``). A signed decision is for
    someone else only when it names them (the signature binds them).

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
    request = _request_as_shown(store, run_id, call_id, arguments)
    if edit is not None:
        edit = _validated_edit(store, request, approved, edit)
    actor = resolve_approver(by)
    principal = _principal(for_approver, actor)
    if signature is not None:  # before anything is read as this approver's, or written
        _verify(store, run_id, request, actor, approved, note, signature, edit, principal)
    policy = dict(request.policy)
    deciding = deciding_as(
        actor,
        request,
        policy,
        for_approver=principal,
        delegations=lambda: in_force_to(store, actor.username),
        voted=lambda: {d.approver for d in store.list_decisions(run_id, call_id)},
        own_only=signature is not None,
    )
    name = decision_name(
        call_id,
        request.arguments,
        again=request.previous_arguments is not None,
        tool_digest=request.tool_digest,
    )
    standing = journal.get(run_id, name) if store.get_run(run_id) is not None else None
    if standing is not None:
        return _finish_standing(
            store, journal, run_id, call_id, request, standing, actor, approved, edit
        )
    return _vote(
        store,
        journal,
        run_id,
        call_id,
        request,
        name,
        actor,
        deciding,
        policy,
        approved,
        note,
        signature,
        edit,
    )


def _request_as_shown(
    store: Store, run_id: str, call_id: str, arguments: Any
) -> ApprovalRequestInfo:
    """The call's open request, refused if it asks about other arguments than were shown."""
    refuse_inert(store.get_run(run_id), "decide a call")
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
    return request


def _verify(
    store: Store,
    run_id: str,
    request: ApprovalRequestInfo,
    actor: Actor,
    approved: bool,
    note: str,
    signature: str,
    edit: Any,
    principal: Actor | None,
) -> None:
    """Check a signed decision against the keys registered to its maker."""
    incarnation = incarnation_of(store, run_id)
    verify_signature(
        request,
        actor,
        approved,
        note,
        signature,
        incarnation=incarnation,
        edited=edit,
        for_approver=principal,
    )


def _finish_standing(
    store: Store,
    journal: Journal,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    standing: Record,
    actor: Actor,
    approved: bool,
    edit: Any,
) -> ApprovalOutcome:
    """A decision the journal holds already: finish moving the rows after it, and answer it."""
    if deadlines.is_expiry(standing):
        _refuse_expired(store, request, standing)
    if request.status == APPROVAL_WITHDRAWN:
        # Journaled, but its maker stopped before moving the run on, and the run ended
        # (cancelled, or its saga aborted) before anyone did: it never takes effect.
        _refuse_orphans(store, journal, request, actor)
    if finish_decision(store, run_id, call_id, standing):
        runtime.dispatch(run_id)
    return _standing(request, standing, approved, edit)


def _vote(
    store: Store,
    journal: Journal,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    name: str,
    actor: Actor,
    deciding: Deciding,
    policy: dict[str, Any],
    approved: bool,
    note: str,
    signature: str | None,
    edit: Any,
) -> ApprovalOutcome:
    """Count a decision on a call no final decision stands for yet; journal it when final."""
    approver, eligible, deputy = deciding.approver, deciding.eligible, deciding.deputy
    by_name = approver.username
    _refuse_orphans(store, journal, request, actor)
    policy, request, eligible = _policy_to_count(
        store, journal, call_id, request, actor, approver, approved, edit, policy, eligible
    )
    # A quorum's votes are counted from the request's rows: one must never land on a request
    # asked again under it (the store checks). A single decision is journaled for exactly
    # the arguments its maker was shown, whatever the row says by then: it stands.
    quorum = policy.get("kind") == "quorum"
    decision = DecisionInfo(
        run_id,
        call_id,
        by_name,
        approved,
        note,
        signature,
        arguments=edit,
        deputy=deputy,
        request=request if quorum else None,
    )
    failpoints.hit(f"before-decision:{call_id}")
    try:
        recorded = store.save_decision(decision)
    except ApprovalOrphaned:
        # The request closed between the checks above and the vote (the store refuses a
        # vote on a closed request, so that no decision counts it): decided by someone
        # else meanwhile, that decision stands; withdrawn or expired, this one is orphaned.
        return _closed_meanwhile(store, journal, run_id, call_id, name, actor, approved, edit)
    failpoints.hit(f"after-vote:{call_id}")
    if not recorded:
        _refuse_other_vote(
            store, run_id, call_id, request, decision, by_name, deputy, approved, edit
        )
    decisions = store.list_decisions(run_id, call_id)
    if policy.get("kind") != "quorum":
        decisions = [d for d in decisions if d.approver == by_name]
    count = tally(policy, decisions, eligible)
    if recorded:  # an approver repeating the same decision is not a new action
        _log_vote(store, actor, run_id, call_id, approved, note, signature, edit, by_name, deputy)
    if not (count.passed or count.unreachable):
        return ApprovalOutcome(run_id, call_id, APPROVAL_PENDING, count.to_json())
    return _decide(
        store,
        journal,
        run_id,
        call_id,
        request,
        name,
        actor,
        deciding,
        policy,
        decisions,
        count,
        recorded,
        approved,
        note,
        edit,
    )


def _policy_to_count(
    store: Store,
    journal: Journal,
    call_id: str,
    request: ApprovalRequestInfo,
    actor: Actor,
    approver: Actor,
    approved: bool,
    edit: Any,
    policy: dict[str, Any],
    eligible: list[str],
) -> tuple[dict[str, Any], ApprovalRequestInfo, list[str]]:
    """Refuse a vote the call's rule does not take; the rule it is counted under."""
    by_name = approver.username
    moved_to = (policy.get("moved_by_edit") or {}).get("arguments")
    if approved and moved_to is not None and encode(edit or request.arguments) != encode(moved_to):
        # An edit moved the call under the rule of its arguments: those are what is decided.
        raise ApprovalArgumentsDisagree(
            f"an edit moved call {call_id!r} under the approval rule of the arguments "
            f"{encode(moved_to)}; approve those (edit=...) or deny",
            approved_arguments=moved_to,
        )
    if policy.get("kind") == "quorum":
        _refuse_second_hand(store, request, actor, by_name)
    if approved and policy.get("kind") == "quorum":
        _refuse_disagreeing(store, request, by_name, edit, eligible)
    if edit is not None:
        # An edit is decided under the rule of the arguments it would run with: a request
        # moves to a stricter rule before this vote is counted, never to a laxer one.
        stricter = _policy_for_edit(store, journal, request, edit, policy)
        if stricter is not None:
            policy, request = stricter, replace(request, policy=stricter)
            eligible = eligible_for(policy, approver)
    return policy, request, eligible


def _refuse_other_vote(
    store: Store,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    decision: DecisionInfo,
    by_name: str,
    deputy: str,
    approved: bool,
    edit: Any,
) -> None:
    """A vote the store did not record: refused unless it repeats the approver's own."""
    mine = next((d for d in store.list_decisions(run_id, call_id) if d.approver == by_name), None)
    if mine is None:
        # Asked again between the two reads, which clears the votes: nothing written.
        current = store.get_approval_request(run_id, call_id)
        raise asked_again(replace(decision, request=request), current)
    if mine.deputy != deputy:
        # The approver's own vote and their deputy's for them are one vote: whoever
        # made it first made it.
        verb = "approved" if mine.approved else "denied"
        raise ApprovalAlreadyDecided(
            f"{shown(by_name, mine.deputy)} already {verb} this call"
            + (f" for {by_name!r}" if mine.deputy else "")
            + f"; {by_name!r} counts once, whoever decides for them",
            standing={"approved": mine.approved, "by": by_name, "deputy": mine.deputy},
        )
    if mine.approved != approved or encode(mine.arguments) != encode(edit):
        raise ApprovalAlreadyDecided(
            f"{by_name!r} already {'approved' if mine.approved else 'denied'} this call; a "
            "decision cannot be changed",
            standing={"approved": mine.approved, "by": by_name},
        )


def _log_vote(
    store: Store,
    actor: Actor,
    run_id: str,
    call_id: str,
    approved: bool,
    note: str,
    signature: str | None,
    edit: Any,
    by_name: str,
    deputy: str,
) -> None:
    """Log a vote the store recorded as its maker's action."""
    store.log_action(
        identity.logged(
            actor,
            "approve" if approved else "deny",
            run_id,
            call_id,
            {
                "note": note,
                "signed": signature is not None,
                **({"edited": edit} if edit is not None else {}),
                **({"for": by_name} if deputy else {}),
            },
        )
    )


def _decide(
    store: Store,
    journal: Journal,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    name: str,
    actor: Actor,
    deciding: Deciding,
    policy: dict[str, Any],
    decisions: Sequence[DecisionInfo],
    count: Tally,
    recorded: bool,
    approved: bool,
    note: str,
    edit: Any,
) -> ApprovalOutcome:
    """Journal a final decision (the first writer wins), then move the rows after it."""
    approver, deputy = deciding.approver, deciding.deputy
    by_name = approver.username
    note = _final_note(policy, count, note)
    decider = _decider(policy, count, by_name)
    # Who made the decider's vote, when a deputy did (``engine.delegation``).
    decider_deputy = next((d.deputy for d in decisions if d.approver == decider), "")
    final, inserted = journal.write(
        run_id,
        name,
        _decision_body(
            request, actor, approver, deputy, decisions, count, decider, decider_deputy, note
        ),
    )
    if not inserted:
        if deadlines.is_expiry(final):
            _refuse_expired(store, request, final)  # the deadline was first
        # Another approver's decision won the race; its maker may have died before moving
        # the rows on (``after-decision``): finish it, as a decision found standing is.
        if finish_decision(store, run_id, call_id, final):
            runtime.dispatch(run_id)
        return _standing(request, final, approved, edit)
    if not recorded:
        # A repeat that wrote the decision (its first try died between its vote and the
        # decision, or the sweep finishes it): the decision is this actor's write too.
        store.log_action(
            identity.logged(actor, "finish-decision", run_id, call_id, {"approved": count.passed})
        )
    failpoints.hit(f"after-decision:{call_id}")
    runs_with = (final.get("edited") or {}).get("arguments") or request.arguments
    if _claimed_under_another(journal, run_id, call_id, runs_with if count.passed else None):
        # A worker on other code claimed the call under an earlier decision after the check
        # above: this one is journaled but can never take effect. Say so; nothing more.
        _withdraw_orphaned(
            store, actor, run_id, call_id, "the call is already being run under an earlier decision"
        )
    status = APPROVAL_APPROVED if count.passed else APPROVAL_DENIED
    moved, cancelled = _move_rows(store, journal, run_id, call_id, request, status)
    # Otherwise the run or the request had moved on already: another approver's repeated
    # decision, or a drive, carried this decision on from the journal. It stands.
    if cancelled:
        why = (
            "the run was cancelled, its saga aborted, or the call got its result under "
            "another decision, while the decision was being recorded"
        )
        _withdraw_orphaned(store, actor, run_id, call_id, why)
    _announce_decision(
        store, run_id, call_id, request, decisions, count, decider, decider_deputy, note
    )
    if moved and _still_queued(store, run_id):
        runtime.dispatch(run_id)
    return ApprovalOutcome(
        run_id, call_id, APPROVAL_APPROVED if count.passed else APPROVAL_DENIED, count.to_json()
    )


def _decision_body(
    request: ApprovalRequestInfo,
    actor: Actor,
    approver: Actor,
    deputy: str,
    decisions: Sequence[DecisionInfo],
    count: Tally,
    decider: str,
    decider_deputy: str,
    note: str,
) -> dict[str, Any]:
    """The journal record of a final decision: who decided, who recorded it, on what."""
    by_name = approver.username
    return {
        "kind": "approval",
        "approved": count.passed,
        "by": decider,
        "by_id": approver.id if decider == by_name else None,
        **(
            {"deputy": decider_deputy, "decided_by": shown(decider, decider_deputy)}
            if decider_deputy
            else {}
        ),
        **({"deputy_id": actor.id} if decider == by_name and deputy else {}),
        **({"recorded_by": by_name, "recorded_by_id": approver.id} if decider != by_name else {}),
        **({"recorded_by_deputy": deputy} if decider != by_name and deputy else {}),
        "note": note,
        "tally": count.to_json(),
        "at": now_ms(),
        "arguments": request.arguments,
        # The tool's definition it was asked about (an MCP server's tool): a drive finding
        # the tool changed since asks again (``Driver._decision``).
        **({"tool_digest": request.tool_digest} if request.tool_digest else {}),
        **_edited(request, decisions, count),
    }


def _withdraw_orphaned(store: Store, actor: Actor, run_id: str, call_id: str, why: str) -> NoReturn:
    """Withdraw the request of a journaled decision that can never take effect, and say so."""
    lifecycle.move_request(store, run_id, call_id, APPROVAL_WITHDRAWN, lifecycle.PERSON)
    store.log_action(identity.logged(actor, "withdraw", run_id, call_id, {"why": why}))
    raise ApprovalOrphaned(
        f"the approval of call {call_id!r} in run {run_id!r} is orphaned ({why}); nothing was run"
    )


def _move_rows(
    store: Store,
    journal: Journal,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    status: str,
) -> tuple[bool, bool]:
    """Move the run and the request after a journaled decision: (moved, cancelled)."""
    # Queued, not awaiting approval: if the hand-over below fails (a broker down), recovery
    # picks the run up. Only while the run is unfinished: a cancel that landed since the
    # check above keeps the run cancelled, and the decision is refused as orphaned. The run
    # before the request: a crash between leaves a queued run whose drive finishes the
    # request, never a run awaiting a request nobody is shown any more.
    # Never a run rolling back (a saga abort landed since the check): it must not be
    # queued forward, and its rollback withdraws the request.
    moved = lifecycle.hand_over(store, run_id, lifecycle.PERSON)
    decided = lifecycle.move_request(
        store,
        run_id,
        call_id,
        status,
        lifecycle.PERSON,
        if_arguments=request.arguments,
        if_asked_again=request.previous_arguments is not None,
        if_tool_digest=request.tool_digest,
    )
    cancelled = not (decided and moved) and (
        store.get_run(run_id) is None
        or journal.get(run_id, names.RUN_CANCELLED) is not None
        or journal.get(run_id, names.SAGA_ABORT) is not None
        # Withdrawn since it was read: the call got its result under another decision
        # (``Driver._mark_decided``); a drive carrying this one out marks it decided.
        or (not decided and _withdrawn(store, run_id, call_id))
    )
    return moved, cancelled


def _announce_decision(
    store: Store,
    run_id: str,
    call_id: str,
    request: ApprovalRequestInfo,
    decisions: Sequence[DecisionInfo],
    count: Tally,
    decider: str,
    decider_deputy: str,
    note: str,
) -> None:
    """Announce a final decision (``events.APPROVAL_DECIDED``)."""
    edited = _edited(request, decisions, count).get("edited")
    run = store.get_run(run_id)
    # Before the hand-over: an inline drive could finish the run before this returns.
    events.announce(
        store,
        events.APPROVAL_DECIDED,
        run_id=run_id,
        agent=run.agent if run is not None else "",
        call_id=call_id,
        tool=request.tool_name,
        decision=("edit" if edited else "approve") if count.passed else "deny",
        approved=count.passed,
        by=decider,
        **({"deputy": decider_deputy} if decider_deputy else {}),
        note=note,
        arguments=edited["arguments"] if edited else request.arguments,
        original_arguments=request.arguments if edited else None,
        tally=count.to_json(),
    )


@overload
def deny(run_id: str) -> Outcome: ...


@overload
def deny(
    run_id: str,
    call_id: str,
    by: Any,
    message: str = "",
    *,
    signature: str | None = None,
    arguments: Any = NOT_SHOWN,
    for_approver: Any = None,
    store: Store | None = None,
) -> ApprovalOutcome: ...


def deny(
    run_id: str,
    call_id: str | None = None,
    by: Any = None,
    message: str = "",
    *,
    signature: str | None = None,
    arguments: Any = NOT_SHOWN,
    for_approver: Any = None,
    store: Store | None = None,
) -> ApprovalOutcome | Outcome:
    """Deny call ``call_id`` of run ``run_id`` as ``by``; ``message`` is what the model reads
    as the call's result (it is the decision's note, and signed as one).

    Given one argument, ``deny("message")`` is instead an approval rule's outcome
    (``engine.rules``): refuse the call without asking anyone, the model reading the
    message."""
    if call_id is None and by is None:
        return rules.deny(run_id)
    if call_id is None or by is None:
        raise ApprovalError("deny(run_id, call_id, by, message) names the call and who denies it")
    return approve(
        run_id,
        call_id,
        False,
        by,
        message,
        signature=signature,
        arguments=arguments,
        for_approver=for_approver,
        store=store,
    )


def _policy_for_edit(
    store: Store,
    journal: Journal,
    request: ApprovalRequestInfo,
    edit: Any,
    policy: dict[str, Any],
) -> dict[str, Any] | None:
    """The policy the request must be decided under once ``edit`` is what would run, when
    its tool has approval rules and the edited arguments' rule needs more than ``policy``
    (``rules.demands_more``); None when ``policy`` already suffices. The rule is journaled
    for the edited arguments (``rule:<call>:<tag>``, first writer wins) and the request's
    row moves to it, its votes kept. A rule that denies the edited arguments refuses the
    edit (``approval.edit_invalid``), nothing written."""
    run = store.get_run(request.run_id)
    tool = registry.get_agent(run.agent).tools.get(request.tool_name) if run else None
    if tool is None or not isinstance(tool.safety.approval, rules.Rules):
        return None
    name = names.rule(request.call_id, arguments_tag(edit))
    asked = journal.get(request.run_id, name)
    if asked is None:
        context = rules.context_for(store, request.run_id, tool.name)
        match = tool.safety.approval.evaluate(edit, context)
        if match.outcome.kind == rules.DENY:
            raise ApprovalEditInvalid(
                f"the approval policy refuses these arguments (rule {match.rule!r}): "
                f"{match.outcome.message}"
            )
        wanted = dict(match.policy or {})
        if wanted:
            wanted.update(rule=match.rule, explain=match.explain)
            if context.requester:
                wanted["requester"] = context.requester
        asked, _ = journal.write(
            request.run_id,
            name,
            {
                "kind": "rule",
                "rule": match.rule,
                "fingerprint": match.fingerprint,
                "explain": match.explain,
                "outcome": match.outcome.kind,
                "policy": wanted or None,
                "arguments": edit,
                "edit": True,
            },
        )
    if asked.get("outcome") == rules.DENY:
        raise ApprovalEditInvalid(
            f"the approval policy refuses these arguments: {asked.get('rule')}"
        )
    wanted = dict(asked.get("policy") or {})
    if not wanted or not rules.demands_more(wanted, policy):
        return None
    # Another group's rule may need fewer approvals than the request was asked under: it
    # moves to that group, keeping the count (a pending request's needs only grow).
    moved = {
        **rules.at_least(wanted, policy),
        "moved_by_edit": {"from": policy.get("rule"), "arguments": edit},
    }
    # The request keeps the deadline it was asked under (an edit neither restarts nor
    # shortens its clock: ``due_at`` counts from the asking) and any escalation taken.
    moved.pop("deadline", None)
    moved.update({k: policy[k] for k in ("deadline", "escalated_to") if k in policy})
    store.update_approval_request(
        request.run_id, request.call_id, policy=moved, if_arguments=request.arguments
    )
    return moved


def _validated_edit(store: Store, request: ApprovalRequestInfo, approved: bool, edit: Any) -> Any:
    """The edited arguments as the tool's schema validates them, or None for an edit that
    changes nothing; refused (nothing written) when they cannot run."""
    if not approved:
        raise ApprovalEditInvalid("only an approval can edit the arguments; a denial has a note")
    if not isinstance(edit, dict):
        raise ApprovalEditInvalid("edited arguments must be a JSON object")
    refuse_nul(edit, "the edited arguments")
    run = store.get_run(request.run_id)
    try:
        tool = registry.get_agent(run.agent).tools.get(request.tool_name) if run else None
    except ConfigError:
        tool = None
    if tool is None:
        raise ApprovalEditInvalid(
            f"tool {request.tool_name!r} is not loaded here, so edited arguments cannot be "
            "checked against its schema; approve or deny as asked"
        )
    try:
        valid = tool.validate(encode(edit))
    except ToolArgumentsError as exc:
        raise ApprovalEditInvalid(
            f"the edited arguments do not fit tool {request.tool_name!r}: {exc}",
            errors=str(exc),
        ) from None
    if encode(valid) == encode(request.arguments):
        return None
    if not tool.safety.editable:
        raise ApprovalEditInvalid(
            f"tool {request.tool_name!r} does not allow editing its arguments "
            "(editable=False); approve or deny as asked"
        )
    return valid


def _principal(for_approver: Any, actor: Actor) -> Actor | None:
    """The approver ``for_approver`` names for a deputy's decision; None for none, or for
    the actor themselves."""
    if for_approver is None or for_approver == "":
        return None
    try:
        principal = identity.resolve(for_approver)
    except ActorError as exc:
        raise ApproverNotEligible(
            f"for_approver={for_approver!r} names no active user to decide for: {exc}"
        ) from None
    return None if principal.username == actor.username else principal


def _refuse_second_hand(
    store: Store, request: ApprovalRequestInfo, actor: Actor, by_name: str
) -> None:
    """One person counts once in a quorum: refuse a second vote by someone who voted
    already, for themselves or as a deputy (``tally`` counts only the first, should two
    land at once)."""
    for d in store.list_decisions(request.run_id, request.call_id):
        if d.approver != by_name and (d.deputy or d.approver) == actor.username:
            raise ApprovalAlreadyDecided(
                f"{actor.username!r} already {'approved' if d.approved else 'denied'} call "
                f"{request.call_id!r}"
                + (f" for {d.approver!r}" if d.deputy else "")
                + "; a person counts once in a quorum, for themselves or for someone else",
                standing={"approved": d.approved, "by": d.approver, "deputy": d.deputy},
            )


def _refuse_disagreeing(
    store: Store, request: ApprovalRequestInfo, by_name: str, edit: Any, eligible: list[str]
) -> None:
    # The first approval sets the arguments the quorum approves (``tally``): a later one
    # that disagrees with it counts for nothing, so it is no reason to refuse.
    first = next(
        (
            d
            for d in store.list_decisions(request.run_id, request.call_id)
            if d.approved and d.approver in eligible
        ),
        None,
    )
    if first is None or first.approver == by_name:
        return
    theirs = first.arguments if first.arguments is not None else request.arguments
    if encode(theirs) != encode(edit if edit is not None else request.arguments):
        raise ApprovalArgumentsDisagree(
            f"{first.approver!r} approved call {request.call_id!r} with the arguments "
            f"{encode(theirs)}; a quorum approves one set of arguments: approve those "
            "(edit=...) or deny",
            approved_arguments=theirs,
        )


def _edited(request: ApprovalRequestInfo, decisions: Any, count: Tally) -> dict[str, Any]:
    """The journal's record of an edit: what runs (the counted approvals' edit), what was
    asked, who edited."""
    if not count.passed or count.arguments is None:
        return {}
    counted = set(count.approved_by)
    return {
        "edited": {
            "arguments": count.arguments,
            "original": request.arguments,
            "by": [
                d.approver
                for d in decisions
                if d.approved and d.approver in counted and d.arguments is not None
            ],
        }
    }


def finish_decision(
    store: Store, run_id: str, call_id: str, decision: Any, *, by: str = lifecycle.PERSON
) -> bool:
    """Bring the rows in step with a decision the journal holds: a run still awaiting
    approval queued again, then a request still pending marked decided (an expiry:
    ``deadlines.finish_expiry``). Idempotent; True if the run was queued (hand it to a
    driver). ``by``: who finishes it (``lifecycle``'s movers)."""
    if deadlines.is_expiry(decision):
        return finish_expiry(store, run_id, call_id, decision, by=by)
    run = store.get_run(run_id)
    if run is None or run.status in TERMINAL_STATUSES:
        return False  # a cancel closes its requests itself
    queued = False
    if run.status == AWAITING_APPROVAL:
        queued = lifecycle.hand_over(store, run_id, by, only_from=AWAITING_APPROVAL)
    lifecycle.move_request(
        store,
        run_id,
        call_id,
        lifecycle.decided(decision),
        by,
        if_arguments=decision.get("arguments"),
        # Its name says whether it decided the first request or one asked again: never the
        # other, though it may ask about the same arguments (an edit that no longer fits
        # asks again about what its maker was shown).
        if_asked_again=decision.name != names.decision(call_id, None),
        # And about the definition of its tool it names (an MCP server's), if any.
        if_tool_digest=decision.get("tool_digest") or None,
    )
    return queued


def _still_queued(store: Store, run_id: str) -> bool:
    """Whether the run this decision queued is still queued, read right before its hand-over:
    a driver (a *resume* pressed meanwhile) may have taken it since and paused it (halted on
    an unknown outcome, say), or be driving it. A paused run is a person's: handing it to a
    driver would only drive it into its pause again (found by the simulator)."""
    run = store.get_run(run_id)
    return run is not None and run.status == QUEUED


def _claimed_under_another(journal: Journal, run_id: str, call_id: str, runs_with: Any) -> bool:
    """Whether the call's live attempt was claimed to run with other arguments than this
    decision runs it with (``runs_with``; None for a denial, which runs nothing): claimed
    under an earlier decision. A drive carrying this decision out claims it with exactly
    ``runs_with``."""
    marker = journal.attempt_state(run_id, call_id)[1]
    if marker is None:
        return False
    return runs_with is None or encode(marker.get("arguments")) != encode(runs_with)


def _refuse_expired(store: Store, request: ApprovalRequestInfo, expiry: Any) -> None:
    """Refuse a decision on a request its deadline expired (``approval.expired``), having
    finished the expiry if its sweep stopped half-way: an expired request is never decided
    afterwards, whatever the decision."""
    if finish_decision(store, request.run_id, request.call_id, expiry):
        runtime.dispatch(request.run_id)
    then = {
        deadlines.ON_EXPIRY_CANCEL: "the run was cancelled",
        deadlines.ON_EXPIRY_HALT: "the run halted for a person to record the call's result",
    }.get(str(expiry.get("on_expiry")), "the model was told it expired")
    raise ApprovalExpired(
        f"call {request.call_id!r} of run {request.run_id!r} expired: nobody decided it before "
        f"its deadline, and {then}; it can no longer be decided",
        standing={
            "approved": False,
            "by": deadlines.BY,
            "expired": True,
            "on_expiry": expiry.get("on_expiry"),
            "note": expiry.get("note"),
        },
    )


def _closed_meanwhile(
    store: Store,
    journal: Journal,
    run_id: str,
    call_id: str,
    name: str,
    actor: Actor,
    approved: bool,
    edit: Any,
) -> ApprovalOutcome:
    """What a decision whose request closed under it comes to: the standing decision, if
    one was journaled (a refusal if it is an expiry), else orphaned (nothing recorded)."""
    request = store.get_approval_request(run_id, call_id)
    standing = journal.get(run_id, name)
    if request is not None and standing is not None:
        if deadlines.is_expiry(standing):
            _refuse_expired(store, request, standing)
        if request.status != APPROVAL_WITHDRAWN:
            return _standing(request, standing, approved, edit)
    if request is not None:
        _refuse_orphans(store, journal, request, actor)
    raise ApprovalOrphaned(
        f"the approval of call {call_id!r} in run {run_id!r} is orphaned (its request was "
        "closed while the decision was being recorded); nothing was recorded"
    )


def _withdrawn(store: Store, run_id: str, call_id: str) -> bool:
    request = store.get_approval_request(run_id, call_id)
    return request is not None and request.status == APPROVAL_WITHDRAWN


def _refuse_orphans(
    store: Store, journal: Journal, request: ApprovalRequestInfo, actor: Actor
) -> None:
    run = store.get_run(request.run_id)
    start = journal.get(request.run_id, names.RUN_START) if run is not None else None
    why = None
    stop = None
    if run is None:
        why = "the run was deleted"
    elif request.status == APPROVAL_WITHDRAWN:
        why = "the request was withdrawn"
    elif run.status in TERMINAL_STATUSES:
        why = f"the run is {run.status}"
    elif journal.get(request.run_id, names.RUN_CANCELLED) is not None:
        why = "the run is cancelled"
    elif journal.get(request.run_id, names.SAGA_ABORT) is not None:
        why = "the run's saga aborted: it is rolling back, and never runs the call"
    elif start is None or start.seq != request.start_seq:
        why = "the run was started again under the same id"
    elif journal.get(request.run_id, names.tool(request.call_id)) is not None:
        # Carried out meanwhile under an earlier decision by a drive of other code (the
        # request was about other arguments): a recorded result is never run again.
        why = "the call already has its result"
    elif journal.attempt_state(request.run_id, request.call_id)[1] is not None:
        # Claimed under an earlier decision by a drive of other code, and not finished (or
        # its outcome unknown): this decision could only be reported, never carried out.
        why = "the call is already being run under an earlier decision"
    elif run.parent_run_id and (stop := stops.stop_above(store, run.parent_run_id)) is not None:
        # The run's own stop is not recorded yet (a cancel that died, or this run busy when
        # it came): nothing new starts under it. Its drive records it (handed over below).
        why = f"{stop.describe()}: nothing new starts below it"
    if why is None:
        return
    if run is not None:
        lifecycle.move_request(
            store, request.run_id, request.call_id, APPROVAL_WITHDRAWN, lifecycle.PERSON
        )
        store.log_action(
            identity.logged(actor, "withdraw", request.run_id, request.call_id, {"why": why})
        )
        if stop is not None and lifecycle.hand_over(
            store, request.run_id, lifecycle.PERSON, only_from=lifecycle.PAUSED
        ):
            runtime.dispatch(request.run_id)  # its drive stops it (or finishes what stopped)
    raise ApprovalOrphaned(
        f"the approval of call {request.call_id!r} in run {request.run_id!r} is orphaned "
        f"({why}); nothing was run"
    )


def _decider(policy: dict[str, Any], count: Tally, writer: str) -> str:
    """Whom the decision that makes a request final names as its decider (``by``): its
    writer, unless the writer's vote is not one the outcome rests on. A quorum's voters race
    to write it, and the write can fall to an approver whose approval of other arguments was
    not counted, or to an approver of a quorum that failed. Then it names the approval that
    completed the quorum, or the last denial (the record keeps its writer as
    ``recorded_by``)."""
    if policy.get("kind") != "quorum":
        return writer
    if count.passed:
        return writer if writer in count.approved_by else count.approved_by[count.need - 1]
    if writer in count.denied_by or not count.denied_by:
        return writer  # no denier: the approvals disagreed, and the tally says so
    return count.denied_by[-1]


def _final_note(policy: dict[str, Any], count: Tally, note: str) -> str:
    """The note of the decision that makes a request final: the decider's own, except for
    a quorum that failed, whose note is its deniers' — whoever's vote was recorded last (two
    approvers of a failed quorum race to write it; an approval can be the one that lands),
    the model reads why people said no."""
    if count.passed or policy.get("kind") != "quorum":
        return note
    notes = [str(d.get("note") or "") for d in count.decisions if not d.get("approved")]
    if count.disagreed_by:
        notes.append("the approvers approved different arguments, so none had the quorum")
    return "; ".join(dict.fromkeys(n for n in notes if n))


def _standing(
    request: ApprovalRequestInfo, standing: Any, approved: bool, edit: Any
) -> ApprovalOutcome:
    was = bool(standing.get("approved"))
    # An approval of other arguments than the standing one's is another decision, not the
    # same one again: the person must not believe their edit runs.
    ran = (standing.get("edited") or {}).get("arguments") if was else None
    if was != approved or (approved and encode(ran) != encode(edit)):
        raise ApprovalAlreadyDecided(
            f"call {request.call_id!r} of run {request.run_id!r} was already "
            f"{'approved' if was else 'denied'} by {standing.get('by')!r}"
            + (" with other arguments" if was == approved else "")
            + "; the first decision stands",
            standing={
                "approved": was,
                "by": standing.get("by"),
                "note": standing.get("note"),
                **({"arguments": ran} if ran is not None else {}),
            },
        )
    status = APPROVAL_APPROVED if was else APPROVAL_DENIED
    return ApprovalOutcome(request.run_id, request.call_id, status, standing.get("tally") or {})
