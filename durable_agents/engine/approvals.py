"""Approvals: staff decide gated tool calls, one decision (1-of-1) or a quorum (m-of-n).

The decision that counts is journaled as ``approval:<call>`` — first writer wins, so a call
is decided once — with the tally of who decided what. An approval hands the run back to a
driver, which runs the call under its attempt claim: at most once. A denial becomes a
rejection result the model reads.

A decision continues only the run incarnation that asked for it: deciding a request whose
run was cancelled, deleted, finished or started again under the same id is refused as
orphaned, and the request is withdrawn — also when the cancel lands while the decision is
being recorded: the run's status changes only while it is unfinished. A saga that aborts
(by itself, by a person, or because its parent did) is rolling back: its pending requests
are withdrawn (``withdraw_pending``) and a decision on them is refused the same way.

This module holds the rules (policies, names, signatures, the tally); the ``approve``
command is ``engine.commands.approvals``.

Who may decide is one rule (``check_may_decide``) for every path: ``by`` resolves to one
active user (``identity.resolve``) who holds ``approve_toolcall`` and, for a quorum, is an
eligible member of its group. A signed decision is checked against the keys registered to
that user, over bytes that bind the run's incarnation and the whole decision
(``decision_bytes``).

A decision is for the arguments it was shown: the record holds them, and a driver runs the
call only with exactly those. If today's code would run the call with other arguments (a
deploy added a defaulted field), the call is asked about again, showing both; that second
decision is recorded as ``approval:<call>:<digest of the new arguments>``.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import identity, lifecycle, names, runtime
from .errors import (
    ActorError,
    ApprovalBadSignature,
    ApprovalSignatureOutdated,
    ApproverNotEligible,
    ConfigError,
)
from .identity import APPROVE_TOOLCALL, Actor
from .journal import Journal
from .ports import (
    APPROVAL_WITHDRAWN,
    ApprovalRequestInfo,
    DecisionInfo,
    DelegationInfo,
    Store,
)
from .records import encode

SIGNATURE_FORMAT = 2
SIGNATURE_DOMAIN = b"durable_agents.approval.v2\n"
# The first format bound neither the run's incarnation nor the note: refused, by name.
_V1_DOMAIN = b"durable_agents.approval.v1\n"


@dataclass(frozen=True)
class Quorum:
    """``need`` approvals from distinct members of ``group`` who hold the
    ``approve_toolcall`` permission. It fails as soon as too few undecided approvers remain."""

    need: int
    group: str

    def __post_init__(self) -> None:
        if not isinstance(self.need, int) or self.need < 1:
            raise ConfigError("Quorum(need=...) must be an int >= 1", code="config.quorum")
        if not isinstance(self.group, str) or not self.group:
            raise ConfigError("Quorum(group=...) must name a group", code="config.quorum")

    def to_policy(self) -> dict[str, Any]:
        return {"kind": "quorum", "need": self.need, "group": self.group}


def policy_for(approval: Any, *, deadline: Any = None) -> dict[str, Any]:
    """The request policy of a tool's one-rule approval (``requires_approval=True`` or a
    ``Quorum``), with the tool's ``deadline`` (a ``rules.Deadline``); a tool with ``Rules``
    asks under the policy its matching rule journaled."""
    policy = approval.to_policy() if isinstance(approval, Quorum) else {"kind": "single"}
    if deadline is not None:
        policy["deadline"] = deadline.to_policy()
    return policy


def needs_group(policy: Mapping[str, Any]) -> str | None:
    """The group whose members decide under ``policy`` (None: anyone who may decide)."""
    group = policy.get("group")
    return str(group) if group else None


def deciding_groups(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """Every group whose members may decide under ``policy``: its own, and the group an
    expired deadline step escalated it to (``escalated_to``); empty: anyone may decide."""
    group = needs_group(policy)
    if group is None:
        return ()
    escalated = policy.get("escalated_to")
    return (group, str(escalated)) if escalated and escalated != group else (group,)


def eligible_for(policy: Mapping[str, Any], actor: Actor, members: Any = None) -> list[str]:
    """The usernames who may decide under ``policy``, as ``check_may_decide`` and the tally
    count them: the members of its groups (``members(group)``, by default the
    ``eligible_approvers`` port, which a caller may cache), or for a policy naming no group
    the deciding ``actor`` alone (one decision decides)."""
    if not deciding_groups(policy):
        return [actor.username]
    return members_of(policy, members)


def members_of(policy: Mapping[str, Any], members: Any = None) -> list[str]:
    """The usernames in the groups that decide under ``policy`` (``deciding_groups``)."""
    members = members or runtime.eligible_approvers
    found: list[str] = []
    for group in deciding_groups(policy):
        found += [u for u in members(group) if u not in found]
    return found


class _NotShown:
    def __repr__(self) -> str:
        return "NOT_SHOWN"


# ``approve(arguments=...)`` not given: the caller showed nothing to check against.
NOT_SHOWN: Any = _NotShown()


def arguments_tag(arguments: Any, tool_digest: str = "") -> str:
    """A short name for one argument set, to tell apart decisions on one call. For a tool
    the site did not write (an MCP server's), the question is the arguments *and* the
    tool's definition as its server declared it (``Tool.definition_digest``): a call asked
    again because the server changed the tool is another question, with a name of its own,
    even about the same arguments. A Python tool's tag is its arguments' alone."""
    if not tool_digest:
        return arguments_digest(arguments).hex()[:16]
    both = encode({"arguments": arguments, "tool": tool_digest})
    return hashlib.sha256(both.encode()).hexdigest()[:16]


def decision_name(call_id: str, arguments: Any, *, again: bool, tool_digest: str = "") -> str:
    """The journal name of the decision on a call: ``approval:<call>`` the first time it is
    asked; when it is asked again for other arguments (or about a tool its server changed),
    one name per question (``arguments_tag``)."""
    return names.decision(call_id, arguments_tag(arguments, tool_digest) if again else None)


@dataclass(frozen=True)
class Tally:
    need: int
    eligible: tuple[str, ...]
    approved_by: tuple[str, ...]
    denied_by: tuple[str, ...]
    decisions: tuple[dict[str, Any], ...] = field(default=())
    # Approvers whose approval is of other arguments than the first approval's: decided, but
    # never counted towards the quorum (two approvals of different edits are no quorum for
    # either, even when both were recorded at once).
    disagreed_by: tuple[str, ...] = ()
    # What the counted approvals approve running: their edit, or None for as asked.
    arguments: Any = None
    # Approvers whose decision a person made who had decided already (for themselves or for
    # another approver, ``engine.delegation``): one person counts once, so it never counts.
    uncounted: tuple[str, ...] = ()

    @property
    def pending(self) -> tuple[str, ...]:
        decided = {*self.approved_by, *self.denied_by, *self.disagreed_by, *self.uncounted}
        return tuple(a for a in self.eligible if a not in decided)

    @property
    def passed(self) -> bool:
        return len(self.approved_by) >= self.need

    @property
    def unreachable(self) -> bool:
        return len(self.approved_by) + len(self.pending) < self.need

    def to_json(self) -> dict[str, Any]:
        return {
            "need": self.need,
            "eligible": list(self.eligible),
            "approved_by": list(self.approved_by),
            "denied_by": list(self.denied_by),
            "pending": list(self.pending),
            "decisions": [dict(d) for d in self.decisions],
            **({"disagreed_by": list(self.disagreed_by)} if self.disagreed_by else {}),
            **({"uncounted": list(self.uncounted)} if self.uncounted else {}),
        }


@dataclass(frozen=True)
class ApprovalOutcome:
    """Where a request stands after a decision: ``approved``, ``denied`` or ``pending``."""

    run_id: str
    call_id: str
    status: str
    tally: dict[str, Any]


def _field(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


def arguments_digest(arguments: Any) -> bytes:
    """SHA-256 of the arguments' canonical JSON (the journal's encoding): what a signature
    binds, so a signer never has to reproduce the JSON encoding themselves."""
    return hashlib.sha256(encode(arguments).encode()).digest()


def decision_bytes(
    *,
    incarnation: str,
    run_id: str,
    call_id: str,
    tool_name: str,
    arguments: Any,
    approver_id: str,
    approved: bool,
    note: str = "",
    edited: Any = None,
    for_approver_id: str | None = None,
) -> bytes:
    """What an external approver signs (format 2): this start of this run (its
    ``incarnation``, a random nonce recorded at ``run:start``), this call, this tool, these
    exact arguments (hashed), this approver (the user's stable id: their primary key as
    text, which a rename does not change), this verdict and this note. Text fields are
    UTF-8 with a 4-byte big-endian length prefix, so no two decisions share the bytes::

        b"durable_agents.approval.v2\\n" + f(incarnation) + f(run_id) + f(call_id)
        + f(tool_name) + sha256(arguments) + f(approver_id) + (b"\\x01" | b"\\x00") + f(note)

    An approval that edits the arguments (``edited``: the arguments it approves running
    instead, as the tool's schema validates them) appends ``b"\\x01" + sha256(edited)``; an
    unedited decision's bytes are unchanged (the note's length prefix ends them, so the two
    never coincide). ``arguments`` stays what the call asked about.

    A deputy deciding for another approver (``engine.delegation``) signs with their own key:
    ``approver_id`` is the deputy's, and the bytes end with ``b"\\x02" +
    f(for_approver_id)``, the approver they decide for (after the edit's part, if any). A
    signature for oneself never verifies as one for someone else, nor the other way.
    """
    return (
        SIGNATURE_DOMAIN
        + _field(incarnation)
        + _field(run_id)
        + _field(call_id)
        + _field(tool_name)
        + arguments_digest(arguments)
        + _field(approver_id)
        + (b"\x01" if approved else b"\x00")
        + _field(note)
        + (b"" if edited is None else b"\x01" + arguments_digest(edited))
        + (b"" if for_approver_id is None else b"\x02" + _field(for_approver_id))
    )


def _v1_bytes(request: ApprovalRequestInfo, approver: str, approved: bool) -> bytes:
    return (
        _V1_DOMAIN
        + _field(request.run_id)
        + _field(request.call_id)
        + _field(request.tool_name)
        + arguments_digest(request.arguments)
        + _field(approver)
        + (b"\x01" if approved else b"\x00")
    )


def incarnation_of(store: Store, run_id: str) -> str:
    """The nonce the run's current start recorded ("" for a run started before there were
    nonces)."""
    start = Journal(store).get(run_id, names.RUN_START) if store.get_run(run_id) else None
    return str(start.get("incarnation") or "") if start is not None else ""


def _verifies(keys: Sequence[str], sig: bytes, message: bytes) -> bool:
    for key in keys:
        try:
            Ed25519PublicKey.from_public_bytes(base64.b64decode(key)).verify(sig, message)
            return True
        except (InvalidSignature, ValueError):
            continue
    return False


def verify_signature(
    request: ApprovalRequestInfo,
    approver: Actor,
    approved: bool,
    note: str,
    signature: str,
    *,
    incarnation: str,
    edited: Any = None,
    signed_as: str | None = None,
    for_approver: Actor | None = None,
    for_signed_as: str | None = None,
) -> None:
    """Refuse (``approval.bad_signature``) unless ``signature`` is the approver's, by one of
    the keys registered to them, over ``decision_bytes`` of exactly this decision; a
    signature over the retired format 1 is ``approval.signature_format``.

    ``for_approver``: the approver a deputy (``approver``, whose keys sign) decides for;
    the bytes bind their id too.

    ``signed_as`` (``for_signed_as``): the id the signed bytes name for the signer (the
    approver decided for), when the decision was made on another site (an import), where
    the same person's user had another primary key; the keys are still those registered
    *here* to ``approver``."""
    try:
        sig = base64.b64decode(signature, validate=True)
    except (ValueError, TypeError):
        raise ApprovalBadSignature("the signature is not valid base64") from None
    keys = runtime.approver_keys(approver.id)
    if not keys:
        raise ApprovalBadSignature(
            f"user {approver.username!r} has no registered approver key in effect; they "
            "register one in the admin (Approver keys), or confirm one registered for them"
        )
    message = decision_bytes(
        incarnation=incarnation,
        run_id=request.run_id,
        call_id=request.call_id,
        tool_name=request.tool_name,
        arguments=request.arguments,
        approver_id=approver.id if signed_as is None else signed_as,
        approved=approved,
        note=note,
        edited=edited,
        for_approver_id=None
        if for_approver is None
        else (for_approver.id if for_signed_as is None else for_signed_as),
    )
    if _verifies(keys, sig, message):
        return
    if _verifies(keys, sig, _v1_bytes(request, approver.username, approved)):
        raise ApprovalSignatureOutdated(
            "this signature is over format 1 of the decision bytes, which bound neither the "
            f"run's start nor the note and is no longer accepted; sign format "
            f"{SIGNATURE_FORMAT} (see docs/api.md, 'Signed decisions')"
        )
    deciding = f" deciding for {for_approver.username!r}" if for_approver is not None else ""
    raise ApprovalBadSignature(
        f"the signature does not verify for {approver.username!r}{deciding} on call "
        f"{request.call_id!r} of this start of run {request.run_id!r} with these arguments, "
        "this verdict, this note" + (" and these edited arguments" if edited is not None else "")
    )


def resolve_approver(by: Any) -> Actor:
    """The active user deciding (``approval.not_eligible`` when ``by`` names none)."""
    try:
        return identity.resolve(by)
    except ActorError as exc:
        raise ApproverNotEligible(str(exc)) from None


def approvals_short_of(
    outcome: str, policy: Mapping[str, Any], tally: Mapping[str, Any], requester: str | None
) -> str | None:
    """Why the approvals a decision's ``tally`` counted do not meet a rule's ``outcome`` and
    ``policy`` (None when they do): a denial, too few approvers, approvers outside the
    policy's groups, or the requester counted (or deciding as a deputy) where duties are
    separated."""
    if outcome == "deny":
        return "the rule denies these arguments"
    if outcome != "ask":
        return None
    approvers = [str(a) for a in tally.get("approved_by") or ()]
    if deciding_groups(policy):
        members = set(members_of(policy))
        approvers = [a for a in approvers if a in members]
    if policy.get("separate") and requester:
        # Nor an approval its requester made as someone's deputy.
        deputies = {str(d.get("approver")): d.get("deputy") for d in tally.get("decisions") or ()}
        approvers = [a for a in approvers if requester not in (a, deputies.get(a))]
    need = int(policy.get("need", 1))
    if len(set(approvers)) < need:
        return f"it needs {need} approval(s) under it, and has {len(set(approvers))}"
    return None


def check_may_decide(
    actor: Actor,
    policy: Mapping[str, Any],
    eligible: Sequence[str],
    *,
    for_approver: Actor | None = None,
    delegations: Sequence[DelegationInfo] = (),
    tool: str = "",
) -> None:
    """The one rule for who decides a gated call, on every path (admin, API key, session,
    signature, command, Python): an active user holding ``approve_toolcall``; when the
    policy names a group (a quorum, or ``ask("group")``), also an eligible member of it
    (``eligible``: the group's usernames from the ``eligible_approvers`` port, which applies
    the same conditions); and never the run's requester when the rule separates duties
    (``ask(..., requester_may_decide=False)``).

    A deputy (``actor``) deciding ``for_approver`` (``engine.delegation``): the actor holds
    ``approve_toolcall`` and is named by one of ``delegations`` — those in force now, by
    the store's clock — from that approver covering this call (its ``tool``, the policy's
    groups); the approver may decide it by the rule above (``eligible``: theirs); and where
    duties are separated, neither of them is the run's requester."""
    if for_approver is not None and for_approver.username != actor.username:
        _check_deputy(actor, policy, eligible, for_approver, delegations, tool)
        return
    if not actor.has(APPROVE_TOOLCALL):
        raise ApproverNotEligible(
            f"{actor.username!r} may not decide tool calls: it needs the "
            f"{APPROVE_TOOLCALL!r} permission (grant it in the admin, directly or through a "
            "group)"
        )
    groups = deciding_groups(policy)
    if groups:
        member = actor.groups is None or any(g in actor.groups for g in groups)
        if not member or actor.username not in eligible:
            named = " or ".join(repr(g) for g in groups)
            raise ApproverNotEligible(
                f"{actor.username!r} may not decide this call: approvers are members of group "
                f"{named} with the approve_toolcall permission"
            )
    if policy.get("separate") and policy.get("requester") == actor.username:
        raise ApproverNotEligible(
            f"{actor.username!r} started this run, and the rule that asked says the person "
            "who asked for a call may not decide it (separation of duties): someone else "
            "decides"
        )


def _check_deputy(
    actor: Actor,
    policy: Mapping[str, Any],
    eligible: Sequence[str],
    approver: Actor,
    delegations: Sequence[DelegationInfo],
    tool: str,
) -> None:
    if not actor.has(APPROVE_TOOLCALL):
        raise ApproverNotEligible(
            f"{actor.username!r} may not decide tool calls, for themselves or as a deputy: it "
            f"needs the {APPROVE_TOOLCALL!r} permission"
        )
    groups = deciding_groups(policy)
    if not any(
        d.deputy == actor.username and d.approver == approver.username and d.covers(tool, groups)
        for d in delegations
    ):
        raise ApproverNotEligible(
            f"{actor.username!r} may not decide for {approver.username!r}: no delegation from "
            f"{approver.username!r} to {actor.username!r} covering this call ({tool!r}"
            + (f", group {' or '.join(groups)}" if groups else "")
            + ") is in force now; it is recorded in the admin (Delegations) or with "
            "durable_agents.delegate(...)"
        )
    requester = policy.get("requester")
    if policy.get("separate") and requester in (actor.username, approver.username):
        who = "you" if requester == actor.username else repr(approver.username)
        raise ApproverNotEligible(
            f"{actor.username!r} may not decide this call for {approver.username!r}: {who} "
            "started this run, and the rule that asked says the person who asked for a call "
            "may not decide it (separation of duties), nor through a deputy: someone else "
            "decides"
        )
    try:
        check_may_decide(approver, policy, eligible)
    except ApproverNotEligible as exc:
        raise ApproverNotEligible(
            f"{actor.username!r} decides for {approver.username!r} only what they may "
            f"decide, and this they may not: {exc}"
        ) from None


def tally(
    policy: Mapping[str, Any], decisions: Sequence[DecisionInfo], eligible: Sequence[str]
) -> Tally:
    eligible_set = set(eligible)
    approved: list[str] = []
    denied: list[str] = []
    disagreed: list[str] = []
    uncounted: list[str] = []
    counted: list[dict[str, Any]] = []
    seen: set[str] = set()
    hands: set[str] = set()  # who made the decisions counted: approvers, or their deputies
    agreed: str | None = None  # the first approval's arguments, encoded
    arguments: Any = None
    for d in decisions:
        if d.approver in seen or d.approver not in eligible_set:
            continue  # a user counts once; an ineligible user never
        maker = d.deputy or d.approver
        if maker in hands:
            # A person who decided already, for themselves or for another approver: two
            # decisions recorded at one moment both pass the command's check; one counts.
            uncounted.append(d.approver)
            continue
        seen.add(d.approver)
        hands.add(maker)
        if not d.approved:
            denied.append(d.approver)
        elif agreed is None or encode(d.arguments) == agreed:
            # The approvals that count approve one set of arguments: the first one's (in
            # the order they were recorded). The command refuses a disagreeing approval up
            # front; two recorded at the same moment both pass that check, and here the
            # later one does not count.
            if agreed is None:
                agreed, arguments = encode(d.arguments), d.arguments
            approved.append(d.approver)
        else:
            disagreed.append(d.approver)
        counted.append(
            {
                "approver": d.approver,
                "approved": d.approved,
                "note": d.note,
                "at": d.created_at.isoformat() if d.created_at else None,
                "signed": bool(d.signature),
                **({"arguments": d.arguments} if d.arguments is not None else {}),
                **({"deputy": d.deputy} if d.deputy else {}),
            }
        )
    return Tally(
        need=int(policy.get("need", 1)),
        eligible=tuple(eligible),
        approved_by=tuple(approved),
        denied_by=tuple(denied),
        decisions=tuple(counted),
        disagreed_by=tuple(disagreed),
        arguments=arguments,
        uncounted=tuple(uncounted),
    )


def withdraw_pending(store: Store, run_id: str) -> None:
    """Withdraw the pending approval requests of a run that will never run their calls (it
    was cancelled, or its saga aborted): staff no longer see them, and a decision on one is
    refused as orphaned. Idempotent; a request decided meanwhile keeps its decision."""
    for request in store.list_approval_requests(run_id=run_id):
        lifecycle.move_request(store, run_id, request.call_id, APPROVAL_WITHDRAWN, lifecycle.PERSON)
