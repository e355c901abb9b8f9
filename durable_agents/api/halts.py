"""Halts: tool calls whose outcome is unknown, and recording what really happened.

Resolving calls ``durable_agents.resolve_halt``: the outcome is journaled as the call's
result (marked reconciled, with its evidence) and the run is handed back to a driver.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from ..engine.commands.halts import resolve_halt
from ..engine.ports import IMPORTED_INERT
from ..models import Halt
from .auth import check, require
from .schemas import (
    ERRORS,
    Cursor,
    HaltOut,
    HaltPage,
    HaltStatus,
    Limit,
    Offset,
    ResolveIn,
    ResolveOut,
    checked_call_id,
    checked_run_id,
    page,
)

router = Router(tags=["halts"])


def halt_out(row: Halt) -> HaltOut:
    return HaltOut(
        run_id=row.run_id,
        call_id=row.op_id,
        tool_name=row.tool_name,
        arguments=row.arguments,
        attempt=row.attempt,
        attempted_at=row.attempted_at,
        cause=row.cause,
        reason=row.reason,
        status=row.status,
        resolution=row.resolution,
        resolved_by=row.resolved_by,
        created_at=row.created_at,
        resolved_at=row.resolved_at,
    )


@router.get("/halts", response={200: HaltPage, **ERRORS})
def list_halts(
    request: HttpRequest,
    status: HaltStatus = "open",
    run_id: str | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
    cursor: Cursor | None = None,
    count: bool = True,
) -> HaltPage:
    """Halted tool calls, newest first: open ones by default (``status=all`` for every one).
    Needs ``view_halt`` or ``resolve_halt``."""
    check(request, "view_halts")
    rows = Halt.objects.order_by("-created_at", "-id")
    if status != "all":
        rows = rows.filter(status=status)
    if run_id is not None:
        rows = rows.filter(run_id=checked_run_id(run_id))
    else:  # an inert import's halts are evidence, read by its run id, never work
        rows = rows.exclude(run__imported=IMPORTED_INERT)
    got = page(rows, limit, offset, cursor=cursor, count=count, name="halts")
    items = got.items
    return HaltPage(
        count=got.count,
        limit=limit,
        offset=offset,
        next_cursor=got.next_cursor,
        items=[halt_out(h) for h in items],
    )


@router.post("/runs/{path:run_id}/halts/{call_id}/resolve", response={200: ResolveOut, **ERRORS})
def resolve(request: HttpRequest, run_id: str, call_id: str, payload: ResolveIn) -> ResolveOut:
    """Record the verified outcome of a halted call and continue its run.

    Needs ``resolve_halt``. Refused while a driver holds the run (409 ``halt.in_flight``),
    before ``HALT_MIN_AGE`` (or a larger ``min_age``) seconds have passed since the attempt
    (409 ``halt.too_young``, naming when it can be resolved), on a cancelled run (409
    ``halt.orphaned``), when
    another outcome stands (409 ``halt.already_resolved``; the same outcome again is
    accepted), and when the call has no attempt of unknown outcome (409
    ``halt.no_live_attempt``).
    """
    by = require(request, "resolve")
    run_id, call_id = checked_run_id(run_id), checked_call_id(call_id)
    record = resolve_halt(
        run_id,
        call_id,
        payload.result,
        is_error=payload.is_error,
        evidence=payload.evidence,
        by=by,
        min_age=payload.min_age,
    )
    return ResolveOut(
        run_id=run_id,
        call_id=call_id,
        seq=record.seq,
        result=record.get("result"),
        is_error=bool(record.get("is_error")),
        evidence=record.get("evidence"),
        by=str(record.get("by") or by.username),
    )
