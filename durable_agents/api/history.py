"""History, fork, compare and export of runs. Views call the engine's ``history``, ``fork``
and ``compare``; a fork is handed to a driver after it is written."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from ninja import Router, Status

from ..celery.dispatch import enqueue
from ..conf import get_settings
from ..engine.commands.forks import Patch, fork
from ..engine.commands.runs import get_run
from ..engine.steps import compare, history
from ..transfer import export_lines
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


@router.get(
    "/runs/{path:run_id}/export",
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {
                "description": "The run as JSON lines (docs/replay.md, Export format)",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        }
    },
)
def export_run(request: HttpRequest, run_id: str, with_forks: bool = False) -> HttpResponse:
    """The run (and with ``with_forks``, its forks) as JSON lines: its journal, approval
    requests and decisions, halts and action log entries; ``manage.py durable_agents
    import`` reads it."""
    check(request, "view_runs")
    run = get_run(checked_run_id(run_id))
    body = "".join(f"{text}\n" for text in export_lines(run.run_id, with_forks=with_forks))
    response = HttpResponse(body, content_type="application/x-ndjson; charset=utf-8")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run.run_id)
    response["Content-Disposition"] = f'attachment; filename="{safe}.jsonl"'
    return response


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
