"""Commands on runs by id: resume, pending. Glue (admin, API, management commands, Celery
tasks) calls these; it never edits a run's state itself."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import identity, runtime
from .agent import Agent, RunResult, get_agent
from .approvals import new_incarnation
from .errors import ConfigError, DriveStopped, DurableAgentsError, LeaseLost, Pause, RunBusy
from .journal import Journal
from .leases import HeldLease
from .loop import close_cancelled, drive
from .ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    FAILED,
    FINISHED,
    HALTED,
    KIND_AGENT,
    NOT_TERMINAL_STATUSES,
    QUEUED,
    RUNNING,
    SLEEPING,
    RunInfo,
    Store,
)
from .records import encode, refuse_nul, validate_run_id
from .recovery import describe

log = logging.getLogger("durable_agents")

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
class Wait:
    """One thing a paused run waits on: a call to approve (``approval``) or a call whose
    outcome a person must record (``halt``)."""

    kind: str
    call_id: str
    tool: str
    arguments: Any

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
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
    waits: tuple[Wait, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "status": self.status,
            "why": self.why,
            "last_error": self.last_error,
            "attempts": self.attempts,
            "lease_expired": self.lease_expired,
            "waits": [w.to_json() for w in self.waits],
        }


def new_run_id(agent_name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.:-]+", "-", agent_name).strip("-.")[:100] or "run"
    return f"{stem}-{uuid.uuid4().hex[:16]}"


def create_run(
    agent: Agent,
    input: Any,
    run_id: str | None,
    *,
    store: Store,
    derived_id: bool = False,
    seed: list[dict[str, Any]] | None = None,
    session_id: str | None = None,
) -> str:
    """Create a run and journal its start (input and agent fingerprint), first writer wins."""
    if input is None:
        raise ConfigError("a run needs an input", code="config.input_missing")
    if run_id is None:
        run_id = new_run_id(agent.name)
    validate_run_id(run_id, derived=derived_id)
    refuse_nul(input, "the run's input")  # bad input fails here, before anything is written
    existing = store.get_run(run_id)
    if existing is not None and existing.agent and existing.agent != agent.name:
        raise ConfigError(
            f"run {run_id!r} belongs to agent {existing.agent!r}; pick another run id",
            code="config.agent_mismatch",
        )
    store.create_run(
        RunInfo(
            run_id=run_id,
            agent=agent.name,
            status=QUEUED,
            input=input,
            session_id=session_id,
            fingerprint=agent.fingerprint(),
        )
    )
    body: dict[str, Any] = {
        "kind": "start",
        "agent": agent.name,
        "input": input,
        "fingerprint": agent.fingerprint(),
        # Which start of this run id: signed decisions bind it, so one made for a run that
        # was deleted and started again under the same id does not verify for the new one.
        "incarnation": new_incarnation(),
    }
    if seed:
        body["seed"] = seed
    start, _ = Journal(store).write(run_id, "run:start", body)
    if encode(start.get("input")) != encode(input):
        raise ConfigError(
            f"run {run_id!r} was started with a different input; use a new run id for a new "
            "request",
            code="config.input_mismatch",
        )
    return run_id


def get_run(run_id: str, *, store: Store | None = None) -> RunInfo:
    store = store or runtime.store()
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id!r}", code="run.not_found")
    return run


def resume(run_id: str, *, store: Store | None = None) -> RunResult:
    """Continue an unfinished run inline, with the input it recorded; a finished run
    returns its recorded answer. Only agent runs are driven: a session's own journal, or a
    run written only through ``Journal``, is refused (``run.not_an_agent_run``)."""
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    if run.kind != KIND_AGENT:
        raise ConfigError(
            f"run {run_id!r} is a {run.kind} journal, not an agent run: it is never driven",
            code="run.not_an_agent_run",
        )
    try:
        agent = get_agent(run.agent)
    except ConfigError as exc:
        _fail_undriven(store, run, exc)
        raise
    result = drive(agent, run_id, None, store=store, derived_id=True)
    if run.session_id is not None:
        from .sessions import record_answer

        start = Journal(store).get(run_id, "run:start")
        text = start.get("input") if start is not None else run.input
        record_answer(store, run_id, str(text), result.answer)
    return result


def _fail_undriven(store: Store, run: RunInfo, exc: ConfigError) -> None:
    """A run this process cannot drive at all (its agent is not loaded here) is marked
    failed with why, under its lease, so recovery does not hand it over again and again."""
    try:
        lease = HeldLease(store, run.run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        return  # someone is driving it: it is theirs to judge
    try:
        store.update_run(
            run.run_id,
            {
                "status": FAILED,
                "last_error": {"code": exc.code, "message": str(exc), "retryable": False},
                "attempts": run.attempts + 1,
            },
            fence=lease.token,
            if_status=NOT_TERMINAL_STATUSES,
        )
    finally:
        lease.release()


def drive_quietly(run_id: str, *, store: Store | None = None) -> str:
    """Drive a run as a worker does: a pause, a busy run or a lost lease is an outcome, not
    an error. Returns what happened (``finished``, ``paused``, ``busy``, ``lease_lost``,
    ``stopped``, ``failed``)."""
    try:
        resume(run_id, store=store)
    except Pause:
        return "paused"
    except RunBusy:
        return "busy"
    except LeaseLost:
        return "lease_lost"
    except DriveStopped:
        return "stopped"
    except DurableAgentsError:
        log.warning("run %s failed", run_id, exc_info=True)
        return "failed"
    return "finished"


def cancel(run_id: str, *, by: Any, reason: str = "", store: Store | None = None) -> None:
    """Cancel an unfinished run: it is never driven again; its pending approval requests
    are withdrawn and its open halts orphaned, so a decision or a resolution arriving later
    is refused. Refused (``RunBusy``) while a driver holds the run: cancel once it pauses.
    Cancelling again finishes a cancel that stopped half-way. ``by`` (a user object, a
    username or an ``identity.Actor``) must name an active user holding ``cancel_run``."""
    actor = identity.resolve(by)
    identity.require(actor, identity.OPERATE_RUNS, "cancel a run")
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    journal = Journal(store)
    if run.kind != KIND_AGENT:
        raise ConfigError(
            f"run {run_id!r} is a {run.kind} journal, not an agent run", code="run.not_an_agent_run"
        )
    if run.status == FINISHED or journal.get(run_id, "run:complete") is not None:
        raise ConfigError(
            f"run {run_id!r} already finished; nothing to cancel", code="run.finished"
        )
    if run.status != CANCELLED and journal.get(run_id, "run:cancelled") is None:
        try:
            lease = HeldLease(store, run_id, runtime.lease_ttl()).acquire()
        except RunBusy:
            raise RunBusy(
                f"run {run_id!r} is being driven right now; cancel it once it pauses or "
                "finishes its step",
                run_id=run_id,
            ) from None
        try:
            if journal.get(run_id, "run:complete") is not None:  # it finished meanwhile
                raise ConfigError(
                    f"run {run_id!r} already finished; nothing to cancel", code="run.finished"
                )
            _, inserted = journal.write(
                run_id,
                "run:cancelled",
                {"kind": "cancelled", "by": actor.username, "by_id": actor.id, "reason": reason},
                fence=lease.token,
                run_changes={"status": CANCELLED},
            )
        finally:
            lease.release()
        if inserted:
            store.log_action(identity.logged(actor, "cancel", run_id, "", {"reason": reason}))
    close_cancelled(store, run_id)


def pending(
    *,
    store: Store | None = None,
    limit: int = 1000,
    statuses: Sequence[str] | None = None,
) -> Sequence[PendingRun]:
    """Unfinished runs (of ``statuses``, if given), with why each one is not finished, what
    happens next (a failed run says whether recovery retries it, from when, or gave up), and
    the calls a person must decide or resolve."""
    store = store or runtime.store()
    policy = runtime.retry_policy()
    runs = store.list_unfinished(limit=limit, statuses=statuses)
    waits: dict[str, list[Wait]] = {}
    if any(r.status == AWAITING_APPROVAL for r in runs):
        for req in store.list_approval_requests():
            waits.setdefault(req.run_id, []).append(
                Wait("approval", req.call_id, req.tool_name, req.arguments)
            )
    if any(r.status == HALTED for r in runs):
        for halt in store.list_halts():
            waits.setdefault(halt.run_id, []).append(
                Wait("halt", halt.op_id, halt.tool_name, halt.arguments)
            )
    return [
        PendingRun(
            run_id=r.run_id,
            agent=r.agent,
            status=r.status,
            why=describe(r, policy)
            or (
                _WHY.get(r.status, r.status)
                + (f": {r.last_error.get('message')}" if r.last_error else "")
            ),
            last_error=dict(r.last_error) if r.last_error else None,
            attempts=r.attempts,
            lease_expired=r.lease_expired,
            waits=tuple(waits.get(r.run_id, ())),
        )
        for r in runs
    ]
