"""Delegations: who decides for an approver who is away (``engine.delegation``).

Recording and revoking call the engine's commands (``durable_agents.delegate``,
``revoke_delegation``), which decide who may: an approver for themselves, anyone's with
``delegate_approvals``; an approver, their deputy or a holder of ``delegate_approvals``
ends one. Reading needs ``approve_toolcall`` or ``delegate_approvals``; an approver sees
the delegations naming them (as approver or deputy), a holder of ``delegate_approvals``
every one.
"""

from __future__ import annotations

from typing import Annotated, Any

from django.db.models import Q, QuerySet
from django.http import HttpRequest
from ninja import Path, Router, Status
from pydantic import Field

from ..database.reads import in_state, with_state
from ..engine.commands.delegations import delegate, revoke
from ..engine.identity import Actor
from ..models import Delegation
from ..permissions import allows
from .auth import current_user, require
from .schemas import (
    ERRORS,
    Cursor,
    DelegationIn,
    DelegationOut,
    DelegationPage,
    DelegationState,
    Limit,
    Name,
    Offset,
    RevokeDelegationIn,
    page,
)

router = Router(tags=["delegations"])

DelegationId = Annotated[int, Field(ge=1, le=2**63 - 1)]


def visible(user: Any, actor: Actor) -> QuerySet[Delegation]:
    """The delegations ``user`` may read: every one with ``delegate_approvals``, else those
    naming them as approver or deputy."""
    rows = Delegation.objects.all()
    if allows(user, "delegate"):
        return rows
    return rows.filter(Q(approver=actor.username) | Q(deputy=actor.username))


def delegation_out(row: Any) -> DelegationOut:
    return DelegationOut(
        id=row.pk,
        approver=row.approver,
        deputy=row.deputy,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        groups=list(row.groups or ()),
        tools=list(row.tools or ()),
        note=row.note,
        state=row.state,
        created_by=row.created_by,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        revoked_by=row.revoked_by,
    )


def _read(delegation_id: int) -> DelegationOut:
    return delegation_out(with_state(Delegation.objects.filter(pk=delegation_id)).get())


@router.get("/delegations", response={200: DelegationPage, **ERRORS})
def list_delegations(
    request: HttpRequest,
    state: DelegationState = "current",
    approver: Name | None = None,
    deputy: Name | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
    cursor: Cursor | None = None,
    count: bool = True,
) -> DelegationPage:
    """Delegations, newest first: ``current`` (in force or still to come, the default),
    ``in_force``, ``upcoming``, ``ended``, ``revoked`` or ``all``; by ``approver`` or
    ``deputy``. Needs ``approve_toolcall`` (the caller's own) or ``delegate_approvals``
    (everyone's)."""
    actor = require(request, "delegations")
    rows = with_state(visible(current_user(request), actor)).order_by("-created_at", "-id")
    if state != "all":
        rows = rows.filter(in_state(state))
    if approver is not None:
        rows = rows.filter(approver=approver)
    if deputy is not None:
        rows = rows.filter(deputy=deputy)
    got = page(rows, limit, offset, cursor=cursor, count=count, name="delegations")
    return DelegationPage(
        count=got.count,
        limit=limit,
        offset=offset,
        next_cursor=got.next_cursor,
        items=[delegation_out(r) for r in got.items],
    )


@router.post("/delegations", response={201: DelegationOut, **ERRORS})
def create_delegation(request: HttpRequest, payload: DelegationIn) -> Status[DelegationOut]:
    """Record that ``deputy`` decides for ``approver`` (default: the caller) from
    ``starts_at`` (default: now) until ``ends_at``, optionally only for ``groups`` /
    ``tools``. Refusals, nothing written: 403 ``actor.forbidden`` (someone else's without
    ``delegate_approvals``), 400 ``delegation.not_eligible`` (either person is no active
    user holding ``approve_toolcall``), 400 ``delegation.invalid`` (oneself as deputy, a
    window ending before it starts, a time without a timezone), 409 ``delegation.overlaps``
    (``details.standing``: the delegation of the same approver in the way; revoke it
    first)."""
    by = require(request, "delegations")
    made = delegate(
        payload.approver or by.username,
        payload.deputy,
        payload.starts_at,
        payload.ends_at,
        payload.groups,
        payload.tools,
        by=by,
        note=payload.note,
    )
    assert made.id is not None
    return Status(201, _read(made.id))


@router.post("/delegations/{delegation_id}/revoke", response={200: DelegationOut, **ERRORS})
def revoke_delegation(
    request: HttpRequest, delegation_id: Path[DelegationId], payload: RevokeDelegationIn
) -> DelegationOut:
    """End a delegation now: its approver (back early), its deputy (declining) or a holder
    of ``delegate_approvals``; otherwise 403 ``actor.forbidden``, 404
    ``delegation.not_found``. One revoked or ended already is answered as it stands."""
    by = require(request, "delegations")
    done = revoke(delegation_id, by, payload.note)
    assert done.id is not None
    return _read(done.id)
