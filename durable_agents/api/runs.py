"""Runs: list, read, read the journal, start, resume, cancel.

Views call engine commands (``start``, ``hand_over``, ``cancel``, ``get_run``), which write
the action log, and never change a run's state themselves.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Status

from ..conf import get_settings
from ..database import reads
from ..engine.commands.runs import cancel, get_run, hand_over, start
from ..engine.definition import AgentDefinition
from ..engine.errors import ConfigError
from ..engine.ports import HALT_OPEN, TERMINAL_STATUSES
from ..engine.registry import get_agent
from ..models import ApprovalRequest, Halt, Run
from .approvals import approval_rows, approvals_out
from .auth import check, require
from .errors import ApiError
from .halts import halt_out
from .schemas import (
    ERRORS,
    Accepted,
    After,
    CancelIn,
    CancelOut,
    Cursor,
    JournalOut,
    Limit,
    Name,
    Offset,
    RecordLimit,
    RecordOut,
    RunDetail,
    RunOut,
    RunPage,
    RunStatus,
    StartIn,
    checked_run_id,
    page,
)

router = Router(tags=["runs"])

_SUMMARY = (
    "run_id",
    "agent",
    "status",
    "turns",
    "attempts",
    "last_error",
    "session_id",
    "parent_run_id",
    "root_run_id",
    "forked_from",
    "forked_step",
    "created_at",
    "updated_at",
    "finished_at",
)


def _summary(run: Any) -> dict[str, Any]:
    """The list fields of a run row or a ``RunInfo``."""
    values = {name: getattr(run, name) for name in _SUMMARY}
    if values["last_error"] is not None:
        values["last_error"] = dict(values["last_error"])
    return values


def _agent(name: str, run_id: str | None = None) -> AgentDefinition:
    try:
        return get_agent(name)
    except ConfigError as exc:
        if exc.code != "config.agent_missing":
            raise
        whose = (
            f"run {run_id!r} belongs to agent {name!r}, which is not loaded"
            if run_id
            else (f"no agent named {name!r}")
        )
        raise ApiError(
            404,
            "agent.not_found",
            f"{whose}; agents are found by name through DURABLE_AGENTS['AGENTS']",
        ) from None


@router.get("/runs", response={200: RunPage, **ERRORS})
def list_runs(
    request: HttpRequest,
    status: RunStatus | None = None,
    agent: Name | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
    cursor: Cursor | None = None,
    count: bool = True,
) -> RunPage:
    """Runs, newest first, optionally of one ``status`` and/or ``agent`` (needs
    ``view_run``, or a permission that operates runs)."""
    check(request, "view_runs")
    rows = Run.objects.only(*_SUMMARY).order_by("-created_at", "-run_id")
    if status is not None:
        rows = rows.filter(status=status)
    if agent is not None:
        rows = rows.filter(agent=agent)
    got = page(rows, limit, offset, cursor=cursor, count=count, name="runs")
    items = got.items
    return RunPage(
        count=got.count,
        limit=limit,
        offset=offset,
        next_cursor=got.next_cursor,
        items=[RunOut(**_summary(r)) for r in items],
    )


@router.post("/runs", response={202: Accepted, **ERRORS})
def start_run(request: HttpRequest, payload: StartIn) -> Status[Accepted]:
    """Start a run of ``agent`` (needs ``add_run``) and hand it to a driver once it is
    written. 202 with its id; the run goes on in a worker."""
    by = require(request, "start")
    agent = _agent(payload.agent)
    # One transaction: a start refused half-way writes nothing, and the driver gets the run
    # only after it committed.
    with transaction.atomic(using=get_settings().database):
        run_id = start(agent, payload.input, payload.run_id, by=by)
    return Status(202, Accepted(run_id=run_id))


@router.get("/runs/{path:run_id}/journal", response={200: JournalOut, **ERRORS})
def run_journal(
    request: HttpRequest,
    run_id: str,
    after: After = 0,
    limit: RecordLimit = 1000,
) -> JournalOut:
    """The run's journal in commit order: every recorded step, its data decoded."""
    check(request, "view_runs")
    run_id = checked_run_id(run_id)
    get_run(run_id)
    records = [r for r in reads.journal(run_id) if r.seq > after][:limit]
    return JournalOut(
        run_id=run_id,
        records=[
            RecordOut(seq=r.seq, name=r.name, kind=r.kind, data=r.body, created_at=r.created_at)
            for r in records
        ],
    )


@router.post("/runs/{path:run_id}/resume", response={202: Accepted, **ERRORS})
def resume_run(request: HttpRequest, run_id: str) -> Status[Accepted]:
    """Hand an unfinished run to a driver (needs ``cancel_run``, "can cancel and resume
    runs"). A run paused on a person pauses again until that person acts."""
    by = require(request, "resume")
    run = get_run(checked_run_id(run_id))
    if run.status not in TERMINAL_STATUSES:  # a finished run is refused as such, below
        _agent(run.agent, run.run_id)  # a driver could not continue it: say so now
    with transaction.atomic(using=get_settings().database):
        hand_over(run.run_id, by=by)
    return Status(202, Accepted(run_id=run.run_id))


@router.post("/runs/{path:run_id}/cancel", response={200: CancelOut, **ERRORS})
def cancel_run(request: HttpRequest, run_id: str, payload: CancelIn) -> CancelOut:
    """Cancel an unfinished run (needs ``cancel_run``): it is never driven again and its
    pending approvals are withdrawn. 409 ``run.busy`` while a driver holds it, 409
    ``run.finished`` once finished; cancelling a cancelled run is a no-op.

    ``compensate: true`` ("cancel and compensate") aborts the run as a saga: its completed
    compensable calls are undone, latest first, and it ends ``compensated``; the answer's
    ``status`` is the run's once handed over (``compensating`` until a driver is done, or
    ``halted`` on an unknown outcome). 409 ``run.compensating`` for a plain cancel of a saga
    rolling back, ``run.compensated`` once it is over."""
    by = require(request, "cancel")
    run_id = checked_run_id(run_id)
    if not payload.compensate:
        cancel(run_id, by=by, reason=payload.reason)
        return CancelOut(run_id=run_id, status="cancelled")
    with transaction.atomic(using=get_settings().database):
        cancel(run_id, by=by, reason=payload.reason, compensate=True)
    return CancelOut(run_id=run_id, status=get_run(run_id).status)


# Last: run ids may contain "/", so the paths above must be tried before this one.
@router.get("/runs/{path:run_id}", response={200: RunDetail, **ERRORS})
def run_detail(request: HttpRequest, run_id: str) -> RunDetail:
    """One run, with its input and answer, the tool calls awaiting a decision and its
    open halts."""
    check(request, "view_runs")
    run = get_run(checked_run_id(run_id))
    requests = ApprovalRequest.objects.filter(run_id=run.run_id, status="pending")
    halts = Halt.objects.filter(run_id=run.run_id, status=HALT_OPEN).order_by("created_at")
    return RunDetail(
        **_summary(run),
        input=run.input,
        answer=run.answer,
        usage=dict(run.usage),
        spend=dict(run.spend),
        approvals=approvals_out(list(approval_rows(requests.order_by("created_at", "id")))),
        halts=[halt_out(h) for h in halts],
    )
