"""Delegation: a deputy decides for an approver who is away.

A delegation (``ports.DelegationInfo``) says that ``deputy`` decides for ``approver`` from
``starts_at`` until ``ends_at``, optionally only the calls of some ``tools`` or asked of
some ``groups``. It is *in force* while the store's clock is inside that window and nobody
revoked it; a delegation that has not started, has ended, was revoked, or is scoped to
other tools or groups gives its deputy nothing. The commands that record and revoke them
are ``engine.commands.delegations``.

Deciding as a deputy changes *whose* decision it is, not the rules: the decision is the
approver's (``Decision.approver``), made by the deputy (``Decision.deputy``), and counts
once for that approver — their own vote and the deputy's on their behalf are one row
(unique per request and approver). ``approvals.check_may_decide`` is still the one rule:
it asks that the deputy hold ``approve_toolcall``, that a delegation in force covers the
call, that the approver may decide it themselves, and, where duties are separated, that
neither of them started the run. One person counts once in a quorum, whether for
themselves or for someone else: a deputy of two approvers casts one vote, never two.

Who a person decides for (``deciding_as``): whoever may decide a call decides it as
themselves; ``for_approver=`` names an approver to decide for instead. A person who may
not decide a call themselves but is the deputy of exactly one approver who may, and has not
decided it, decides for that approver; of several, they must name one
(``approval.for_approver_needed``) — the engine never picks one for them. A signed decision
binds the approver it is for (``approvals.decision_bytes``), so it is never given one the
signer did not name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .approvals import check_may_decide, deciding_groups, eligible_for, resolve_approver
from .errors import ApprovalForWhom, ApproverNotEligible
from .identity import APPROVE_TOOLCALL, Actor
from .ports import ApprovalRequestInfo, DelegationInfo, Store


@dataclass(frozen=True)
class Deciding:
    """Who makes a decision (``actor``) and whose it is (``approver``: the actor, or the
    approver they are the deputy of), with the usernames it is counted among."""

    actor: Actor
    approver: Actor
    eligible: list[str]

    @property
    def deputy(self) -> str:
        """The deputy's username when the actor decides for someone else; "" otherwise."""
        return self.actor.username if self.approver.username != self.actor.username else ""


def in_force_to(store: Store, deputy: str) -> list[DelegationInfo]:
    """The delegations to ``deputy`` in force now, by the store's clock."""
    return list(store.list_delegations(deputy=deputy, in_force=True))


def shown(approver: str, deputy: str) -> str:
    """How a decision names who made it: ``"leo for lena"``, or ``"lena"``."""
    return f"{deputy} for {approver}" if deputy else approver


def choices(
    actor: Actor,
    request: ApprovalRequestInfo,
    policy: dict[str, Any],
    *,
    delegations: Callable[[], Sequence[DelegationInfo]],
    voted: Callable[[], Collection[str]],
    members: Any = None,
    resolve: Callable[[str], Actor] = resolve_approver,
) -> tuple[list[Deciding], ApproverNotEligible | None]:
    """The ways ``actor`` may decide ``request`` now, and why not as themselves: as
    themselves alone when they may (one decision each); else for each approver, not yet
    decided (``voted``), who may decide it and whose delegation to ``actor`` in force
    (``delegations``, read only when needed) covers it. Each is checked by
    ``check_may_decide``."""
    eligible = eligible_for(policy, actor, members)
    try:
        check_may_decide(actor, policy, eligible)
        return [Deciding(actor, actor, eligible)], None
    except ApproverNotEligible as exc:
        own = exc
    if not actor.has(APPROVE_TOOLCALL):
        return [], own  # nobody's deputy either: no need to read the delegations
    groups = deciding_groups(policy)
    found = [
        d
        for d in delegations()
        if d.deputy == actor.username and d.covers(request.tool_name, groups)
    ]
    if not found:
        return [], own
    decided = set(voted())
    out: list[Deciding] = []
    for name in dict.fromkeys(d.approver for d in found if d.approver not in decided):
        try:
            approver = resolve(name)
            theirs = eligible_for(policy, approver, members)
            check_may_decide(
                actor,
                policy,
                theirs,
                for_approver=approver,
                delegations=found,
                tool=request.tool_name,
            )
        except ApproverNotEligible:
            continue
        out.append(Deciding(actor, approver, theirs))
    return out, own


def deciding_as(
    actor: Actor,
    request: ApprovalRequestInfo,
    policy: dict[str, Any],
    *,
    for_approver: Actor | None = None,
    delegations: Callable[[], Sequence[DelegationInfo]],
    voted: Callable[[], Collection[str]],
    members: Any = None,
    own_only: bool = False,
) -> Deciding:
    """Who ``actor``'s decision on ``request`` is made for (the module's rule), checked by
    ``check_may_decide``; ``ApproverNotEligible`` when nobody, ``approval.for_approver_needed``
    when several and ``for_approver`` names none. ``own_only``: never for someone else
    unless named (a signed decision)."""
    if for_approver is not None and for_approver.username != actor.username:
        eligible = eligible_for(policy, for_approver, members)
        check_may_decide(
            actor,
            policy,
            eligible,
            for_approver=for_approver,
            delegations=delegations(),
            tool=request.tool_name,
        )
        return Deciding(actor, for_approver, eligible)
    if own_only:
        eligible = eligible_for(policy, actor, members)
        check_may_decide(actor, policy, eligible)
        return Deciding(actor, actor, eligible)
    found, own = choices(
        actor, request, policy, delegations=delegations, voted=voted, members=members
    )
    if len(found) == 1:
        return found[0]
    if not found:
        assert own is not None
        raise own
    names = [d.approver.username for d in found]
    raise ApprovalForWhom(
        f"{actor.username!r} may not decide call {request.call_id!r} as themselves, and is the "
        f"deputy of {', '.join(repr(n) for n in names)}, who may: say whom this decision is "
        "for (for_approver=..., or --for in the command)",
        candidates=names,
    )
