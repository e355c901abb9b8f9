"""Commands on runs: start, resume, hand over, cancel, pending. Glue (admin, API,
management commands, Celery tasks) calls these; it never edits a run's state itself, nor
writes the action log: a command given ``by=`` logs what it did."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import failpoints, identity, lifecycle, names, runtime, sagas, stops, tree
from ..approvals import withdraw_pending
from ..definition import AgentDefinition, RunResult
from ..errors import (
    ConfigError,
    Conflict,
    DriveStopped,
    DurableAgentsError,
    LeaseLost,
    NotFound,
    Pause,
    RunBusy,
    RunImported,
)
from ..imported import refuse_inert
from ..journal import Journal, header
from ..leases import HeldLease
from ..loop import announce_failure, drive
from ..ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    COMPENSATED,
    COMPENSATING,
    FAILED,
    FINISHED,
    HALTED,
    KIND_AGENT,
    QUEUED,
    RUNNING,
    SLEEPING,
    TERMINAL_STATUSES,
    THROTTLED,
    RunInfo,
    Store,
)
from ..records import encode, refuse_nul, validate_run_id
from ..registry import get_agent
from ..retry import describe
from ..telemetry import observer
from ..waits import open_waits

log = logging.getLogger("durable_agents")

_WHY: dict[str, str] = {
    QUEUED: "waiting for a driver",
    RUNNING: "being driven, or its driver died (recovered once its lease expires)",
    AWAITING_APPROVAL: "a tool call awaits a staff decision",
    AWAITING_INPUT: "waiting for input",
    SLEEPING: "sleeping until a timer fires",
    THROTTLED: "a limit is full: waiting for a slot or a rate permit",
    HALTED: "a side effect's outcome is unknown: a person must record it",
    COMPENSATING: "a saga aborted: its completed calls are being undone",
    FAILED: "the last attempt failed",
}


@dataclass(frozen=True)
class Wait:
    """One thing a paused run waits on: a call to approve (``approval``), a call whose
    outcome a person must record (``halt``), a question for a person (``interrupt``, with
    its ``name``, ``prompt`` and answer ``schema``) or a signal (``signal``, with its
    ``name`` and, with a timeout, its ``deadline``) or a sub-run it waits on (``sub_run``:
    the call that started it, its agent as ``tool``, its run id as ``name``)."""

    kind: str
    call_id: str
    tool: str
    arguments: Any
    name: str = ""
    prompt: str = ""
    schema: Any = None
    deadline: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
        }
        if self.name:
            out.update(
                name=self.name,
                prompt=self.prompt,
                schema=self.schema,
                deadline=self.deadline.isoformat() if self.deadline else None,
            )
        return out


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
    agent: AgentDefinition,
    input: Any,
    run_id: str | None,
    *,
    store: Store,
    derived_id: bool = False,
    seed: list[dict[str, Any]] | None = None,
    session_id: str | None = None,
    requester: str | None = None,
) -> str:
    """Create a run and journal its start (input and agent fingerprint, and ``requester``:
    who asked for it), first writer wins."""
    if input is None:
        raise ConfigError("a run needs an input", code="config.input_missing")
    if run_id is None:
        run_id = new_run_id(agent.name)
    validate_run_id(run_id, derived=derived_id)
    refuse_nul(input, "the run's input")  # bad input fails here, before anything is written
    body = names.start_body(agent.name, input, agent.fingerprint(), seed, requester=requester)
    run = lifecycle.created(
        QUEUED,
        run_id=run_id,
        agent=agent.name,
        input=input,
        session_id=session_id,
        fingerprint=agent.fingerprint(),
    )
    # A new run: its row, the header and run:start in one write, with no lease (a worker
    # takes it). A run that exists gets nothing from it and is checked below.
    records = [header(), (names.RUN_START, encode(body))]
    if store.start_run(run, holder=None, token=None, ttl=None, records=records) is not None:
        observer().run_created(run_id)
        return run_id
    existing = store.get_run(run_id)
    refuse_inert(existing, "start it again")
    if existing is not None and existing.agent and existing.agent != agent.name:
        raise Conflict(
            f"run {run_id!r} belongs to agent {existing.agent!r}; pick another run id",
            code="config.agent_mismatch",
        )
    store.create_run(run)  # a row deleted meanwhile
    start, _ = Journal(store).write(run_id, names.RUN_START, body)
    if encode(start.get("input")) != encode(input):
        raise Conflict(
            f"run {run_id!r} was started with a different input; use a new run id for a new "
            "request",
            code="config.input_mismatch",
        )
    return run_id


def start(
    agent: AgentDefinition,
    input: Any,
    run_id: str | None = None,
    *,
    store: Store | None = None,
    by: Any = None,
) -> str:
    """Create the run, record its input, and hand it to a driver; return its id at once.

    Inside a transaction, the run and its input are written in that transaction and the
    run is handed over only after it commits (a rolled-back start leaves nothing). The
    same id started again with the same input just hands it over again. Given ``by``, the
    start is logged as theirs."""
    actor = identity.resolve(by) if by is not None else None
    store = store or runtime.store()
    requester = actor.username if actor is not None else None
    run_id = create_run(agent, input, run_id, store=store, requester=requester)
    if actor is not None:
        store.log_action(identity.logged(actor, "start", run_id, "", {"agent": agent.name}))
    runtime.dispatch(run_id)
    return run_id


def get_run(run_id: str, *, store: Store | None = None) -> RunInfo:
    store = store or runtime.store()
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    return run


def hand_over(
    run_id: str, *, by: Any, via: str | None = None, store: Store | None = None
) -> RunInfo:
    """Resume as a person asks it: hand an unfinished run to a driver (a worker, with
    Celery dispatch), logged as ``by``'s ``resume``. A run paused on a person pauses again
    until that person acts. A finished, failed-for-good or cancelled run is refused
    (``run.<status>``). The log is written before the hand-over, so a hand-over that fails
    (a broker down) still says who asked; recovery or another resume picks the run up."""
    actor = identity.resolve(by)
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    refuse_inert(run, "resume it")
    if run.status in TERMINAL_STATUSES:
        raise Conflict(
            f"run {run.run_id!r} is {run.status}; there is nothing to resume",
            code=f"run.{run.status}",
        )
    payload = {"via": via} if via else {}
    store.log_action(identity.logged(actor, "resume", run.run_id, "", payload))
    runtime.dispatch(run.run_id)
    return run


def resume(run_id: str, *, store: Store | None = None) -> RunResult:
    """Continue an unfinished run inline, with the input it recorded; a finished run
    returns its recorded answer. Only agent runs are driven: a session's own journal, or a
    run written only through ``Journal``, is refused (``run.not_an_agent_run``)."""
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    refuse_inert(run, "drive it")
    if run.kind != KIND_AGENT:
        raise Conflict(
            f"run {run_id!r} is a {run.kind} journal, not an agent run: it is never driven",
            code="run.not_an_agent_run",
        )
    try:
        agent = get_agent(run.agent)
    except ConfigError as exc:
        _fail_undriven(store, run, exc)
        raise
    # Seen unfinished: lease, then read once (a finished row's run reads first, unleased).
    unfinished = run.status not in TERMINAL_STATUSES
    result = drive(agent, run_id, None, store=store, derived_id=True, lease_first=unfinished)
    if run.session_id is not None:
        start = Journal(store).get(run_id, names.RUN_START)
        text = start.get("input") if start is not None else run.input
        record_answer(store, run_id, str(text), result.answer)
    return result


def record_answer(store: Store, run_id: str, text: str, answer: str) -> None:
    """Add a finished turn's answer to its session's transcript (first writer wins)."""
    sid = names.session_of(run_id)
    if sid is None:
        return
    Journal(store).write(
        names.session_journal(sid),
        names.answer(run_id),
        {"kind": "answer", "run_id": run_id, "input": text, "answer": answer},
    )


def delete(
    run_id: str, *, by: Any, via: str | None = None, store: Store | None = None
) -> list[str]:
    """Delete a run and the runs below it (its sub-runs, theirs...), each with its journal,
    lease, approval requests and halts: the one exception to an append-only journal, logged
    as ``by``'s ``delete`` (the log row is keyed by run id only, so it stays; it names the
    sub-runs that went with it). Inside a transaction, the log and the deletes commit
    together. Returns the sub-runs deleted.

    A sub-run belongs to its tree: left behind, it would wait on a person for a parent that
    is gone, and run its effects for nobody (found by the simulator). The deepest go first,
    so a delete that stops half-way (outside a transaction) leaves no run without its parent:
    a parent whose sub-run is gone finds its id spent and fails the call, saying so. Deleting
    a sub-run alone is allowed, to the same effect on its parent."""
    actor = identity.resolve(by)
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    below = tree.runs_below(store, run_id)
    payload: dict[str, Any] = {"agent": run.agent, "status": run.status}
    if via:
        payload["via"] = via
    if below:
        payload["sub_runs"] = below
    store.log_action(identity.logged(actor, "delete", run_id, "", payload))
    for sub_run in reversed(below):
        store.delete_run(sub_run)
    store.delete_run(run_id)
    return below


def _fail_undriven(store: Store, run: RunInfo, exc: ConfigError) -> None:
    """A run this process cannot drive at all (its agent is not loaded here) is marked
    failed with why, under its lease, so recovery does not hand it over again and again."""
    try:
        lease = HeldLease(store, run.run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        return  # someone is driving it: it is theirs to judge
    error = {"code": exc.code, "message": str(exc), "retryable": False}
    try:
        failed = lifecycle.move(
            store,
            run.run_id,
            FAILED,
            lifecycle.PERSON,
            changes={"last_error": error, "attempts": run.attempts + 1},
            fence=lease.token,
        )
    finally:
        lease.release()
    if failed:
        announce_failure(store, run.run_id, run.agent, error, run.attempts + 1)


# What a drive came to, in one vocabulary for every driver (inline, Celery task).
FINISHED_OUTCOME = "finished"
PAUSED = "paused"
BUSY = "busy"
LEASE_LOST = "lease_lost"
STOPPED = "stopped"
CANCELLED_OUTCOME = "cancelled"  # the run was cancelled (or its drive recorded a cancel above)
FAILED_OUTCOME = "failed"
IMPORTED_OUTCOME = "imported"  # an inert import: never driven (``engine.imported``)


def outcome(exc: BaseException | None) -> str | None:
    """The word for how a drive ended: None when ``exc`` is a failure the caller must
    judge (a ``DurableAgentsError`` other than a coordination signal) or no engine error."""
    if exc is None:
        return FINISHED_OUTCOME
    if isinstance(exc, Pause):
        return PAUSED
    if isinstance(exc, RunBusy):
        return BUSY
    if isinstance(exc, LeaseLost):
        return LEASE_LOST
    if isinstance(exc, DriveStopped):
        return STOPPED
    if isinstance(exc, DurableAgentsError) and exc.code == "run.cancelled":
        return CANCELLED_OUTCOME
    if isinstance(exc, RunImported):
        return IMPORTED_OUTCOME
    return None


def drive_quietly(run_id: str, *, store: Store | None = None) -> str:
    """Drive a run as a worker does: a pause, a busy run, a lost lease or a cancel is an
    outcome, not an error. Returns what happened (``finished``, ``paused``, ``busy``,
    ``lease_lost``, ``stopped``, ``cancelled``, ``failed``, ``imported``)."""
    try:
        resume(run_id, store=store)
    except (Pause, DurableAgentsError) as exc:
        said = outcome(exc)
        if said is not None:
            return said
        log.warning("run %s failed", run_id, exc_info=True)
        return FAILED_OUTCOME
    return FINISHED_OUTCOME


# The inline driver ``runtime.dispatch`` falls back to without a dispatcher: handed in, so
# the runtime never imports the commands above it.
runtime.configure(inline_driver=drive_quietly)


def cancel(
    run_id: str,
    *,
    by: Any,
    reason: str = "",
    compensate: bool = False,
    store: Store | None = None,
) -> None:
    """Cancel an unfinished run: it is never driven again; its pending approval requests
    are withdrawn and its open halts orphaned, so a decision or a resolution arriving later
    is refused. Refused (``RunBusy``) while a driver holds the run: cancel once it pauses.
    ``by`` (a user object, a username or an ``identity.Actor``) must name an active user
    holding ``cancel_run``.

    The cancel holds for the run's whole tree (``stops``): its ``run:cancelled`` is recorded
    first, then each sub-run nobody drives is cancelled at once; one being driven finishes
    the call in flight and stops before its next step. Whatever stops this half-way (a
    crash), no run below can go on: its drive, a decision, an answer or a signal for it,
    recovery and the sweep finish its cancel. Cancelling again does too, at once.

    ``compensate=True`` ("cancel and compensate") aborts the run as a saga instead: the
    abort is journaled (``saga:abort``, cause ``saga.cancelled``), its pending approval
    requests are withdrawn and its completed compensable calls are undone by a driver, latest
    first, before it ends ``compensated`` (see docs/composition.md); its sub-runs roll back
    the same way. Its open halts stay open: an unknown outcome is a person's to record
    before anything is undone. A saga already rolling back cannot be cancelled half-way
    (``run.compensating``); asked to compensate again, it is handed to a driver."""
    actor = identity.resolve(by)
    identity.require(actor, identity.OPERATE_RUNS, "cancel a run")
    if not isinstance(compensate, bool):
        raise ConfigError("compensate must be True or False", code="config.invalid")
    store = store or runtime.store()
    run = get_run(run_id, store=store)
    refuse_inert(run, "cancel it")
    journal = Journal(store)
    if run.kind != KIND_AGENT:
        raise Conflict(
            f"run {run_id!r} is a {run.kind} journal, not an agent run", code="run.not_an_agent_run"
        )
    # (A finished sub-run its parent's saga rolls back is not: ``saga:abort`` follows its end.)
    if run.status == FINISHED or (
        journal.get(run_id, names.RUN_COMPLETE) is not None
        and journal.get(run_id, names.SAGA_ABORT) is None
    ):
        raise Conflict(f"run {run_id!r} already finished; nothing to cancel", code="run.finished")
    if compensate and not _has_undos(get_agent(run.agent)):
        raise Conflict(
            f"agent {run.agent!r} has no tool with an undo (compensate=); there is nothing "
            "to compensate: cancel the run instead",
            code="run.not_compensable",
        )
    if run.status == COMPENSATED or journal.get(run_id, names.RUN_COMPENSATED) is not None:
        raise Conflict(
            f"run {run_id!r} was already compensated; nothing to cancel", code="run.compensated"
        )
    cancelled = run.status == CANCELLED or journal.get(run_id, names.RUN_CANCELLED) is not None
    if not cancelled and journal.get(run_id, names.SAGA_ABORT) is not None:
        if compensate:  # asked again: the rollback is under way, hand it to a driver
            stops.stop_below(store, run_id)
            _hand_over_rollback(store, run_id)
            return
        raise Conflict(
            f"run {run_id!r} is undoing its completed calls (a saga that aborted); it cannot "
            "be cancelled half-way: let the rollback finish, resolving any halt it stops on",
            code="run.compensating",
        )
    if compensate:
        if cancelled:
            raise Conflict(
                f"run {run_id!r} was cancelled without compensation; its effects stay",
                code="run.cancelled",
            )
        _abort_saga(store, journal, run_id, actor, reason)
        failpoints.hit(f"after-cancel:{run_id}")
        stops.stop_below(store, run_id)
        _hand_over_rollback(store, run_id)
        return
    if not cancelled:
        inserted = _write_under_lease(
            store,
            journal,
            run_id,
            names.RUN_CANCELLED,
            names.cancelled_body(actor.username, actor.id, reason),
        )
        # What the cancel closes first, its log after: a store failing the log leaves no halt
        # open and no request pending on a cancelled run (found by the simulator).
        stops.close_cancelled(store, run_id)
        if inserted:
            store.log_action(identity.logged(actor, "cancel", run_id, "", {"reason": reason}))
    failpoints.hit(f"after-cancel:{run_id}")
    stops.close_cancelled(store, run_id)
    tree.hand_over_parent(store, journal.get(run_id, names.RUN_START))
    busy = stops.stop_below(store, run_id)
    if busy:
        log.info(
            "run %s cancelled; its sub-run(s) %s are being driven and stop before their next step",
            run_id,
            ", ".join(busy),
        )


def _hand_over_rollback(store: Store, run_id: str) -> None:
    """Hand a rolling-back run to a driver, unless it is halted, read right before: a driver
    (recovery's, taking the abort over) may have met a live claim since the abort and halted
    the run on it. A halted run is a person's: a driver would only halt it again; the
    resolution hands it over (found by the simulator)."""
    run = store.get_run(run_id)
    if run is not None and run.status != HALTED:
        runtime.dispatch(run_id)


def _loaded(agent_name: str) -> AgentDefinition | None:
    try:
        return get_agent(agent_name)
    except ConfigError:
        return None


def _has_undos(agent: AgentDefinition | None) -> bool:
    """Whether runs of ``agent`` may roll back, its sub-agents' undos included (an agent
    not loaded here: assume so)."""
    if agent is None:
        return True
    return sagas.has_undos(agent)


def _write_under_lease(
    store: Store,
    journal: Journal,
    run_id: str,
    name: str,
    body: dict[str, Any],
) -> bool:
    """Write a person's cancel-kind record under the run's own lease, so no driver is
    between steps meanwhile: refused while a driver holds the run, or once it finished.
    True if this call wrote it (False: it was there already)."""
    try:
        lease = HeldLease(store, run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        raise RunBusy(
            f"run {run_id!r} is being driven right now; cancel it once it pauses or "
            "finishes its step",
            run_id=run_id,
        ) from None
    try:
        if journal.get(run_id, names.RUN_COMPLETE) is not None:  # it finished meanwhile
            raise Conflict(
                f"run {run_id!r} already finished; nothing to cancel", code="run.finished"
            )
        # The other kind of stop landed since this one was checked (two people at once): a
        # plain cancel is never rolled back after all, and a rollback never cut short.
        if name == names.SAGA_ABORT and journal.get(run_id, names.RUN_CANCELLED) is not None:
            raise Conflict(
                f"run {run_id!r} was cancelled without compensation meanwhile; its effects stay",
                code="run.cancelled",
            )
        if name == names.RUN_CANCELLED and journal.get(run_id, names.SAGA_ABORT) is not None:
            raise Conflict(
                f"run {run_id!r} began undoing its completed calls meanwhile (cancel and "
                "compensate); it cannot be cancelled half-way",
                code="run.compensating",
            )
        _, inserted = lifecycle.record_in(
            journal, run_id, name, body, lifecycle.PERSON, fence=lease.token
        )
    finally:
        lease.release()
    return inserted


def _abort_saga(
    store: Store, journal: Journal, run_id: str, actor: Any, reason: str
) -> dict[str, Any]:
    """Journal a person's abort of a run (under its lease), withdraw its pending requests;
    return the cause."""
    message = f"cancelled by {actor.username}" + (f": {reason}" if reason else "")
    cause = {"code": "saga.cancelled", "message": message}
    inserted = _write_under_lease(
        store,
        journal,
        run_id,
        names.SAGA_ABORT,
        names.abort_body(cause, by=actor.username, by_id=actor.id, reason=reason),
    )
    if inserted:
        store.log_action(
            identity.logged(actor, "cancel", run_id, "", {"reason": reason, "compensate": True})
        )
    withdraw_pending(store, run_id)
    return cause


def _awaits_its_parent(run: RunInfo, waits: bool) -> str:
    """Why a fork's own sub-run waits with nothing of its own to wait on (``tree_forks``)."""
    if run.status != AWAITING_INPUT or waits or not (run.forked_from and run.parent_run_id):
        return ""
    return (
        f"a fork's own sub-run (a copy of {run.forked_from!r}): its parent "
        f"{run.parent_run_id!r} drives it when it runs"
    )


def _settled(journal: Journal, run_id: str, child: Any) -> bool:
    return journal.get(run_id, names.tool(str(child.get("call_id")))) is not None


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
    if any(r.status == THROTTLED for r in runs):
        for t in store.list_throttled(limit=limit):
            waits.setdefault(t.run_id, []).append(
                Wait("throttle", "", "", None, name=t.key, prompt=t.limit, deadline=t.retry_at)
            )
    if any(r.status == HALTED for r in runs):
        for halt in store.list_halts():
            waits.setdefault(halt.run_id, []).append(
                Wait("halt", halt.op_id, halt.tool_name, halt.arguments)
            )
    journal = Journal(store)
    for r in runs:
        if r.status in (AWAITING_INPUT, SLEEPING):
            for w in open_waits(journal.records(r.run_id)):
                waits.setdefault(r.run_id, []).append(
                    Wait(w.kind, w.call_id, w.tool, None, w.name, w.prompt, w.schema, w.deadline)
                )
        if r.status in tree.PARENT_PAUSE_STATUSES and not waits.get(r.run_id):
            # Paused on nothing of its own: a parent whose sub-run waits (the tree's pause).
            for rec in journal.records(r.run_id):
                if rec.name.startswith(names.CHILD) and not _settled(journal, r.run_id, rec):
                    waits.setdefault(r.run_id, []).append(
                        Wait(
                            "sub_run",
                            str(rec.get("call_id")),
                            str(rec.get("agent")),
                            None,
                            name=str(rec.get("run_id")),
                        )
                    )
    return [
        PendingRun(
            run_id=r.run_id,
            agent=r.agent,
            status=r.status,
            why=describe(r, policy)
            or _awaits_its_parent(r, bool(waits.get(r.run_id)))
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
