"""Sagas: a run that undoes what it did when it fails for good.

An agent made with ``saga=True`` runs as a transaction. When its run fails for good (an error
that is not retryable, or a retryable one with no attempt left; or a tool raised
``SagaAborted``) after at least one compensable call (``@tool(compensate=undo)``) completed:

1. the abort is journaled first (``saga:abort``: the cause and the calls to undo). From then
   on every drive of the run rolls back; none goes forward again.
2. each completed compensable call is undone, the latest completed first, as a side effect of
   its own: an attempt marker (``attempt:compensate:<call>:<k>``), then ``undo``, then its
   outcome (``compensate:<call>``). A crash between marker and outcome halts for a person, who
   records what the undo did; it is never run twice.
3. a call whose own outcome is unknown (a live attempt, halted) is never undone on a guess: the
   run halts on it, and the person's resolution decides (a recorded success is undone, an error
   is not).
4. the run ends ``compensated`` (``run:compensated``) and its drive raises ``SagaAborted`` with
   the cause. An undo that raised is recorded as failed (it ran: it is not run again); the run
   then ends ``failed`` with ``saga.compensation_failed``, for a person to finish by hand.

Sub-agents: a saga's rollback recurses into the tree. A call that started a sub-run
(``agent.as_tool()``) counts, at its own place in completion order, as one undo: the child
is rolled back in its own journal (``saga_tree``), its own sub-runs likewise.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from . import failpoints, lifecycle, names, runtime, tree
from .approvals import withdraw_pending
from .errors import (
    ApprovalPending,
    ChildPending,
    DurableAgentsError,
    InterruptPending,
    OutcomeUnknown,
    Pause,
    ProtocolError,
    SagaAborted,
    SignalPending,
    TimerPending,
    ToolOutcomeUnknown,
)
from .imported import foreign_sub_run
from .journal import Journal
from .ports import (
    AWAITING_INPUT,
    COMPENSATED,
    COMPENSATING,
    FAILED,
    HALT_OUTCOME_UNKNOWN,
    NOT_IMPORTED,
    HaltInfo,
    RunInfo,
    Store,
)
from .records import Record, encode
from .redact import error_text, unknown_reason
from .tools import Tool, ToolContext, call_key, json_result
from .transcript import RunState

# The loop's ``Driver``, which calls this module (so this module cannot import it).
Driver = Any

FAILED_CODE = "saga.compensation_failed"

# A call undone in the rollback: its id, its tool, its ``tool:<call>`` record (None for a
# sub-agent call with no outcome yet: its child had not ended).
Undo = tuple[str, Tool, Record | None]


def has_undos(agent: Any, _seen: frozenset[str] = frozenset()) -> bool:
    """Whether runs of ``agent`` may have something to undo: a tool with ``compensate=``, or
    a sub-agent tool whose agent has one (at any depth)."""
    for tool in agent.tools.values():
        if tool.safety.compensate is not None:
            return True
        child = tool.subagent_def
        if child is not None and child.name not in _seen and has_undos(child, _seen | {agent.name}):
            return True
    return False


def compensable(driver: Driver) -> list[Undo]:
    """The run's calls to undo, latest completed first (see ``_calls``)."""
    # Reread: a call's ``child:<call>`` is written by the call itself, beside the driver's log.
    return _calls(driver.state, driver.agent, driver.log.reread)


def _calls(state: RunState, agent: Any, get: Any) -> list[Undo]:
    """Each call of a tool with an undo whose outcome is a success (recorded by the run, or
    by a person resolving a halt), and each call that started a sub-run of an agent with
    undos (whatever the call's outcome: the child may have done things before it failed or
    paused), latest completed first; a sub-agent call with no outcome yet counts as the
    latest (its child was still going), and is rolled back even when its agent has no
    undos: a paused child must not go on (an approval of its call) once the saga aborted.
    A fork's calls that its source made are not among them (``inherited``)."""
    found = [undo for undo in _all_calls(state, agent, get) if not _inherited(state, undo, get)]
    found.sort(key=lambda item: item[2].seq if item[2] is not None else math.inf, reverse=True)
    return found


def inherited(state: RunState, agent: Any, get: Any) -> list[str]:
    """The calls with effects to undo that a fork copied from its source: they were made
    once, by the source, so undoing them is the source's to do (a saga rollback or a
    cancel-and-compensate of the source), never a fork's. Two forks rolling back, or a fork
    and its source, would otherwise undo one booking twice."""
    return [undo[0] for undo in _all_calls(state, agent, get) if _inherited(state, undo, get)]


def _all_calls(state: RunState, agent: Any, get: Any) -> list[Undo]:
    found: list[Undo] = []
    for turn in state.turns:
        for call in state.calls(turn):
            tool = agent.tools.get(call.name)
            if tool is None:
                continue
            rec = state.results.get(call.id)
            if tool.subagent_def is not None:
                # A sub-run still going (no outcome yet) is stopped whatever its agent: with
                # nothing to undo, its rollback only withdraws its requests and ends it.
                undoes = rec is None or has_undos(tool.subagent_def)
                if undoes and get(names.child(call.id)) is not None:
                    found.append((call.id, tool, rec))
            elif tool.safety.compensate is not None and rec is not None and not rec.get("is_error"):
                found.append((call.id, tool, rec))
    return found


def _inherited(state: RunState, undo: Undo, get: Any) -> bool:
    """Whether a call's effect happened in the run a fork was copied from: its result was
    copied (or patched in place), its first attempt was the source's (a result a person
    recorded in the fork for the source's attempt), or it started a sub-run the fork only
    references. A sub-run the fork made of its own (``forked_from``) is the fork's: rolling
    it back leaves alone, in turn, what that sub-run copied."""
    copied = copied_until(state)
    call_id, tool, rec = undo
    if tool.subagent_def is not None:
        child = get(names.child(call_id))
        return child is not None and child.seq < copied and not child.get("forked_from")
    if rec is not None and rec.seq < copied:
        return True
    first = get(names.attempt(call_id, 1))
    return first is not None and first.seq < copied


def copied_until(state: RunState) -> float:
    """The seq before which a fork's records are its source's (0 for a run that is not a
    fork; all of them for a fork whose copy never finished)."""
    if state.fork is None:
        return 0
    return state.copied_until if state.fork_done else math.inf


def effects_in(store: Store, agent: Any, run_id: str) -> list[str]:
    """The calls of run ``run_id`` (of ``agent``) whose effects are done and not undone, or
    may be (a live claim): undo-able calls, and sub-agent calls whose sub-runs have some."""
    log = Journal(store).open(run_id)
    state = RunState.of(log)
    live = state.live_attempts()
    left = []
    here: RunInfo | None = None
    for call_id, tool, _ in _calls(state, agent, log.get):
        if call_id in state.compensations:
            continue
        if tool.subagent_def is not None:
            child = sub_run_of(state, run_id, call_id)
            row = store.get_run(child)
            if row is None:
                continue
            if row.imported:
                here = here or store.get_run(run_id)
                if foreign_sub_run(row, here.imported if here is not None else NOT_IMPORTED):
                    continue  # an import at its sub-run's id: none of its effects are its own
            if effects_in(store, tool.subagent_def, child):
                left.append(call_id)
        else:
            left.append(call_id)
    copied = copied_until(state)
    for turn in state.turns:
        for call in state.calls(turn):
            tool = agent.tools.get(call.name)
            if tool is None or tool.safety.compensate is None or call.id not in live:
                continue
            first = log.get(names.attempt(call.id, 1))
            if first is None or first.seq > copied:  # not the source's attempt
                left.append(call.id)
    return left


def next_undo(state: RunState, agent: Any, get: Any) -> tuple[str, Tool] | None:
    """The call an aborted saga run undoes next (the one its rollback paused on, if it
    paused): the latest completed compensable call not undone yet."""
    for call_id, tool, _ in _calls(state, agent, get):
        if call_id not in state.compensations:
            return call_id, tool
    return None


def sub_run_of(state: RunState, run_id: str, call_id: str) -> str:
    """The sub-run a call started, as its ``child:<call>`` names it: a fork's copied call
    names its source's sub-run (referenced, not the fork's own), so the id is read when the
    record is in the state; a call's own ``child:`` (written beside the driver's log during
    this drive) always names the derived id."""
    return state.children.get(call_id) or tree.child_run_id(run_id, call_id)


def should_abort(driver: Driver, exc: DurableAgentsError) -> bool:
    """Whether ``exc`` ends a saga run for good, with something done to undo."""
    if not driver.saga or driver.state.saga_abort is not None:
        return False
    if exc.retryable:
        run = driver.store.get_run(driver.run_id)
        attempts = (run.attempts if run else 0) + 1
        if attempts < runtime.retry_policy().max_attempts:
            return False  # recovery tries again: not for good yet
    # Folded again: a claim this drive took (an outcome it could not learn) is in its log.
    return bool(effects_in(driver.store, driver.agent, driver.run_id))


def abort(driver: Driver, exc: DurableAgentsError) -> NoReturn:
    """Journal the abort (the decision comes before any undo), then roll back."""
    cause = {"code": exc.code, "message": str(exc)}
    plan = [call_id for call_id, _, _ in compensable(driver)]
    rec, _ = lifecycle.record(driver.log, names.SAGA_ABORT, names.abort_body(cause, calls=plan))
    driver.state.add(rec)
    failpoints.hit("after-saga-abort")
    rollback(driver)


def rollback(driver: Driver) -> NoReturn:
    """Undo the completed compensable calls, latest first, each at most once; halt on any
    outcome that is unknown (a forward call's or an undo's); roll each sub-run back; end
    ``compensated``."""
    # Folded again: the attempts this drive claimed are in its log, not yet in its state.
    driver.state = state = RunState.of(driver.log)
    abort_rec = state.saga_abort
    assert abort_rec is not None
    # Its gated calls will never run: nobody should decide them (also after a crash right
    # after the abort, which this rollback resumes).
    withdraw_pending(driver.store, driver.run_id)
    halts = driver.unknown_halts()
    if halts:
        driver._halt_run(halts)
    driver._hold(COMPENSATING)
    for call_id, tool, rec in compensable(driver):
        if call_id in state.compensations:
            continue
        if tool.subagent_def is not None:
            _undo_child(driver, call_id, tool, abort_rec)
            continue
        assert rec is not None
        halt = _undo(driver, call_id, tool, rec)
        if halt is not None:
            driver._halt_run([halt])
    _finish(driver, abort_rec)


# How a parent pauses on a sub-run's rollback: as the child did (the tree's pause).
_PAUSES: dict[str, type[Pause]] = {
    cls.__name__: cls
    for cls in (ApprovalPending, OutcomeUnknown, InterruptPending, SignalPending, TimerPending)
}


def _undo_child(driver: Driver, call_id: str, tool: Tool, abort_rec: Record) -> None:
    """Roll back the sub-run ``call_id`` started, then record it as the call's undo. No
    attempt marker: rolling a child back again goes on from the child's own journal."""
    child = sub_run_of(driver.state, driver.run_id, call_id)
    driver._check_continue()
    rollback_child = tool.subagent_rollback
    assert rollback_child is not None
    cause = dict(abort_rec.get("cause") or {})
    try:
        value, is_error = rollback_child(driver.store, driver.run_id, child, cause)
    except ChildPending as pause:
        status = str(pause.details.get("child_status") or AWAITING_INPUT)
        if status not in tree.PARENT_PAUSE_STATUSES:
            status = AWAITING_INPUT
        lifecycle.move(
            driver.store,
            driver.run_id,
            status,
            lifecycle.DRIVER,
            changes={"attempts": 0},
            only_from=COMPENSATING,
            fence=driver.fence,
        )
        kind = _PAUSES.get(str(pause.details.get("cause")), ChildPending)
        raise kind(
            pause.message,
            run_id=driver.run_id,
            children=[child],
            # Woken by the end of the child's rollback, not of its forward run (which may
            # have finished long ago): ``tree.rollback_may_go_on``.
            rollback=True,
            **dict(pause.details.get("child_details") or {}),
        ) from None
    op = names.compensate(call_id)
    written, _ = driver.log.write(
        op, names.tool_body(op, tool.name, value, is_error=is_error, compensates=call_id)
    )
    driver.state.add(written)
    failpoints.hit(f"after-compensate:{call_id}")


def _arguments(driver: Driver, call_id: str, tool: Tool, rec: Record) -> dict[str, Any]:
    """The arguments the call ran with, whatever its safety class: its result records them
    (an approver's edit included); a result recorded before it did leaves them to its
    attempt marker (a call that is not retry-safe), else to the decision that let it run
    (an edit of a retry-safe gated call), else to what the model asked."""
    if isinstance(rec.get("arguments"), dict):
        return dict(rec.get("arguments"))
    k = 1
    ran: Any = None
    while (marker := driver.log.get(names.attempt(call_id, k))) is not None:
        ran = marker.get("arguments") if marker.get("arguments") is not None else ran
        k += 1
    if ran is not None:
        return dict(ran)
    for turn in driver.state.turns:
        for call in driver.state.calls(turn):
            if call.id != call_id:
                continue
            args = tool.validate(call.arguments)
            if tool.safety.gated:
                decision, _ = driver._decision(call, args, tool)
                edited = (decision.get("edited") or {}) if decision is not None else {}
                if decision is not None and decision.get("approved") and edited:
                    return tool.validate(encode(edited.get("arguments")))
            return args
    raise ProtocolError(f"run {driver.run_id!r} has no call {call_id!r} to undo")


def _undo(driver: Driver, call_id: str, tool: Tool, rec: Record) -> HaltInfo | None:
    op = names.compensate(call_id)
    args = _arguments(driver, call_id, tool, rec)
    k, live = driver._attempt_state(op)
    if live is not None:
        return _halt(driver, op, tool.name, args, live, "contended")
    driver._check_continue()
    won, marker = driver.log.claim_attempt(
        names.attempt(op, k), extra={"tool": tool.name, "arguments": args, "compensates": call_id}
    )
    if not won:
        return _halt(driver, op, tool.name, args, marker, "contended")
    failpoints.hit(f"after-attempt:{op}")
    ctx = ToolContext(
        run_id=driver.run_id,
        call_id=op,
        tool_name=tool.name,
        idempotency_key=call_key(driver.origin, op),
    )
    undo = tool.safety.compensate
    assert undo is not None
    try:
        value, is_error = undo(tool.values(args), rec.get("result"), ctx), False
    except ToolOutcomeUnknown as exc:
        # The undo cannot tell whether it happened: its claim stays live, a person decides.
        return _halt(driver, op, tool.name, args, marker, HALT_OUTCOME_UNKNOWN, unknown_reason(exc))
    except Exception as exc:
        value, is_error = {"error": error_text(exc)}, True
    if not is_error:
        try:
            value = json_result(value)
        except ProtocolError as exc:
            value, is_error = (
                {"error": f"the undo ran, but returned a value JSON cannot hold: {exc}"},
                True,
            )
    written, _ = driver.log.write(
        op, names.tool_body(op, tool.name, value, is_error=is_error, compensates=call_id)
    )
    driver.state.add(written)
    failpoints.hit(f"after-compensate:{call_id}")
    return None


def _halt(
    driver: Driver,
    op: str,
    tool: str,
    args: Any,
    marker: Any,
    cause: str,
    reason: dict[str, Any] | None = None,
) -> HaltInfo:
    halt: HaltInfo = driver.halt_op(op, tool, args, marker, cause, reason)
    return halt


def _finish(driver: Driver, abort_rec: Record) -> NoReturn:
    state = driver.state
    cause = dict(abort_rec.get("cause") or {})
    undone = sorted(state.compensations.values(), key=lambda r: r.seq)
    failed = [r.name[len(names.COMPENSATE) :] for r in undone if r.get("is_error")]
    done = [r.name[len(names.COMPENSATE) :] for r in undone if not r.get("is_error")]
    kept = inherited(state, driver.agent, driver.log.reread)
    if failed:
        error = {
            "code": FAILED_CODE,
            "message": f"undo of call(s) {', '.join(failed)} failed; finish them by hand",
            "retryable": False,
            "cause": cause,
        }
        last_error: dict[str, Any] = error
    else:
        last_error = cause
    # What is still open on the run is moot once it is rolled back, as a cancel makes it: a
    # halt an expiry left for a person (an unknown outcome never gets here: the rollback
    # halts on it first). Before the end is written, so a crash in between leaves the
    # rollback to finish, not a halt open on an ended run (found by the simulator).
    driver.store.orphan_halts(driver.run_id)
    # Failed when an undo failed (``lifecycle.RECORD_MOVES``).
    rec, inserted = lifecycle.record(
        driver.log,
        names.RUN_COMPENSATED,
        {"kind": "compensated", "cause": cause, "undone": done, "failed": failed, "kept": kept},
        changes={"last_error": last_error},
        release=True,
    )
    if inserted:
        driver.lease.dropped()
    driver.state.add(rec)
    ended = aborted(driver.run_id, rec)
    if inserted:  # ``run_failed``: the run did not do what it was asked (``will_retry`` False)
        driver.announce_failed({"code": ended.code, "message": str(ended), "retryable": False})
    failpoints.hit(f"after-compensated:{driver.run_id}")
    tree.hand_over_parent(driver.store, state.start)
    raise ended


def aborted(run_id: str, rec: Record) -> SagaAborted:
    """The error a compensated run's drive raises, from its ``run:compensated`` record."""
    cause = dict(rec.get("cause") or {})
    failed = list(rec.get("failed") or ())
    undone = list(rec.get("undone") or ())
    kept = list(rec.get("kept") or ())
    # A fork leaves what its source did to the source: said, so nobody reads it as undone.
    left = f"; kept (its source's calls, the source's to undo): {', '.join(kept)}" if kept else ""
    if failed:
        return SagaAborted(
            f"saga run {run_id!r} aborted ({cause.get('message')}); undone: "
            f"{', '.join(undone) or 'nothing'}; the undo of {', '.join(failed)} failed: "
            f"finish it by hand{left}",
            code=FAILED_CODE,
            run_id=run_id,
            cause=cause,
            undone=undone,
            failed=failed,
            kept=kept,
        )
    return SagaAborted(
        f"saga run {run_id!r} aborted ({cause.get('message')}); undone, latest first: "
        f"{', '.join(undone) or 'nothing'}{left}",
        run_id=run_id,
        cause=cause,
        undone=undone,
        failed=failed,
        kept=kept,
    )


def repair(driver: Driver) -> NoReturn:
    """A run whose journal holds ``run:compensated`` is over: its row says so; raise."""
    rec = driver.state.compensated
    assert rec is not None
    withdraw_pending(driver.store, driver.run_id)  # one a rollback before this rule left
    status = FAILED if rec.get("failed") else COMPENSATED
    run = driver.store.get_run(driver.run_id)
    if run is not None and run.status != status:
        error = aborted(driver.run_id, rec)
        last = {"code": error.code, "message": str(error), "retryable": False}
        lifecycle.project(
            driver.store,
            driver.run_id,
            names.RUN_COMPENSATED,
            lifecycle.DRIVER,
            body=rec.body,
            changes={"last_error": last if status == FAILED else rec.get("cause")},
            fence=driver.fence,
        )
    raise aborted(driver.run_id, rec)
