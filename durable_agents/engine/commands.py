"""Commands on runs by id: resume, pending. Glue (admin, API, management commands, Celery
tasks) calls these; it never edits a run's state itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import runtime
from .agent import RunResult, get_agent
from .errors import ConfigError
from .loop import drive
from .ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    FAILED,
    HALTED,
    QUEUED,
    RUNNING,
    SLEEPING,
    RunInfo,
    Store,
)

_WHY = {
    QUEUED: "waiting for a driver",
    RUNNING: "being driven, or its driver died (recovered once its lease expires)",
    AWAITING_APPROVAL: "a tool call awaits a staff decision",
    AWAITING_INPUT: "waiting for input",
    SLEEPING: "sleeping until a timer fires",
    HALTED: "a side effect's outcome is unknown: a person must record it",
    FAILED: "the last attempt failed",
}


@dataclass(frozen=True)
class PendingRun:
    run_id: str
    agent: str
    status: str
    why: str
    last_error: dict[str, Any] | None
    attempts: int
    lease_expired: bool | None


def get_run(run_id: str, *, store: Store | None = None) -> RunInfo:
    store = store or runtime.store()
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id!r}", code="run.not_found")
    return run


def resume(run_id: str, *, store: Store | None = None) -> RunResult:
    """Continue an unfinished run inline, with the input it recorded; a finished run
    returns its recorded answer."""
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    return drive(get_agent(run.agent), run_id, None, store=store, derived_id=True)


def pending(*, store: Store | None = None, limit: int = 1000) -> Sequence[PendingRun]:
    """Unfinished runs, with why each one is not finished."""
    store = store or runtime.store()
    return [
        PendingRun(
            run_id=r.run_id,
            agent=r.agent,
            status=r.status,
            why=_WHY.get(r.status, r.status)
            + (f": {r.last_error.get('message')}" if r.last_error else ""),
            last_error=dict(r.last_error) if r.last_error else None,
            attempts=r.attempts,
            lease_expired=r.lease_expired,
        )
        for r in store.list_unfinished(limit=limit)
    ]
