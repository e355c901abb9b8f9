"""Recording and revoking delegations (``engine.delegation``): who decides for an approver
who is away. Each is written together with its action-log row.

A person records a delegation for themselves; for someone else it takes the
``delegate_approvals`` permission. The approver and the deputy are active users holding
``approve_toolcall``, two different people. A delegation runs from ``starts_at`` (never
before now: it does not reach back over decisions already made) until ``ends_at``, later.
Two delegations of one approver never cover the same time and calls: a new one that would
is refused (``delegation.overlaps``), naming the one in the way — revoke it first. So at
any moment an approver has at most one deputy for any call, and nobody wonders which.

A delegation is never edited: it is revoked, by its approver (ending it early), its deputy
(declining it) or a holder of ``delegate_approvals``, and another one recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import identity, runtime
from ..errors import ActorError, DelegationError, DelegationNotFound, DelegationOverlaps
from ..identity import APPROVE_TOOLCALL, DELEGATE_APPROVALS, Actor
from ..ports import DelegationInfo, Store
from ..records import refuse_nul

NOTE_MAX = 2000
NAME_MAX = 150  # a group's name (Django's auth.Group) or a tool's


def delegate(
    approver: Any,
    deputy: Any,
    starts_at: datetime | None,
    ends_at: datetime,
    groups: Sequence[str] = (),
    tools: Sequence[str] = (),
    *,
    by: Any,
    note: str = "",
    store: Store | None = None,
) -> DelegationInfo:
    """Record that ``deputy`` decides for ``approver`` from ``starts_at`` (None: now) until
    ``ends_at`` (timezone-aware), for the calls of ``tools`` asked of ``groups`` (empty:
    all), as ``by``; returns it as stored. Refused, nothing written: ``actor.forbidden``
    (someone else's, without ``delegate_approvals``), ``delegation.not_eligible`` (either
    person is no active user holding ``approve_toolcall``), ``delegation.invalid`` (oneself
    as deputy, a window that ends before it starts, bad names), ``delegation.overlaps``."""
    store = store or runtime.store()
    actor = identity.resolve(by)
    principal = _person(approver, "approver")
    if actor.username != principal.username:
        identity.require(actor, DELEGATE_APPROVALS, "record who decides for another approver")
    if not principal.has(APPROVE_TOOLCALL):
        raise DelegationError(
            f"{principal.username!r} may not decide tool calls, so has nothing to delegate "
            f"(grant {APPROVE_TOOLCALL!r} first)",
            code="delegation.not_eligible",
        )
    helper = _person(deputy, "deputy")
    if helper.username == principal.username:
        raise DelegationError(
            f"{principal.username!r} cannot be their own deputy: name someone else"
        )
    if not helper.has(APPROVE_TOOLCALL):
        raise DelegationError(
            f"{helper.username!r} may not decide tool calls, so cannot decide for "
            f"{principal.username!r}: a deputy needs {APPROVE_TOOLCALL!r} (grant it first)",
            code="delegation.not_eligible",
        )
    if not isinstance(note, str) or len(note) > NOTE_MAX:
        raise DelegationError(f"note must be a string of at most {NOTE_MAX} characters")
    refuse_nul({"note": note}, "the delegation")
    scope_groups, scope_tools = _names(groups, "groups"), _names(tools, "tools")
    now = store.now()
    starts = now if starts_at is None else _aware(starts_at, "starts_at")
    ends = _aware(ends_at, "ends_at")
    starts = max(starts, now)
    if ends <= starts:
        raise DelegationError(
            f"the delegation would end ({ends.isoformat()}) before it starts "
            f"({starts.isoformat()}, and never before now): give an end after its start"
        )
    wanted = DelegationInfo(
        approver=principal.username,
        deputy=helper.username,
        starts_at=starts,
        ends_at=ends,
        groups=scope_groups,
        tools=scope_tools,
        note=note,
        created_by=actor.username,
    )
    log = identity.logged(actor, "delegate", "", payload=_described(wanted))
    stored, inserted = store.save_delegation(wanted, log=log)
    if not inserted:
        raise DelegationOverlaps(
            f"{principal.username!r} already has a delegation for some of this time and these "
            f"calls: {describe(stored)} (#{stored.id}). Revoke it first, then record this one",
            standing=_described(stored) | {"id": stored.id},
        )
    return stored


def revoke(
    delegation_id: int, by: Any, note: str = "", *, store: Store | None = None
) -> DelegationInfo:
    """End delegation ``delegation_id`` now, as ``by``: its approver, its deputy, or a
    holder of ``delegate_approvals``. One revoked already, or ended, stays as it is (and
    nothing is logged); returns the delegation as it stands."""
    store = store or runtime.store()
    actor = identity.resolve(by)
    if not isinstance(delegation_id, int) or isinstance(delegation_id, bool):
        raise DelegationError(f"a delegation is named by its number, not {delegation_id!r}")
    if not isinstance(note, str) or len(note) > NOTE_MAX:
        raise DelegationError(f"note must be a string of at most {NOTE_MAX} characters")
    refuse_nul({"note": note}, "the revocation")
    found = store.get_delegation(delegation_id)
    if found is None:
        raise DelegationNotFound(f"there is no delegation #{delegation_id}")
    if actor.username not in (found.approver, found.deputy):
        identity.require(actor, DELEGATE_APPROVALS, "revoke someone else's delegation")
    if found.revoked_at is not None or found.ends_at <= store.now():
        return found
    payload = {"approver": found.approver, "deputy": found.deputy, "note": note}
    log = identity.logged(actor, "revoke-delegation", "", f"delegation:{delegation_id}", payload)
    store.revoke_delegation(delegation_id, actor.username, log=log)
    return store.get_delegation(delegation_id) or found


def describe(d: DelegationInfo) -> str:
    """``"leo for lena from … to …, tools refund"``: a delegation as people read it."""
    scope = [f"groups {', '.join(d.groups)}"] if d.groups else []
    scope += [f"tools {', '.join(d.tools)}"] if d.tools else []
    return (
        f"{d.deputy} for {d.approver} from {d.starts_at.isoformat()} to "
        f"{d.ends_at.isoformat()}, " + ("; ".join(scope) if scope else "every call")
    )


def _described(d: DelegationInfo) -> dict[str, Any]:
    return {
        "approver": d.approver,
        "deputy": d.deputy,
        "starts_at": d.starts_at.isoformat(),
        "ends_at": d.ends_at.isoformat(),
        "groups": list(d.groups),
        "tools": list(d.tools),
        "note": d.note,
    }


def _person(who: Any, role: str) -> Actor:
    try:
        return identity.resolve(who)
    except ActorError as exc:
        raise DelegationError(f"the {role}: {exc}", code="delegation.not_eligible") from None


def _aware(when: Any, name: str) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise DelegationError(f"{name} must be a timezone-aware datetime, not {when!r}")
    return when


def _names(values: Any, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence | set | frozenset):
        raise DelegationError(f"{what} is a list of names, not {values!r}")
    out: list[str] = []
    for v in values:
        if not isinstance(v, str) or not v.strip() or len(v) > NAME_MAX or "\x00" in v:
            raise DelegationError(f"{what} holds names of 1-{NAME_MAX} characters, not {v!r}")
        if v.strip() not in out:
            out.append(v.strip())
    return tuple(out)
