"""History, fork and compare of runs. Views call the engine's ``history``, ``fork`` and
``compare``; a fork is handed to a driver after it is written."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Status

from ..conf import get_settings
from ..dispatch import enqueue
from ..engine.commands.forks import Patch, fork
from ..engine.commands.runs import get_run
from ..engine.steps import compare, history
from .auth import check, require
from .schemas import (
    ERRORS,
    Accepted,
    ComparisonOut,
    ForkIn,
    HistoryOut,
    checked_run_id,
)

router = Router(tags=["history"])


@router.get("/runs/compare", response={200: ComparisonOut, **ERRORS})
def compare_runs(request: HttpRequest, a: str, b: str) -> ComparisonOut:
    """Each run's steps, the first step where they differ (call ids aside) and the drift."""
    check(request, "view_runs")
    for run_id in (a, b):
        get_run(checked_run_id(run_id))
    return ComparisonOut(**compare(a, b).to_json())


@router.get("/runs/{path:run_id}/history", response={200: HistoryOut, **ERRORS})
def run_history(request: HttpRequest, run_id: str) -> HistoryOut:
    """The run's steps, one per model turn, read from its journal."""
    check(request, "view_runs")
    run = get_run(checked_run_id(run_id))
    return HistoryOut(run_id=run.run_id, steps=[s.to_json() for s in history(run.run_id)])


@router.post("/runs/{path:run_id}/fork", response={202: Accepted, **ERRORS})
def fork_run(request: HttpRequest, run_id: str, payload: ForkIn) -> Status[Accepted]:
    """Fork the run at ``from_step`` with a patch (needs ``fork_run``), and hand the fork to
    a driver. 202 with the fork's id."""
    by = require(request, "fork")
    run = get_run(checked_run_id(run_id))
    patch = Patch(
        tool_results=payload.tool_results or {},
        tool_errors=payload.tool_errors or [],
        append_user=payload.append_user,
        instructions=payload.instructions,
    )
    with transaction.atomic(using=get_settings().database):
        fork_id = fork(run.run_id, payload.from_step, patch, payload.new_run_id, by=by)
        enqueue(fork_id)
    return Status(202, Accepted(run_id=fork_id))
