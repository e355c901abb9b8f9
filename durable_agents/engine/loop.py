"""The durable agent loop.

Promises (see docs/guarantees.md):

* A model turn is journaled (``model:<n>``) before any of its tools run and is never
  generated again: a resume replays it and runs its calls that have no result.
* A tool result, once journaled (``tool:<call>``), is never re-run.
* A tool that is not retry-safe runs under an attempt claim (``attempt:<call>:<k>``). A drive
  that finds a live claim and no result halts (``OutcomeUnknown``) before it looks at
  anything else about the call — the tool's schema, whether the tool still exists, drift —
  so a halted run stays halted whatever was deployed, until a person records the outcome.
* Retry-safe tools (read-only, idempotent, keyed) simply run again.
* Every call gets exactly one result, fed back in call order.
* A gated call runs only with exactly the arguments its approval was for.
* Every model response that was billed is recorded: as a turn, or as ``@spend`` when it was
  discarded (rejected, truncated, or its write lost to another driver).
* The run row is a projection of the journal; a drive puts a row that disagrees back in step.

Scope: this resumes around tool calls, not inside one — except a call whose tool handed its
work off and journaled where it is (``engine.handles``): a resume waits on that work again.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from . import (
    deadlines,
    durability,
    events,
    failpoints,
    lifecycle,
    names,
    runtime,
    sagas,
    stops,
    tree,
)
from .approvals import approvals_short_of, arguments_tag, decision_name, policy_for
from .definition import AgentDefinition as Agent
from .definition import RunResult
from .errors import (
    AgentDrift,
    ApprovalPending,
    BudgetError,
    ChannelPending,
    ChildPending,
    ConfigError,
    Conflict,
    DriveStopped,
    DurableAgentsError,
    InterruptPending,
    LeaseLost,
    ModelError,
    OutcomeUnknown,
    Pause,
    ProtocolError,
    ResumeToolMissing,
    RunBusy,
    SagaAborted,
    SignalPending,
    StorageError,
    Throttled,
    TimerPending,
    ToolArgumentsError,
    ToolOutcomeUnknown,
    ToolResultError,
    WaitError,
)
from .fingerprint import diff
from .handles import CallRecords
from .imported import NEW_REQUEST_FIX, SUB_RUN_FIX, refuse_inert
from .journal import Journal, RunLog, header, now_ms
from .leases import HeldLease
from .model import (
    FINISH_FILTERED,
    FINISH_LENGTH,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from .ports import (
    APPROVAL_PENDING,
    APPROVAL_WITHDRAWN,
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    COMPENSATING,
    FAILED,
    FINISHED,
    HALT_EXPIRED,
    HALT_OUTCOME_UNKNOWN,
    HALTED,
    IMPORTED_INERT,
    NOT_IMPORTED,
    QUEUED,
    RUNNING,
    SLEEPING,
    ApprovalRequestInfo,
    Existing,
    HaltInfo,
    RunInfo,
    Store,
)
from .records import Record, decode, encode, refuse_nul, validate_run_id
from .redact import error_text, unknown_reason
from .rules import ALLOW, ASK, RuleContext, Rules
from .stops import close_cancelled
from .telemetry import observer, safety_class
from .throttle import DriveLimits, OwnSlotsFull
from .tools import Tool, ToolContext, json_result
from .transcript import RunState, outcome_of
from .waits import CallWaits, channel_has_message

log = logging.getLogger("durable_agents")


def drive(
    agent: Agent,
    run_id: str,
    input: Any,
    *,
    store: Store,
    derived_id: bool = False,
    seed: list[dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
    saga: bool = False,
    lease_first: bool = False,
) -> RunResult:
    """Drive ``run_id`` under a lease until it finishes, pauses or fails. ``saga``: start it
    as a saga (``agent.run_saga``), recorded in its ``run:start``; a run started otherwise
    is refused (``config.saga_mismatch``). ``lease_first``: the caller saw the run
    unfinished (a worker handed it): take the lease before the one read of the journal,
    not after it (which needs a second read, for what was written in between)."""
    validate_run_id(run_id, derived=derived_id)
    if input is not None:
        refuse_nul(input, "the run's input")
    check = getattr(store, "check_can_drive", None)
    if check is not None:
        check()
    journal = Journal(store)
    fresh, existing = _start_new(agent, run_id, input, store, journal, seed, meta, saga)
    while True:
        if fresh is not None:  # created, leased and started in one write: nothing to read
            lease, log, fresh = fresh[0], fresh[1], None
            try:
                with lease:
                    return Driver(
                        agent, store, run_id, lease, log, meta, started=True, saga=saga
                    ).drive(input, seed)
            except Pause as pause:
                if not _woken(store, journal, run_id, pause):
                    raise
                continue
        held = HeldLease(store, run_id, runtime.lease_ttl()).acquire() if lease_first else None
        lease_first = False  # a pass after a pause reads first, as usual
        # What the start attempt read of a run that exists serves the first pass only (a
        # pass with the lease taken first reads after it).
        loaded, existing = (existing if held is None else None), None
        try:
            return _drive_read(agent, run_id, input, store, journal, held, seed, meta, saga, loaded)
        except Pause as pause:
            if not _woken(store, journal, run_id, pause):
                raise


def _drive_read(
    agent: Agent,
    run_id: str,
    input: Any,
    store: Store,
    journal: Journal,
    held: HeldLease | None,
    seed: list[dict[str, Any]] | None,
    meta: dict[str, Any] | None,
    saga: bool,
    loaded: Existing | None = None,
) -> RunResult:
    """One pass of ``drive`` over a run that exists: read its journal once (or take what
    the start attempt read, ``loaded``), answer a finished run from it, else drive it under
    a lease (``held``: taken before the read)."""
    sub_run = bool((meta or {}).get("parent_run_id"))
    try:
        fence = held.token if held else None
        if loaded is not None:
            log = journal.open(run_id, fence=fence, loaded=loaded.entries)
        else:
            log = journal.open(run_id, fence=fence)  # the one full read
        complete = log.get(names.RUN_COMPLETE)
        # (A finished run that a saga rolls back is not: ``saga:abort`` came after its end.)
        if (
            complete is not None
            and complete.get("usage") is not None
            and log.get(names.SAGA_ABORT) is None
        ):
            # Finished is final: answer from the journal without leasing or calling anything
            # (or even folding the whole journal: the completion record holds the totals).
            done = RunState(start=log.get(names.RUN_START), complete=complete)
            Driver.check_start(agent, run_id, done, input)
            if input is not None and not sub_run:
                # A new request (an input given) is never answered from a file: an import
                # at the id a client retries with would say it was done here.
                refuse_inert(
                    store.get_run(run_id) if loaded is None else _row_of(run_id, loaded),
                    "answer a new request with its recorded answer",
                    where="here",
                    fix=NEW_REQUEST_FIX,
                )
            result = finished_result(run_id, done)
            repair_finished(store, run_id, result, loaded, sub_run=sub_run)
            if held is not None:
                held.release()
            return result
        state = RunState.of(log)
        if state.complete is not None and state.saga_abort is None:
            Driver.check_start(agent, run_id, state, input)
            result = finished_result(run_id, state)
            repair_finished(store, run_id, result, loaded, sub_run=sub_run)
            if held is not None:
                held.release()
            return result
        try:
            Driver.check_start(agent, run_id, state, input)
        except ConfigError as exc:
            _refuse_while_awaiting_approval(store, run_id, exc)
            raise
        if not len(log):
            store.create_run(
                lifecycle.created(
                    QUEUED,
                    run_id=run_id,
                    agent=agent.name,
                    input=input,
                    fingerprint=agent.fingerprint(),
                    **(meta or {}),
                )
            )
    except BaseException:
        if held is not None:
            held.release()
        raise
    with held or HeldLease(store, run_id, runtime.lease_ttl()) as lease:
        if held is None:
            log.fence = lease.token
            # Fenced writes committed before the lease was taken (a fenced insert holds a
            # share lock on the lease row until it commits): only later entries are new.
            log.refresh(since_last=True)
        return Driver(agent, store, run_id, lease, log, meta, saga=saga).drive(input, seed)


def _woken(store: Store, journal: Journal, run_id: str, pause: Pause) -> bool:
    """A decision, an answer, a signal, a message or a sub-run's end that landed while this
    driver still held the lease was handed to a driver that found the run busy: having
    released the lease, look once more."""
    wakes = list(pause.details.get("decisions") or ()) + list(pause.details.get("wakes") or ())
    if any(journal.get(run_id, name) is not None for name in wakes):
        return True
    children = list(pause.details.get("children") or ())
    if pause.details.get("rollback"):
        if any(tree.rollback_may_go_on(store, child) for child in children):
            return True
    elif tree.children_done(store, children):
        return True
    channels = pause.details.get("channels") or ()
    return bool(channels) and channel_has_message(journal.records(run_id), channels)


def _start_new(
    agent: Agent,
    run_id: str,
    input: Any,
    store: Store,
    journal: Journal,
    seed: list[dict[str, Any]] | None,
    meta: dict[str, Any] | None,
    saga: bool = False,
) -> tuple[tuple[HeldLease, RunLog] | None, Existing | None]:
    """Start a brand-new run in one write (``Store.start_or_load``): its row, already
    running, the lease, the header and ``run:start``. (None, what the same write read of
    it) when the run exists; (None, None) when there is no input to start it from: the
    drive then reads it as usual."""
    if input is None:
        return None, None
    lease = HeldLease(store, run_id, runtime.lease_ttl())
    fingerprint = agent.fingerprint()
    # A sub-run's parent and root, as the driver records them (``Driver.tree``).
    tree_ids = {
        key: (meta or {}).get(f"{key}_run_id")
        for key in ("parent", "root")
        if (meta or {}).get(f"{key}_run_id")
    }
    body = names.start_body(agent.name, input, fingerprint, seed, tree_ids, saga=saga)
    run = lifecycle.created(
        RUNNING,
        run_id=run_id,
        agent=agent.name,
        input=input,
        fingerprint=fingerprint,
        **(meta or {}),
    )
    entries, existing = store.start_or_load(
        run,
        holder=lease.holder,
        token=lease.token,
        ttl=lease.ttl,
        records=[header(), (names.RUN_START, encode(body))],
    )
    if entries is None:
        return None, existing
    observer().run_created(run_id)
    return (lease.adopt(), RunLog(journal, run_id, fence=lease.token, entries=entries)), None


def _refuse_while_awaiting_approval(store: Store, run_id: str, exc: ConfigError) -> None:
    """New input for a run that waits on a decision names the decision to make first."""
    if exc.code != "config.input_mismatch":
        return
    requests = store.list_approval_requests(run_id=run_id)
    if not requests:
        return
    calls = ", ".join(f"{r.call_id!r} ({r.tool_name})" for r in requests)
    raise ApprovalPending(
        f"run {run_id!r} awaits approval of {calls}; decide it with "
        "durable_agents.approve(...), in the admin, or with a command `python manage.py "
        "durable_agents runs` prints, before sending new input",
        run_id=run_id,
        calls=[r.call_id for r in requests],
    )


def _row_of(run_id: str, loaded: Existing) -> RunInfo:
    """The row fields ``refuse_inert`` reads (its id and where it came from), from what a start
    attempt read with the journal."""
    return RunInfo(run_id=run_id, imported=loaded.imported)


def repair_finished(
    store: Store,
    run_id: str,
    result: RunResult,
    loaded: Existing | None = None,
    *,
    sub_run: bool = False,
) -> None:
    """The journal is the truth: a run whose journal holds ``run:complete`` is finished, with
    that answer, whatever its row says (a row left behind by a crash or a racing writer).
    ``loaded``: the row as read with the journal (in the same snapshot), so not read again.
    ``sub_run``: the drive is a parent's call's, which never takes an inert import's answer
    (``run.imported``; ``imported.foreign_sub_run``)."""
    run: RunInfo | Existing | None = loaded if loaded is not None else store.get_run(run_id)
    if run is None or run.imported == IMPORTED_INERT:  # an inert import's row stays as it came
        if run is not None and sub_run:
            # An import that landed at the id after the parent looked: the row read with
            # the journal says so.
            refuse_inert(
                run if isinstance(run, RunInfo) else store.get_run(run_id),
                "take its answer for a parent's call",
                where="here",
                fix=SUB_RUN_FIX,
            )
        return
    if run.status == FINISHED and run.answer == result.answer and run.turns == result.turns:
        return
    log.warning("run %s: its row said %s; its journal says finished", run_id, run.status)
    lifecycle.project(
        store,
        run_id,
        names.RUN_COMPLETE,
        lifecycle.DRIVER,
        changes={
            "answer": result.answer,
            "turns": result.turns,
            "usage": result.usage.to_json(),
            "spend": result.spend.to_json(),
            "last_error": None,
            "attempts": 0,
        },
    )


def announce_halts(store: Store, agent: str, halts: list[HaltInfo]) -> None:
    """``run_halted`` for each halt this caller wrote (a halt row is written once per
    attempt, so a drive finding the run halted again announces nothing)."""
    for halt in halts:
        events.announce(
            store,
            events.RUN_HALTED,
            run_id=halt.run_id,
            agent=agent,
            call_id=halt.op_id,
            tool=halt.tool_name,
            cause=halt.cause,
        )


def announce_failure(
    store: Store, run_id: str, agent: str, error: dict[str, Any], attempts: int
) -> None:
    """``run_failed`` for a failure just projected onto the run row; ``will_retry`` says
    whether recovery hands the run over again (a retryable error, attempts left)."""
    will_retry = bool(error.get("retryable")) and attempts < runtime.retry_policy().max_attempts
    events.announce(
        store,
        events.RUN_FAILED,
        run_id=run_id,
        agent=agent,
        error=dict(error),
        attempts=attempts,
        will_retry=will_retry,
    )


def unknown_outcomes(state: RunState, run_id: str) -> list[HaltInfo]:
    """One halt per op of ``state`` whose attempt is live (see ``RunState.live_attempts``),
    described from the attempt marker (which records the tool and arguments it ran with)."""
    live = state.live_attempts()
    if not live:
        return []
    calls = {c.id: c for turn in state.turns for c in state.calls(turn)}
    halts = []
    for op, marker in live.items():
        call = calls.get(op)
        arguments = marker.get("arguments")
        if arguments is None and call is not None:
            arguments = _decoded(call.arguments)
        tool_name = str(marker.get("tool") or (call.name if call is not None else ""))
        said = state.unknown.get(marker.name)
        if said is not None:  # the tool raised ToolOutcomeUnknown: keep what it said
            reason = dict(said.get("reason") or {})
            halts.append(
                halt_info(run_id, op, tool_name, arguments, marker, HALT_OUTCOME_UNKNOWN, reason)
            )
        else:
            halts.append(halt_info(run_id, op, tool_name, arguments, marker, "crashed"))
    return halts


def halt_info(
    run_id: str,
    op: str,
    tool_name: str,
    arguments: Any,
    marker: Any,
    cause: str,
    reason: dict[str, Any] | None = None,
) -> HaltInfo:
    attempted = getattr(marker, "created_at", None)  # the store's clock
    if attempted is None and marker is not None and marker.get("attempted_at"):
        attempted = datetime.fromtimestamp(marker.get("attempted_at") / 1000, tz=UTC)
    return HaltInfo(
        run_id=run_id,
        op_id=op,
        tool_name=tool_name,
        arguments=arguments,
        attempt=marker.name if marker is not None else "",
        attempted_at=attempted,
        cause=cause,
        reason=reason,
    )


def finished_result(run_id: str, state: RunState) -> RunResult:
    """A finished run's result, from its `run:complete` record (which holds the totals)."""
    complete = state.complete
    assert complete is not None
    usage, spend = complete.get("usage"), complete.get("spend")
    return RunResult(
        run_id=run_id,
        answer=str(complete.get("answer") or ""),
        usage=Usage.from_json(usage) if usage is not None else state.usage(),
        spend=Usage.from_json(spend) if spend is not None else state.spend(),
        turns=int(complete.get("turns") or len(state.turns)),
    )


@dataclass
class _Gate:
    call: ToolCall
    tool: Tool
    args: dict[str, Any]
    # Set when this call was approved for other arguments than today's code would run.
    previous: Any = None
    # The approval it runs under (a gated call), looked at again after its claim.
    approval: Record | None = None
    # The policy a person decides it under: the one its rule journaled (``rule:<call>``).
    policy: dict[str, Any] | None = None
    # A call whose live attempt waits on a journaled handle: run again without a new claim.
    resuming: bool = False


class _DeniedMeanwhile(Exception):
    """A denial of a gated call was journaled after the drive read its approval and before
    the drive claimed it (``Driver._prepare``): the claim is retired, the denial stands."""

    def __init__(self, denial: Record) -> None:
        super().__init__(denial.name)
        self.denial = denial


# Caller errors a drive refuses without touching the run (nothing about the run is wrong).
_CALLER_ERRORS = frozenset(
    {"config.input_mismatch", "config.agent_mismatch", "config.saga_mismatch"}
)


class Driver:
    """One drive of one run, by one process, under one lease."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        run_id: str,
        lease: HeldLease,
        log: RunLog,
        meta: dict[str, Any] | None = None,
        *,
        started: bool = False,
        saga: bool = False,
    ) -> None:
        # ``started``: this drive created the run, running, with its `run:start`.
        self.started = started
        # ``saga``: asked to run as a saga (``agent.run_saga``), whatever the agent says.
        self.saga_asked = saga
        self.agent = agent
        # A sub-run's parent and root (``subagents``), recorded in its ``run:start``.
        self.tree: dict[str, Any] = {
            key: (meta or {}).get(f"{key}_run_id")
            for key in ("parent", "root")
            if (meta or {}).get(f"{key}_run_id")
        }
        self.store = store
        self.run_id = run_id
        self.lease = lease
        self.fence = lease.token
        self.log = log
        self.state = RunState.of(log)
        self._ancestors: list[tuple[str, int, Usage]] | None = None  # ``_ancestor_budgets``
        self._imported: str | None = None  # this run's ``RunInfo.imported`` (``_subtree``)
        # A paused parent queued by a one-write finish that then stored nothing: the finish
        # written one by one must still hand it over (queueing it again finds it queued).
        self._queued_parent: str | None = None
        self._fresh_calls: set[str] = set()  # calls of model turns this drive recorded
        # What each model turn records of the tools it was shown (``tools_digest`` of the
        # specs: replay compares it; computed once per agent)
        self._tools_digest = agent.tools_digest()
        # Idempotency keys derive from the call's origin: the run a fork was taken from (and
        # its origin), so a run and all its forks give one call one key.
        fork = self.state.fork
        self.origin = str((fork.get("origin") or fork.get("source")) if fork else run_id)
        # What this drive's tools returned after its lease was lost: kept as evidence.
        self._fenced_out: LeaseLost | None = None
        self._unknown: dict[str, tuple[_Gate, int, Any]] = {}
        # The waits this turn's calls paused on, and a wait refused as misuse.
        self._pauses: list[InterruptPending | SignalPending | TimerPending] = []
        self._misuse: WaitError | None = None
        # The store failing under a tool (its waits read and write the journal): the drive's
        # failure, retried; never the tool's result.
        self._store_failed: StorageError | None = None
        # Requests pending for other arguments than the journaled decision this drive acts
        # on (``_mark_decided``), by call: withdrawn once the call's result is journaled.
        self._moot: dict[str, Any] = {}
        # The runs above a sub-run, nearest first (``_check_tree``), once read.
        self._above: list[str] | None = None
        # A tool of a saga that raised ``SagaAborted``: the run aborts once the turn settles.
        self._abort: SagaAborted | None = None
        # The slots and rate permits this drive takes (``engine.throttle``).
        self.limits = DriveLimits(store, run_id, agent, self.fence)
        self._tool_slots: dict[str, str | None] = {}  # call id -> the tool slot's holder

    @property
    def saga(self) -> bool:
        """Whether this run is a saga: its agent is one, or its ``run:start`` says it was
        started as one (``agent.run_saga``), so every later drive keeps it one."""
        start = self.state.start
        return self.agent.saga or bool(start is not None and start.get("saga"))

    @staticmethod
    def check_start(agent: Agent, run_id: str, state: RunState, input: Any) -> None:
        """Refuse a drive by another agent, or with another input than the run recorded."""
        start = state.start
        if start is None:
            return
        if start.get("agent") != agent.name:
            raise Conflict(
                f"run {run_id!r} belongs to agent {start.get('agent')!r}, not {agent.name!r}",
                code="config.agent_mismatch",
            )
        if input is not None and encode(input) != encode(start.get("input")):
            raise Conflict(
                f"run {run_id!r} was started with a different input; resume it with the same "
                "input (or none), or use a new run id for a new request",
                code="config.input_mismatch",
            )

    # -- entry ------------------------------------------------------------------------

    def drive(self, input: Any, seed: list[dict[str, Any]] | None) -> RunResult:
        with observer().drive(self.run_id, self.agent.name):
            return self._drive(input, seed)

    def _drive(self, input: Any, seed: list[dict[str, Any]] | None) -> RunResult:
        # Every way a drive ends leaves a row that agrees with the journal: finished, paused,
        # cancelled, or failed with its error (recovery counts failures and stops).
        try:
            if self.state.start is None:
                self._refuse_an_uncopied_fork()
            self._begin(input, seed)
            if self.saga_asked and not self.saga:
                raise Conflict(
                    f"run {self.run_id!r} was started without saga mode; run_saga cannot "
                    "make it a saga now: use a new run id",
                    code="config.saga_mismatch",
                )
            if self.state.complete is not None and self.state.saga_abort is None:
                result = finished_result(self.run_id, self.state)
                repair_finished(self.store, self.run_id, result)
                return result
            if self.state.cancelled is not None:
                close_cancelled(self.store, self.run_id, self.fence)
                raise Conflict(
                    f"run {self.run_id!r} was cancelled; start a new run to try again",
                    code="run.cancelled",
                )
            if self.state.compensated is not None:
                sagas.repair(self)
            if self.state.fork is not None and not self.state.fork_done:
                raise ConfigError(
                    f"run {self.run_id!r} is a fork that was not completely written (its "
                    "journal was being copied when the process stopped); delete it and fork "
                    "again",
                    code="history.fork_incomplete",
                )
            if self.state.saga_abort is None:
                # A stop above (a cancel or an abort of an ancestor) comes before anything of
                # the run's own, its halts included: a cancel orphans them, a rollback halts.
                self._check_tree()
            # Before the tools, their schemas or the agent's drift are even looked at.
            self._halt_on_unknown_outcomes()
            self._close_settled_halts()
            if self.state.saga_abort is not None:
                sagas.rollback(self)  # an aborted saga only rolls back, crash or not
            self._check_drift()
            if not self.started:
                self._hold(RUNNING)
            return self._loop()
        except stops.TreeStopped as stopped:
            self._obey(stopped.stop)
        except Throttled as throttled:
            self.limits.settle(throttled)
            raise
        except Pause:
            raise
        except (LeaseLost, RunBusy):
            raise  # the run is another driver's now; its row is not ours to touch
        except DriveStopped:
            # A rollback stays one: recovery hands a compensating run over, and a queued one
            # would read as going forward.
            self._hold(QUEUED if self.state.saga_abort is None else COMPENSATING)
            raise
        except DurableAgentsError as exc:
            if self.state.compensated is not None:
                raise  # the saga's end (``sagas.repair``): its row is already in step
            if exc.code not in _CALLER_ERRORS and exc.code != "run.cancelled":
                if sagas.should_abort(self, exc):
                    sagas.abort(self, exc)
                self._fail(exc.code, str(exc), retryable=exc.retryable)
                failpoints.hit(f"after-failed:{self.run_id}")
                if not exc.retryable or self._retries_exhausted():
                    # Failed for good: its parent's call has its outcome, an error.
                    tree.hand_over_parent(self.store, self.state.start)
            raise
        except Exception as exc:
            internal = DurableAgentsError(error_text(exc), code="internal")
            if sagas.should_abort(self, internal):
                sagas.abort(self, internal)
            self._fail("internal", error_text(exc), retryable=False)
            raise
        finally:
            self.limits.release()

    def _refuse_an_uncopied_fork(self) -> None:
        """A fork's row exists before its journal: one with nothing copied yet is not a new
        run to start from its input (that would repeat its source's steps)."""
        if self.state.fork is not None:
            return
        run = self.store.get_run(self.run_id)
        if run is not None and run.forked_from:
            raise ConfigError(
                f"run {self.run_id!r} is a fork of {run.forked_from!r} whose journal was never "
                "copied (the process forking it stopped first); delete it and fork again",
                code="history.fork_incomplete",
            )

    def _begin(self, input: Any, seed: list[dict[str, Any]] | None) -> None:
        start = self.state.start
        if self.started:
            failpoints.hit("after-start")
            return
        if start is None:
            if input is None:  # a resume: the row holds the input (and a sub-run's place)
                run = self.store.get_run(self.run_id)
                input = run.input if run is not None else None
                if run is not None and run.parent_run_id and not self.tree:
                    self.tree = {"parent": run.parent_run_id, "root": run.root_run_id}
            if input is None:
                raise ConfigError(
                    f"run {self.run_id!r} has no recorded input; start it with an input",
                    code="config.input_missing",
                )
            body = names.start_body(
                self.agent.name,
                input,
                self.agent.fingerprint(),
                seed,
                self.tree,
                saga=self.saga_asked,
            )
            rec, _ = self.log.write(names.RUN_START, body)
            self.state.add(rec)
            failpoints.hit("after-start")
            return
        self.check_start(self.agent, self.run_id, self.state, input)

    def _halt_on_unknown_outcomes(self) -> None:
        """Halt on every op whose attempt is live: claimed, with no outcome recorded and no
        record that it never started. Its effect may have happened; only a person may say.
        Except a call that handed its work off and journaled where it is (``_resumable``):
        its tool waits on that work again when the call is settled."""
        halts = unknown_outcomes(self.state, self.run_id)
        if halts and self.state.handles:
            live = self.state.live_attempts()
            halts = [h for h in halts if not self._resumable(h.op_id, live.get(h.op_id))]
        if halts:
            self._halt_run(halts)

    def _resumable(self, op: str, marker: Any) -> bool:
        """Whether the live attempt ``marker`` of call ``op`` is resumed instead of halted:
        its tool journaled a handle (``engine.handles``), has not said the outcome is
        unknown since, and is still a tool that resumes from a handle."""
        if marker is None or op not in self.state.handles or marker.name in self.state.unknown:
            return False
        tool = self.agent.tools.get(str(marker.get("tool") or ""))
        return tool is not None and tool.resumes

    def _close_settled_halts(self) -> None:
        """Close the open halts of calls the journal holds an outcome for: a resolution that
        stopped between its record and its halt row is finished by the next drive."""
        reconciled = {op for op, rec in self.state.results.items() if rec.get("reconciled")}
        if not reconciled:
            return  # only a resolution records an outcome over a halt
        for request in self.store.list_approval_requests(run_id=self.run_id):
            if request.call_id in reconciled:
                # Pending for a call a person recorded the outcome of (asked about other
                # arguments while a drive that lost the run was inside it): nobody runs the
                # call again, so nobody may approve it (found by the simulator).
                lifecycle.move_request(
                    self.store, self.run_id, request.call_id, APPROVAL_WITHDRAWN, lifecycle.DRIVER
                )
        for halt in self.store.list_halts(run_id=self.run_id):
            rec = self.state.results.get(halt.op_id)
            if rec is not None:
                by = rec.get("by")
                self.store.resolve_halt_row(
                    self.run_id, halt.op_id, outcome_of(rec), str(by) if by else None
                )

    def _check_drift(self) -> None:
        recorded = self.state.start.get("fingerprint") if self.state.start else None
        if not recorded:
            return
        current = self.agent.fingerprint()
        changes = diff(recorded, current)
        if not changes:
            return
        policy = self.agent.on_drift or runtime.on_drift()
        if policy == "ignore":
            return
        if policy == "error":
            raise AgentDrift(
                f"run {self.run_id!r} started under a different agent {self.agent.name!r} "
                f"({_describe(changes)}); deploy the agent it started with, or set "
                "on_drift='warn'",
                changes=changes,
            )
        log.warning("run %s resumes under a changed agent: %s", self.run_id, _describe(changes))
        self.log.write(
            names.drift(current["hash"]), {"kind": "drift", "changes": changes, "to": current}
        )

    # -- the loop ---------------------------------------------------------------------

    def _loop(self) -> RunResult:
        while True:
            turns = self.state.turns
            if turns:
                last = turns[-1]
                calls = self.state.calls(last)
                if not calls and len(turns) not in self.state.user_after:
                    return self._finish(last)
                self._settle(calls)
            if len(turns) >= self.agent.max_turns:
                raise BudgetError(
                    f"run {self.run_id!r} used its {self.agent.max_turns} turns without an "
                    "answer; raise max_turns or change the instructions",
                    code="budget.max_turns",
                )
            self._check_budget()
            n = len(turns) + 1
            with observer().model_turn(self.run_id, n) as span:
                response = self._call_model(n)
                span.set(finish=response.finish, model=response.model, usage=response.usage)
            if not response.message.tool_calls and n not in self.state.user_after:
                result = self._finish_with_turn(n, response)
                if result is not None:
                    return result
            self._record_turn(n, response)

    def _check_budget(self) -> None:
        budget = self.agent.token_budget
        ancestors = self._ancestor_budgets()
        if budget is None and not ancestors:
            return
        spent = self.state.spend() + self._subtree()[1]
        if budget is not None and spent.total_tokens >= budget:
            raise BudgetError(
                f"run {self.run_id!r} spent {spent.total_tokens} tokens of its budget of "
                f"{budget} (its sub-runs' included); raise token_budget to continue",
                code="budget.tokens",
            )
        # A sub-run stops where an ancestor's budget does: the tree's spend, counted as the
        # ancestor counts it, may not pass it (see docs/composition.md, "Spend and budgets").
        for ancestor, limit, outside in ancestors:
            total = (outside + spent).total_tokens
            if total >= limit:
                raise BudgetError(
                    f"run {self.run_id!r} stops: its tree under {ancestor!r} spent {total} "
                    f"tokens of that run's budget of {limit}; raise the token_budget of "
                    f"{ancestor!r}'s agent to continue",
                    code="budget.tokens",
                    budget_run_id=ancestor,
                )

    def _ancestor_budgets(self) -> list[tuple[str, int, Usage]]:
        """The budgets of this sub-run's ancestors, read once per drive (none, and no read,
        for a run without a parent)."""
        if self._ancestors is None:
            parent = self.state.start.get("parent") if self.state.start is not None else None
            self._ancestors = (
                tree.ancestor_budgets(self.store, self.run_id, str(parent)) if parent else []
            )
        return self._ancestors

    def _subtree(self) -> tuple[Usage, Usage]:
        """What this run's sub-runs (``agent.as_tool()`` calls) used and spent: it rolls up
        into this run's totals and counts against its token budget."""
        if not any(t.subagent for t in self.agent.tools.values()):
            return Usage(), Usage()  # the common case: no sub-agents, nothing to read
        # A fork's call may reference its source's ended child (``child:<call>``, copied).
        children = [
            self.state.children.get(call.id) or tree.child_run_id(self.run_id, call.id)
            for turn in self.state.turns
            for call in self.state.calls(turn)
            if (tool := self.agent.tools.get(call.name)) is not None and tool.subagent
        ]
        if not children:
            return Usage(), Usage()
        if self._imported is None:  # whether an import is this run's sub-run: read once
            row = self.store.get_run(self.run_id)
            self._imported = row.imported if row is not None else NOT_IMPORTED
        return tree.subtree_totals(self.store, children, self._imported)

    def _request(self) -> ModelRequest:
        return ModelRequest(
            instructions=self.state.instructions(self.agent.instructions),
            messages=self.state.messages(),
            tools=self.agent.tool_specs(),
        )

    def _call_model(self, n: int) -> ModelResponse:
        retry = self.agent.model_retry
        request = self._request()
        for attempt in range(1, retry.max_attempts + 1):
            self._check_continue()
            self._check_tree()
            if attempt > 1:
                self._check_budget()  # the failed attempts' spend counts too
            response: ModelResponse | None = None
            self.limits.before_model()
            try:
                response = self.agent.model.generate(request)
                self._check_response(response)
                return response
            except ModelError as exc:
                # A response that arrived was billed, whatever is wrong with it.
                usage = _billed(response.usage) if response is not None else None
                usage = usage or exc.details.get("usage")
                if usage:
                    self._record_spend(n, usage, exc.code)
                if not exc.retryable or attempt == retry.max_attempts:
                    raise
                log.info("model call for run %s failed (%s); retrying", self.run_id, exc.code)
                runtime.sleep(retry.delay(attempt))
        raise AssertionError("unreachable")

    def _check_response(self, response: ModelResponse) -> None:
        message = response.message
        if response.finish in (FINISH_LENGTH, FINISH_FILTERED):
            if response.finish == FINISH_LENGTH:
                raise ModelError(
                    "the model's output was cut off at its token limit, so it is not an "
                    "answer; raise the adapter's max_tokens",
                    code="model.output_truncated",
                )
            raise ModelError(
                "the model's output was stopped by a content filter or refusal; it was not "
                "recorded",
                code="model.output_filtered",
                retryable=True,
            )
        if message.role != "assistant":
            raise ModelError(
                "the model returned a non-assistant message", code="model.protocol", retryable=True
            )
        usage = response.usage
        if (
            min(
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
            )
            < 0
        ):
            raise ModelError(
                "the model reported negative token usage", code="model.protocol", retryable=True
            )
        earlier = self.state.call_ids() if message.tool_calls else set()
        seen: set[str] = set()
        for call in message.tool_calls:
            if not call.id or call.id in seen or call.id in earlier:
                # The loop keys each result by its call id: a missing or reused id would pass
                # a call off as done. The turn is not journaled; a fresh attempt can fix it.
                raise ModelError(
                    f"the model's tool call id {call.id!r} is missing or reused",
                    code="model.tool_call_id",
                    retryable=True,
                )
            seen.add(call.id)

    def _record_spend(self, n: int, usage: dict[str, int], why: str) -> None:
        """Record what a discarded response cost. A driver that lost its lease records it
        anyway, unfenced (a spend record changes no result), then stops."""
        name = names.spend(n, uuid.uuid4().hex[:12])
        body = {"kind": "spend", "usage": usage, "why": why}
        total = self.state.spend() + Usage.from_json(usage) + self._subtree()[1]
        lag = durability.spend_may_lag(self.agent.durability)
        try:
            rec, _ = self.log.write(
                name, body, run_changes={"spend": total.to_json()}, sync=not lag
            )
        except LeaseLost:
            self.log.journal.write(self.run_id, name, body, sync=not lag)
            raise
        self.state.add(rec)

    def _record_turn(self, n: int, response: ModelResponse) -> None:
        sub_usage, sub_spend = self._subtree()
        usage = self.state.usage() + response.usage + sub_usage
        spend = self.state.spend() + response.usage + sub_spend
        try:
            rec, inserted = self._write_turn(n, response, usage, spend)
        except LeaseLost:
            billed = _billed(response.usage)
            if billed:
                self.log.journal.write(
                    self.run_id,
                    names.spend(n, uuid.uuid4().hex[:12]),
                    {"kind": "spend", "usage": billed, "why": "lease_lost"},
                    sync=not durability.spend_may_lag(self.agent.durability),
                )
            raise
        self.state.add(rec)
        if inserted:
            # Calls nobody but this drive knows of: no request was asked, so no person (nor
            # another driver: it would have fenced this one out) wrote a decision on them.
            self._fresh_calls.update(c.id for c in self.state.calls(rec))
        billed = _billed(response.usage)
        if not inserted and billed:  # another driver's turn n stands; this one was billed too
            self._record_spend(n, billed, "lost_race")
        failpoints.hit(f"after-model:{n}")

    def _turn_body(self, response: ModelResponse) -> dict[str, Any]:
        return {
            "kind": "model",
            "message": response.message.to_json(),
            "usage": response.usage.to_json(),
            "finish": response.finish,
            "raw_finish": response.raw_finish,
            "model": response.model or self.agent.model_id,
            "prompt_digest": self.agent.fingerprint()["instructions"],
            "tools_digest": self._tools_digest,
        }

    def _write_turn(
        self, n: int, response: ModelResponse, usage: Usage, spend: Usage
    ) -> tuple[Record, bool]:
        return self.log.write(
            names.model(n),
            self._turn_body(response),
            # A recorded turn is progress: failures in a row start again from zero.
            run_changes={
                "turns": n,
                "usage": usage.to_json(),
                "spend": spend.to_json(),
                "attempts": 0,
                "last_error": None,
            },
            sync=not durability.turn_may_lag(
                self.agent.durability, response.message.tool_calls, self.agent.tools
            ),
        )

    @staticmethod
    def _completion(answer: Any, turns: int, usage: Usage, spend: Usage) -> dict[str, Any]:
        """``run:complete`` (the lifecycle projects the run row from it)."""
        totals = {"turns": turns, "usage": usage.to_json(), "spend": spend.to_json()}
        return {"kind": "complete", "answer": answer, **totals}

    def _finish(self, last: Any) -> RunResult:
        sub_usage, sub_spend = self._subtree()
        usage, spend = self.state.usage() + sub_usage, self.state.spend() + sub_spend
        parent = tree.queue_parent(self.store, self.state.start) or self._queued_parent
        failpoints.hit(f"before-complete:{self.run_id}")
        answer = self.state.assistant(last).content
        body = self._completion(answer, len(self.state.turns), usage, spend)
        # The last write: the lease goes with it.
        rec, inserted = lifecycle.record(self.log, names.RUN_COMPLETE, body, release=True)
        if inserted:
            self.lease.dropped()
        self.state.add(rec)
        return self._finished(parent, announce=inserted)

    def _finish_with_turn(self, n: int, response: ModelResponse) -> RunResult | None:
        """A final answer: its turn, ``run:complete``, the row and the lease's release in
        one write (nothing happens between the two records that a crash could split). None,
        having written nothing, when the store finds turn ``n`` recorded or the lease lost:
        the turn and the end are then written one by one, which sorts those out."""
        sub_usage, sub_spend = self._subtree()
        usage = self.state.usage() + response.usage + sub_usage
        spend = self.state.spend() + response.usage + sub_spend
        turn = self._turn_body(response)
        parent = tree.queue_parent(self.store, self.state.start)
        failpoints.hit(f"before-complete:{self.run_id}")
        answer = Message.from_json(turn["message"]).content
        body = self._completion(answer, n, usage, spend)
        records = [(names.model(n), turn), (names.RUN_COMPLETE, body)]
        written = lifecycle.finish_with(self.log, records)
        if written is None:
            self._queued_parent = parent
            return None
        self.lease.dropped()
        for rec in written:
            self.state.add(rec)
        failpoints.hit(f"after-model:{n}")
        return self._finished(parent, announce=True)

    def _finished(self, parent: str | None, *, announce: bool) -> RunResult:
        result = finished_result(self.run_id, self.state)
        if announce:  # another driver's completion was announced by that driver
            events.announce(
                self.store,
                events.RUN_FINISHED,
                run_id=self.run_id,
                agent=self.agent.name,
                answer=result.answer,
                turns=result.turns,
                usage=result.usage.to_json(),
            )
        failpoints.hit(f"after-complete:{self.run_id}")
        if parent is not None:
            runtime.dispatch(parent)
        else:
            # The parent may have paused on this run since ``queue_parent`` found it running,
            # and looked for this end before it was written: look once more, now that it is.
            tree.hand_over_parent(self.store, self.state.start)
        return result

    # -- tool calls -------------------------------------------------------------------

    def _settle(self, calls: tuple[ToolCall, ...]) -> None:
        """Give every call of the last turn a result, or pause on the ones that cannot have
        one yet (an approval to decide, an outcome to resolve)."""
        halts: list[HaltInfo] = []
        gates: list[_Gate] = []
        runnable: list[tuple[_Gate, int]] = []
        for call in calls:
            if call.id in self.state.results:
                continue
            tool = self.agent.tools.get(call.name)
            if tool is None:
                self._settle_missing_tool(call)
                continue
            try:
                args = tool.validate(call.arguments)
            except ToolArgumentsError as exc:
                self._record_result(call, {"error": str(exc)}, is_error=True)
                continue
            gate = _Gate(call, tool, args)
            if tool.safety.gated and not self._pass_gate(gate, call, tool, args, gates, halts):
                continue
            attempt = 0
            if not tool.safety.retry_safe:
                attempt, live = self._attempt_state(call.id)
                if live is not None and self._resumable(call.id, live):
                    gate.resuming = True  # its tool waits on the work it handed off
                elif live is not None:  # claimed since this drive began: another driver's
                    halts.append(self._halt(gate, live, "contended"))
                    continue
            runnable.append((gate, attempt))
        halts.extend(self._run_calls(runnable))
        if self._abort is not None and self.saga:
            raise self._abort  # before any halt: the rollback halts on unknown outcomes itself
        if self._store_failed is not None:
            # The call's claim stays live with no result: a retry-safe call runs again, any
            # other halts on it (its wait may have written before the failure reached it).
            raise self._store_failed
        if halts:
            self._halt_run(halts)
        if self._misuse is not None:
            raise self._misuse
        if self._pauses and not gates:
            self._pause_on_waits()
        if gates:
            self._await_approvals(gates)

    def _settle_missing_tool(self, call: ToolCall) -> None:
        """A call to a tool the agent does not have: refuse to resume when the run started
        with it, or give the call an error result."""
        started_with = (self.state.start.get("fingerprint") or {}) if self.state.start else {}
        if call.name in (started_with.get("tools") or {}):
            raise ResumeToolMissing(
                f"run {self.run_id!r} has a pending call {call.id!r} to tool "
                f"{call.name!r}, which agent {self.agent.name!r} no longer has; "
                "deploy the tool again to resume, or cancel the run",
            )
        self._record_result(call, _unknown_tool(call, self.agent), is_error=True)

    def _pass_gate(
        self,
        gate: _Gate,
        call: ToolCall,
        tool: Tool,
        args: dict[str, Any],
        gates: list[_Gate],
        halts: list[HaltInfo],
    ) -> bool:
        """Decide a gated call: True when it goes on to run (approved, as edited); False when
        it was settled, halted, or waits for a decision (in ``gates``)."""
        decision, gate.previous = self._decision(call, args, tool)
        if decision is None:
            # The rules decide whether anyone is asked: once, journaled, read back.
            decision, gate.policy = self._by_rule(gate)
        if decision is None:
            gates.append(gate)
            return False
        self._mark_decided(call, args, decision)
        if deadlines.is_expiry(decision):
            on_expiry = decision.get("on_expiry")
            if on_expiry == deadlines.ON_EXPIRY_HALT:
                halts.append(self._expired(gate, decision))
                return False
            if on_expiry == deadlines.ON_EXPIRY_CANCEL:
                self._cancel_expired(gate, decision)
        if not decision.get("approved"):
            self._record_result(call, _rejection(decision), is_error=True)
            return False
        gate.approval = decision
        edited = decision.get("edited")
        if edited:  # the approver's edit is exactly what runs (``_still_fits``)
            short = self._edit_short_of_rules(gate, edited.get("arguments"), decision)
            if short is not None:
                self._record_result(call, short, is_error=True)
                return False
            gate.args = tool.validate(encode(edited.get("arguments")))
        return True

    def _await_approvals(self, gates: list[_Gate]) -> NoReturn:
        """Ask about the calls waiting for a decision, hold the run for them, and raise
        ``ApprovalPending``."""
        assert self.state.start is not None
        self._check_tree()  # no new request under a stopped tree
        self._withdraw_moot_requests()
        asked = []
        for g in gates:
            request = ApprovalRequestInfo(
                run_id=self.run_id,
                call_id=g.call.id,
                tool_name=g.tool.name,
                arguments=g.args,
                policy=g.policy
                or policy_for(g.tool.safety.approval, deadline=g.tool.safety.deadline),
                start_seq=self.state.start.seq,
                previous_arguments=g.previous,
                tool_digest=g.tool.definition_digest or "",
            )
            if self.store.save_approval_request(request, fence=self.fence):  # not asked yet
                asked.append(request)
        # Requests before the status: a crash between them leaves a run recovery drives
        # again (and asks again, the same request), never one awaiting nothing visible.
        self._hold(AWAITING_APPROVAL, attempts=0, last_error=None)
        for request in asked:
            events.announce(
                self.store,
                events.APPROVAL_REQUESTED,
                run_id=self.run_id,
                agent=self.agent.name,
                call_id=request.call_id,
                tool=request.tool_name,
                arguments=request.arguments,
                policy=dict(request.policy),
                previous_arguments=request.previous_arguments,
            )
        raise self._approval_pending(gates)

    def _approval_pending(self, gates: list[_Gate]) -> ApprovalPending:
        """The ``ApprovalPending`` for the calls waiting for a decision."""
        listed = ", ".join(f"{g.call.id!r} ({g.tool.name})" for g in gates)
        again = [g for g in gates if g.previous is not None]
        note = (
            " (approved before with other arguments than the call would now run with, or "
            "for a tool its server has changed since; it is asked about again, showing both)"
            if again
            else ""
        )
        return ApprovalPending(
            f"run {self.run_id!r} awaits approval of call {listed}{note}; decide it with "
            "durable_agents.approve(...), in the admin, or with a command `python manage.py "
            "durable_agents runs` prints",
            run_id=self.run_id,
            calls=[g.call.id for g in gates],
            decisions=[
                decision_name(
                    g.call.id,
                    g.args,
                    again=g.previous is not None,
                    tool_digest=g.tool.definition_digest or "",
                )
                for g in gates
            ],
            requests=[
                {
                    "call_id": g.call.id,
                    "tool": g.tool.name,
                    "arguments": g.args,
                    "previous_arguments": g.previous,
                }
                for g in gates
            ],
        )

    def _pause_on_waits(self) -> None:
        """Every call that could settle did; the others wait for an answer or a signal."""
        pauses, self._pauses = self._pauses, []
        waits = [w for p in pauses for w in p.details.get("waits") or ()]
        wakes = [w for p in pauses for w in p.details.get("wakes") or ()]
        # Only from running: an answer or a signal that landed meanwhile queued the run,
        # and a queued run is one recovery hands over, whatever happens to this driver
        # next. (The drive looks at the journal again once it lets the run go.)
        # Sleeping only when every wait is a timer: a person or a signal can wake it earlier.
        timers = [p.details["wake_ms"] for p in pauses if isinstance(p, TimerPending)]
        sleeping = len(timers) == len(pauses)
        # A parent waiting only on sub-runs pauses as its first child did: the tree's pause.
        children = [p for p in pauses if isinstance(p, ChildPending)]
        status: str = SLEEPING if sleeping else AWAITING_INPUT
        kind: type[Pause] = (
            type(pauses[0])
            if len(pauses) == 1
            else next(
                (type(p) for p in pauses if isinstance(p, InterruptPending)),
                TimerPending if sleeping else SignalPending,
            )
        )
        if children and len(children) == len(pauses):
            status = str(children[0].details.get("child_status") or AWAITING_INPUT)
            if status not in tree.PARENT_PAUSE_STATUSES:
                status = AWAITING_INPUT
            kind = _PAUSES.get(str(children[0].details.get("cause")), ChildPending)
        failpoints.hit(f"before-pause:{self.run_id}")
        lifecycle.move(
            self.store,
            self.run_id,
            status,
            lifecycle.DRIVER,
            changes={"attempts": 0, "last_error": None},
            # Not from queued: a wake-up that landed meanwhile must not hide behind a pause.
            # (From failed: recovery's stale verdict on this run, taken before this drive.)
            only_from=(RUNNING, FAILED),
            fence=self.fence,
        )
        message = (
            pauses[0].message
            if len(pauses) == 1
            else (f"run {self.run_id!r} waits for {', '.join(repr(w) for w in waits)}")
        )
        details: dict[str, Any] = {"waits": waits, "wakes": wakes}
        if children:
            details.update(children[0].details.get("child_details") or {})
            details["children"] = [p.details["child_run_id"] for p in children]
        if timers:
            details["wake_ms"] = min(timers)
        channels = [p.details["channel"] for p in pauses if isinstance(p, ChannelPending)]
        if channels:
            details["channels"] = channels
        raise kind(message, run_id=self.run_id, **details)

    def _decision(
        self, call: ToolCall, args: dict[str, Any], tool: Tool
    ) -> tuple[Record | None, Any]:
        """The decision that lets ``call`` run with ``args``, or (None, the arguments it
        was approved with) when it was approved for others, or for an edit today's tool
        would run differently, or for a tool its server has changed since: it must be asked
        again."""
        if call.id in self._fresh_calls:
            return None, None  # nobody could have decided a call nobody was asked about
        first = self.log.reread(decision_name(call.id, args, again=False))
        if first is None:
            return None, None
        approved = first.get("arguments")
        # A call sent under its decision (its live attempt resumes: a task polled again) is
        # never asked about again because its tool changed since: the decision was acted on.
        sent = not tool.safety.retry_safe and self._attempt_state(call.id)[1] is not None
        # A decision recorded without its arguments predates this rule: it stands.
        if not first.get("approved") or approved is None or encode(approved) == encode(args):
            if _still_fits(first, tool, sent=sent):
                if first.get("approved"):
                    denial = self._later_denial(call, first)
                    if denial is not None:
                        return denial, None
                return first, None
            approved = (first.get("edited") or {}).get("arguments") or approved
        digest = tool.definition_digest or ""
        again = self.log.reread(decision_name(call.id, args, again=True, tool_digest=digest))
        if again is not None and _still_fits(again, tool, sent=sent):
            return again, None
        return None, approved

    def _by_rule(self, gate: _Gate) -> tuple[Record | None, dict[str, Any] | None]:
        """Which approval rule decides ``gate``'s arguments (``engine.rules``), journaled the
        first time and read back ever after (a resume, a fork, a deploy that changed the
        rules never evaluate them again for these arguments). ``allow`` and ``deny`` are an
        automatic decision, journaled under the decision's own name and naming the rule:
        (that decision, None). ``ask``: (None, the policy a person decides it under)."""
        if not isinstance(gate.tool.safety.approval, Rules):
            return None, None  # a one-rule gate asks under its tool's policy, as it always did
        call, args = gate.call, gate.args
        again = gate.previous is not None
        tag = arguments_tag(args, gate.tool.definition_digest or "") if again else None
        fresh = call.id in self._fresh_calls
        asked = (self.log.get if fresh else self.log.reread)(names.rule(call.id, tag))
        if asked is not None:
            return None, dict(asked.get("policy") or {})
        context = self._rule_context(gate.tool)
        match = gate.tool.safety.approval.evaluate(args, context)
        said = {"rule": match.rule, "fingerprint": match.fingerprint, "explain": match.explain}
        if match.outcome.kind == ASK:
            policy = dict(match.policy or {})
            policy.update(rule=match.rule, explain=match.explain)
            if context.requester:
                policy["requester"] = context.requester
            rec, _ = self.log.write(
                names.rule(call.id, tag),
                {"kind": "rule", **said, "outcome": ASK, "policy": policy, "arguments": args},
            )
            return None, dict(rec.get("policy") or {})
        allowed = match.outcome.kind == ALLOW
        rec, _ = self.log.write(
            decision_name(
                call.id, args, again=again, tool_digest=gate.tool.definition_digest or ""
            ),
            {
                "kind": "approval",
                "approved": allowed,
                "by": f"rule:{match.rule}",
                "automatic": True,
                **said,
                "note": match.outcome.message,
                "arguments": args,
                "at": now_ms(),
            },
        )
        return rec, None

    def _edit_short_of_rules(
        self, gate: _Gate, edited: Any, decision: Record
    ) -> dict[str, Any] | None:
        """The error result for an approval whose edit its approvals do not cover: the rule
        of the edited arguments (journaled by the decision, or here) denies them, or needs
        approvals from people the decision's tally does not have. None when they are covered
        (the ``approve`` command moves a request to the edit's rule before counting, so
        this is the last line: a decision never fires a call with fewer approvals than the
        rule of the arguments it fires with requires)."""
        if not isinstance(gate.tool.safety.approval, Rules):
            return None
        name = names.rule(gate.call.id, arguments_tag(edited))
        asked = self.log.reread(name)
        if asked is None:
            match = gate.tool.safety.approval.evaluate(edited, self._rule_context(gate.tool))
            policy = dict(match.policy or {})
            asked, _ = self.log.write(
                name,
                {
                    "kind": "rule",
                    "rule": match.rule,
                    "fingerprint": match.fingerprint,
                    "explain": match.explain,
                    "outcome": match.outcome.kind,
                    "policy": policy or None,
                    "arguments": edited,
                    "edit": True,
                },
            )
        short = approvals_short_of(
            str(asked.get("outcome")),
            dict(asked.get("policy") or {}),
            dict(decision.get("tally") or {}),
            self._rule_context(gate.tool).requester,
        )
        if short is None:
            return None
        return {
            "error": "denied",
            "message": f"the approval of this call's edited arguments is short of the approval "
            f"policy (rule {asked.get('rule')!r}): {short}; the call was not made",
            "note": short,
            "by": str(decision.get("by") or ""),
        }

    def _rule_context(self, tool: Tool) -> RuleContext:
        """What a rule's condition may read: who started the run (its root's ``run:start``
        names them when a person did) and the session it belongs to."""
        start = self.state.start
        root = self.tree.get("root") if self.tree else None
        if root and root != self.run_id:
            start = self.log.journal.get(str(root), names.RUN_START)
        requester = start.get("requester") if start is not None else None
        session = names.session_of(self.run_id)
        return RuleContext(
            agent=self.agent.name,
            run_id=self.run_id,
            tool=tool.name,
            session_id=session,
            requester=str(requester) if requester else None,
        )

    def _later_denial(self, call: ToolCall, approval: Record) -> Record | None:
        """A denial of the call asked again, journaled after ``approval``: the last word a
        person said on the call was no, whatever arguments today's code gives it back (a
        deploy, then its rollback). Read only for a call approved and asked again since."""
        request = self.store.get_approval_request(self.run_id, call.id)
        if request is None or request.previous_arguments is None:
            return None
        prefix = names.decision(call.id) + ":"
        denials = [
            r
            for r in self.log.journal.records(self.run_id)
            if r.name.startswith(prefix) and not r.get("approved") and r.seq > approval.seq
        ]
        return denials[-1] if denials else None

    def _expired(self, gate: _Gate, decision: Record) -> HaltInfo:
        """The halt of a call whose request expired with ``on_expiry="halt"``: nothing ran,
        and a person records what the call's result is (``resolve_halt``), as for a call
        whose outcome is unknown. One per asking (the expiry's record names it)."""
        return HaltInfo(
            run_id=self.run_id,
            op_id=gate.call.id,
            tool_name=gate.tool.name,
            arguments=gate.args,
            attempt=decision.name,
            attempted_at=decision.created_at,
            cause=HALT_EXPIRED,
            reason={"type": "expired", "message": str(decision.get("note") or "")},
        )

    def _cancel_expired(self, gate: _Gate, decision: Record) -> NoReturn:
        """Cancel this run as its expired request asks (``on_expiry="cancel"``): the sweep's
        cancel found it busy under this drive, or has not come yet. Recorded under this
        drive's lease as the cancel command would record it, by the deadline."""
        reason = f"nobody decided call {gate.call.id!r} in time: its approval request expired"
        rec, _ = lifecycle.record(
            self.log,
            names.RUN_CANCELLED,
            names.cancelled_body(deadlines.BY, "", reason),
        )
        self.state.add(rec)
        close_cancelled(self.store, self.run_id, self.fence)
        failpoints.hit(f"after-cancel:{self.run_id}")
        tree.hand_over_parent(self.store, self.state.start)
        raise Conflict(f"run {self.run_id!r} was cancelled: {reason}", code="run.cancelled")

    def _mark_decided(self, call: ToolCall, args: dict[str, Any], decision: Any) -> None:
        """A request still pending for the arguments a journaled decision is about: its
        maker stopped before marking it. The journal is the truth, so the request says so
        too. A request about other arguments is withdrawn once the call has its result
        (``_record_result``), not before: a drive that loses the run before that must leave
        it to the driver that asked it."""
        if call.id in self._fresh_calls:
            return  # decided by a rule in this drive: no request was ever asked
        request = self.store.get_approval_request(self.run_id, call.id)
        if request is None or request.status != APPROVAL_PENDING:
            return
        if encode(request.arguments) != encode(args):
            # Asked by a drive under other code meanwhile (or a stale one). This drive
            # settles the call by the decision the journal holds; once its result is
            # journaled no drive asks about the call again, so the request is moot then.
            self._moot[call.id] = request.arguments
        elif not lifecycle.move_request(
            self.store,
            self.run_id,
            call.id,
            lifecycle.decided(decision),
            lifecycle.DRIVER,
            if_arguments=args,
            if_asked_again=decision.name != names.decision(call.id, None),
            if_tool_digest=decision.get("tool_digest") or None,
        ):
            # The same arguments, another asking: the decision is about the call asked
            # again (an automatic one of the rules, say), the row still about its first
            # asking (a drive under new code replaced it with these arguments while a
            # person's decision on the old ones was being recorded). Moot once the call
            # has its result, as a request about other arguments is.
            self._moot[call.id] = request.arguments

    def _attempt_state(self, call_id: str) -> tuple[int, Any]:
        """The next attempt number for a call, and its live attempt marker if it has one (a
        claim with no result and no record that it never started), from this drive's view."""
        k = 1
        while True:
            marker = self.log.get(names.attempt(call_id, k))
            if marker is None:
                return k, None
            if not self.log.has(names.not_started(call_id, k)):
                return k, marker
            k += 1

    def _halt_run(self, halts: list[HaltInfo]) -> None:
        """Halt the run on ``halts``: one halt row per attempt, then the status (fenced).
        The rows come first so a crash between leaves a run recovery drives again, never
        one halted on nothing a person can see; a row is written once per attempt, so a
        driver that lost the run reopens none; the rows are fenced, so one that lost the
        lease writes none from its stale journal. A row it wrote before it lost the lease
        that the new holder's record has since made untrue is closed on finding it lost
        the run (``_close_untrue_halts``)."""
        new: list[HaltInfo] = []
        try:
            for halt in halts:
                if halt.reason is not None and halt.attempt and halt.cause != HALT_EXPIRED:
                    # The journal keeps what the tool said, so a later drive that halts on
                    # this attempt again (its row lost, a fork) still says it.
                    said, _ = self.log.write(
                        names.unknown(halt.attempt),
                        {
                            "kind": "outcome_unknown",
                            "call_id": halt.op_id,
                            "tool": halt.tool_name,
                            "reason": dict(halt.reason),
                        },
                    )
                    self.state.add(said)
                if self.store.save_halt(halt, fence=self.fence):
                    new.append(halt)
            self._hold(HALTED, attempts=0, last_error=None)
        except LeaseLost:
            self._close_untrue_halts(new)
            for gate, attempt, text in self._unknown.values():
                self._late(gate, attempt, "unknown", text)
            raise
        announce_halts(self.store, self.agent.name, new)
        first = halts[0]
        if first.cause == HALT_EXPIRED:
            raise OutcomeUnknown(
                f"run {self.run_id!r} halted: nobody decided call {first.op_id!r} "
                f"({first.tool_name}) before its approval request expired, and its deadline "
                "says the run halts. Record the call's result with "
                "durable_agents.resolve_halt(...) or in the admin, or cancel the run",
                run_id=self.run_id,
                halts=[h.op_id for h in halts],
                cause=first.cause,
            )
        raise OutcomeUnknown(
            f"run {self.run_id!r} halted: the outcome of call {first.op_id!r} "
            f"({first.tool_name}) is unknown ({first.cause}). Check what really happened, "
            "then record it with durable_agents.resolve_halt(...), in the admin, or with the "
            "command `python manage.py durable_agents runs` prints",
            run_id=self.run_id,
            halts=[h.op_id for h in halts],
            cause=first.cause,
        )

    def _close_untrue_halts(self, written: list[HaltInfo]) -> None:
        """This driver lost the run after writing halt rows from its view of the journal,
        which was stale: the holder may have finished the attempt meanwhile. A halt whose
        call has its result by now was never true; close it with that result instead of
        leaving it open for a person. (A result still to come, the holder inside the tool
        now, is not seen: that halt stays open; resolving it closes it from the journal.)"""
        for halt in written:
            rec = self.log.reread(names.result(halt.op_id))
            if rec is not None:
                self.store.resolve_halt_row(self.run_id, halt.op_id, outcome_of(rec), None)

    def unknown_halts(self) -> list[HaltInfo]:
        """One halt per op of this drive's state whose outcome is unknown."""
        return unknown_outcomes(self.state, self.run_id)

    def halt_op(
        self,
        op: str,
        tool_name: str,
        args: Any,
        marker: Any,
        cause: str,
        reason: dict[str, Any] | None = None,
    ) -> HaltInfo:
        return halt_info(self.run_id, op, tool_name, args, marker, cause, reason)

    def announce_failed(self, error: dict[str, Any]) -> None:
        """``run_failed`` for an end the run will not be retried from (a saga's)."""
        announce_failure(self.store, self.run_id, self.agent.name, error, 1)

    def _halt(
        self, gate: _Gate, marker: Any, cause: str, reason: dict[str, Any] | None = None
    ) -> HaltInfo:
        return halt_info(
            self.run_id, gate.call.id, gate.tool.name, gate.args, marker, cause, reason
        )

    def _run_calls(self, runnable: list[tuple[_Gate, int]]) -> list[HaltInfo]:
        if not runnable:
            return []
        halts: list[HaltInfo] = []
        if self.agent.tool_concurrency == 1 or len(runnable) == 1:
            for gate, attempt in runnable:
                try:
                    halt = self._prepare(gate, attempt)
                except _DeniedMeanwhile as meanwhile:
                    self._settle_denied(gate, meanwhile.denial)
                    continue
                if halt is not None:
                    halts.append(halt)
                    continue
                halt = self._settle_call(gate, attempt, self._observed(gate, attempt))
                if self._fenced_out is not None:
                    raise self._fenced_out
                if halt is not None:
                    halts.append(halt)
            return halts
        # Claims and results are written by this thread, as each call starts and settles;
        # only the tool functions run in the pool.
        queue = list(runnable)
        running: dict[Future[Any], tuple[_Gate, int]] = {}
        stopping: DurableAgentsError | stops.TreeStopped | Throttled | None = None
        with ThreadPoolExecutor(self.agent.tool_concurrency) as pool:
            while queue or running:
                while queue and len(running) < self.agent.tool_concurrency and not stopping:
                    gate, attempt = queue.pop(0)
                    try:
                        halt = self._prepare(gate, attempt)
                    except OwnSlotsFull:
                        queue.insert(0, (gate, attempt))  # after one of ours gives one back
                        break
                    except _DeniedMeanwhile as meanwhile:
                        self._settle_denied(gate, meanwhile.denial)
                        continue
                    except (DriveStopped, LeaseLost, stops.TreeStopped, Throttled) as exc:
                        stopping = exc  # let the calls in flight settle, then stop
                        queue.clear()
                        break
                    if halt is not None:
                        halts.append(halt)
                        continue
                    # In the drive's context (its span), as a call run in this thread.
                    run = contextvars.copy_context().run
                    future = pool.submit(run, self._observed, gate, attempt, True)
                    running[future] = (gate, attempt)
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    gate, attempt = running.pop(future)
                    halt = self._settle_call(gate, attempt, future.result())
                    if self._fenced_out is not None and stopping is None:
                        stopping = self._fenced_out
                        queue.clear()
                    if halt is not None:
                        halts.append(halt)
        if stopping is not None:
            raise stopping
        return halts

    def _prepare(self, gate: _Gate, attempt: int) -> HaltInfo | None:
        """Claim the attempt of a call that is not retry-safe; a lost claim halts it. A
        sub-run looks at its tree last, right before the call runs (after its claim, which
        it then releases): a stop recorded before that look is obeyed, and one recorded
        after it finds the call in flight."""
        self._check_continue()
        # Before the claim: a call throttled here was provably never started.
        self._tool_slots[gate.call.id] = self.limits.before_tool(gate.tool, gate.call.id)
        if gate.tool.safety.retry_safe or gate.resuming:
            # A resumed call's claim is the one its handle was kept under: nothing is sent
            # again, the tool only waits on the work it handed off.
            self._check_tree()
            return None
        name = names.attempt(gate.call.id, attempt)
        won, marker = self.log.claim_attempt(
            name, extra={"tool": gate.tool.name, "arguments": gate.args}
        )
        if not won:
            return self._halt(gate, marker, "contended")
        if gate.approval is not None:
            # A denial journaled since this drive read the approval, whose own look for a
            # claim came before this one: it sees the denial now (each side looks after its
            # write), and the call provably never ran.
            denial = self._later_denial(gate.call, gate.approval)
            if denial is not None:
                self.log.write(
                    names.not_started(gate.call.id, attempt),
                    {"kind": "not-started", "claim": marker.get("claim")},
                )
                raise _DeniedMeanwhile(denial)
        failpoints.hit(f"after-attempt:{gate.call.id}")
        try:
            self._check_tree()
        except stops.TreeStopped:
            # Provably never called: the claim is released, nothing is left to resolve.
            self.log.write(
                names.not_started(gate.call.id, attempt),
                {"kind": "not-started", "claim": marker.get("claim")},
            )
            raise
        return None

    def _observed(self, gate: _Gate, attempt: int, in_pool: bool = False) -> tuple[str, Any]:
        safety = safety_class(gate.tool.safety)
        with observer().tool_call(self.run_id, gate.call.id, gate.tool.name, safety, attempt) as s:
            outcome = self._invoke(gate, in_pool)
            s.set(outcome=outcome[0])
            return outcome

    def _invoke(self, gate: _Gate, in_pool: bool = False) -> tuple[str, Any]:
        """Run the tool function; return ("ok" | "error" | "unknown", value)."""
        ctx = ToolContext(
            run_id=self.run_id,
            call_id=gate.call.id,
            tool_name=gate.tool.name,
            idempotency_key=gate.tool.key_for(self.origin, gate.call.id, gate.args),
            _waits=CallWaits(
                self.store,
                self.run_id,
                gate.call.id,
                gate.tool.name,
                retry_safe=gate.tool.safety.retry_safe,
                fence=self.fence,
            ),
            _records=CallRecords(
                self.store, self.run_id, gate.call.id, gate.tool.name, fence=self.fence
            ),
        )
        try:
            return "ok", gate.tool.invoke(gate.args, ctx)
        except ToolOutcomeUnknown as exc:
            return "unknown", unknown_reason(exc)
        except (InterruptPending, SignalPending, TimerPending, ChildPending) as pause:
            return "pause", pause
        except WaitError as exc:
            return "misuse", exc
        except StorageError as exc:
            return "store", exc
        except SagaAborted as exc:
            self._abort = self._abort or exc
            return "error", error_text(exc)
        except ToolResultError as exc:
            return "error", _error_result(exc)
        except Pause:
            raise
        except Exception as exc:
            return "error", error_text(exc)
        finally:
            if in_pool:
                close = getattr(self.store, "close_thread_resources", None)
                if close is not None:
                    close()

    def _settle_denied(self, gate: _Gate, denial: Record) -> None:
        """A call denied meanwhile (``_DeniedMeanwhile``): its result is the denial."""
        try:
            self._record_result(gate.call, _rejection(denial), is_error=True)
        finally:
            self.limits.after_tool(self._tool_slots.pop(gate.call.id, None))

    def _settle_call(self, gate: _Gate, attempt: int, outcome: tuple[str, Any]) -> HaltInfo | None:
        try:
            return self._settle_outcome(gate, attempt, outcome)
        finally:  # the tool's slot, if it has a limit, is held until its outcome is settled
            self.limits.after_tool(self._tool_slots.pop(gate.call.id, None))

    def _settle_outcome(
        self, gate: _Gate, attempt: int, outcome: tuple[str, Any]
    ) -> HaltInfo | None:
        """Record a call's outcome. A driver that lost its lease meanwhile records nothing:
        what its tool returned is kept as evidence (``@late/<call>/<attempt>``) instead."""
        kind, value = outcome
        reason = None
        if kind == "unknown":  # what the tool said; the model reads it as an error's text
            reason, value = value, f"{value['type']}: {value['message']}"
        if kind == "pause":
            self._pauses.append(value)
            return None
        if kind == "misuse":
            self._misuse = self._misuse or value
            return None
        if kind == "store":
            self._store_failed = self._store_failed or value
            return None
        if kind == "unknown" and not gate.tool.safety.retry_safe:
            # No result: the tool cannot tell whether its effect happened, so the run halts
            # on its live claim once the rest of this turn's calls have settled.
            self._unknown[gate.call.id] = (gate, attempt, value)
            marker = self.log.get(names.attempt(gate.call.id, attempt))
            return self._halt(gate, marker, HALT_OUTCOME_UNKNOWN, reason)
        if kind == "ok":
            try:
                value = json_result(value)
            except ProtocolError as exc:
                # Say that it ran: an effect that happened must not look like one to retry.
                value, kind = (
                    {
                        "error": f"the tool ran, but returned a value JSON cannot hold: {exc}; "
                        "its effect, if it has one, may have happened"
                    },
                    "error",
                )
        result = value if kind == "ok" else {"error": value} if isinstance(value, str) else value
        if self._fenced_out is not None:
            self._late(gate, attempt, kind, result)
            return None
        try:
            self._record_result(
                gate.call,
                result,
                is_error=kind != "ok",
                read_only=gate.tool.safety.read_only,
                # What a saga's undo of the call gets: what it ran with (an approver's edit).
                ran_with=gate.args if gate.tool.safety.compensate is not None else None,
            )
        except LeaseLost as exc:
            self._fenced_out = exc
            self._late(gate, attempt, kind, result)
        return None

    def _late(self, gate: _Gate, attempt: int, outcome: str, result: Any) -> None:
        """Keep what a fenced-out driver's side effect returned: a record that changes no
        result (the call's outcome belongs to whoever holds the run now), shown on the halt
        page. A retry-safe call (no attempt claim) leaves none: its rerun is harmless."""
        log.warning(
            "run %s: call %s settled after this driver lost the run; its outcome is not the "
            "call's result",
            self.run_id,
            gate.call.id,
        )
        if not attempt:
            return
        marker = self.log.get(names.attempt(gate.call.id, attempt))
        try:
            self.log.journal.write(
                self.run_id,
                names.late(gate.call.id, attempt),
                {
                    "kind": "late",
                    "call_id": gate.call.id,
                    "tool": gate.tool.name,
                    "arguments": gate.args,
                    "outcome": outcome,
                    "result": result,
                    "is_error": outcome != "ok",
                    "claim": marker.get("claim") if marker is not None else None,
                    "attempt": attempt,
                    "holder": self.lease.holder,
                },
            )
        except Exception:  # evidence is best effort: the lost lease is what must surface
            log.warning("could not keep the late result of %s", gate.call.id, exc_info=True)

    def _record_result(
        self,
        call: ToolCall,
        result: Any,
        *,
        is_error: bool,
        read_only: bool = False,
        ran_with: dict[str, Any] | None = None,
    ) -> None:
        body = names.tool_body(call.id, call.name, result, is_error=is_error, read_only=read_only)
        if ran_with is not None:
            body["arguments"] = ran_with
        rec, _ = self.log.write(
            names.tool(call.id),
            body,
            sync=not durability.result_may_lag(
                self.agent.durability, self.agent.tools.get(call.name)
            ),
        )
        self.state.add(rec)
        moot = self._moot.pop(call.id, None)
        if moot is not None:  # the result is journaled (fenced): nobody runs the call again
            lifecycle.move_request(
                self.store,
                self.run_id,
                call.id,
                APPROVAL_WITHDRAWN,
                lifecycle.DRIVER,
                if_arguments=moot,
            )
        failpoints.hit(f"after-result:{call.id}")

    def _withdraw_moot_requests(self) -> None:
        """Withdraw the requests still pending for calls the journal holds a result for,
        before the run waits on its new ones. ``_record_result`` withdraws a moot request
        right after the result, but a drive that died there (or heard a store error as the
        result committed) leaves it pending, and no later drive comes back to a call with a
        result: the run would wait on a request nobody may decide, and every sweep would
        hand it over again (found by the simulator). Read once per pause on approval, which
        is rare next to the steps."""
        for request in self.store.list_approval_requests(run_id=self.run_id):
            if request.call_id in self.state.results:
                lifecycle.move_request(
                    self.store,
                    self.run_id,
                    request.call_id,
                    APPROVAL_WITHDRAWN,
                    lifecycle.DRIVER,
                    if_arguments=request.arguments,
                )

    def _check_continue(self) -> None:
        """Between steps: stop if the lease was lost or this process is shutting down."""
        if self.lease.lost.is_set() or self.lease.lapsed():
            raise LeaseLost(f"lease on run {self.run_id!r} was lost; stopping")
        if runtime.should_stop():
            raise DriveStopped(
                f"stopped driving run {self.run_id!r} after the step in flight: this worker is "
                "shutting down; another driver continues it"
            )

    def _check_tree(self) -> None:
        """A sub-run, before a step: stop (``TreeStopped``) if a run above it was cancelled
        or its saga aborted (``stops``). A top-level run has nothing above it: no read."""
        start = self.state.start
        parent = start.get("parent") if start is not None else None
        if not parent:
            return
        if self._above is None:  # the runs above do not change: read once per drive
            self._above = stops.ancestors(self.store, str(parent))
        stop = stops.stop_above(self.store, str(parent), self._above)
        if stop is not None:
            raise stops.TreeStopped(stop)

    def _obey(self, stop: stops.Stop) -> NoReturn:
        """Record this run's own stop under its lease, as the nearest stopped run above it
        asks: cancelled plainly (its requests withdrawn, its halts orphaned), or aborted and
        rolled back."""
        if stop.kind == stops.CANCEL:
            rec, _ = lifecycle.record(self.log, names.RUN_CANCELLED, stops.cancelled_body(stop))
            self.state.add(rec)
            close_cancelled(self.store, self.run_id, self.fence)
            failpoints.hit(f"after-cancel:{self.run_id}")
            tree.hand_over_parent(self.store, self.state.start)
            raise Conflict(
                f"run {self.run_id!r} was cancelled: {stop.describe()}", code="run.cancelled"
            )
        body = stops.abort_body(stop.run_id, stops.abort_message(stop))
        rec, _ = lifecycle.record(self.log, names.SAGA_ABORT, body)
        self.state.add(rec)
        failpoints.hit(f"after-subrun-abort:{self.run_id}")
        sagas.rollback(self)

    # -- the run row ------------------------------------------------------------------

    def _hold(self, to: str, **changes: Any) -> None:
        """Move the run to ``to`` under this drive's lease (``lifecycle.hold``)."""
        lifecycle.hold(
            self.store, self.run_id, to, lifecycle.DRIVER, changes=changes, fence=self.fence
        )

    def _retries_exhausted(self) -> bool:
        """A sub-run's retryable failure that nothing will retry (no attempt left); read
        only for a sub-run, so a top-level run's failure costs no extra read."""
        if not (self.state.start is not None and self.state.start.get("parent")):
            return False
        return tree.failed_for_good(self.store.get_run(self.run_id))

    def _fail(self, code: str, message: str, *, retryable: bool) -> None:
        run = self.store.get_run(self.run_id)
        attempts = (run.attempts if run else 0) + 1
        error = {"code": code, "message": message, "retryable": retryable}
        try:
            # Never over an end: a drive of a cancelled run whose store failed as it closed
            # the run's requests fails, but the run stays cancelled (found by the simulator).
            failed = lifecycle.move(
                self.store,
                self.run_id,
                FAILED,
                lifecycle.DRIVER,
                changes={"last_error": error, "attempts": attempts},
                fence=self.fence,
            )
        except LeaseLost:
            return
        if not failed:
            return
        announce_failure(self.store, self.run_id, self.agent.name, error, attempts)


# The pause a parent waiting on a sub-run raises, by the kind of its child's pause.
_PAUSES: dict[str, type[Pause]] = {
    cls.__name__: cls
    for cls in (ApprovalPending, OutcomeUnknown, InterruptPending, SignalPending, TimerPending)
}


def _billed(usage: Usage) -> dict[str, int] | None:
    """A response's usage as spend (None if it reported none): a negative count (a provider
    bug) counts as nothing."""
    billed = {key: max(0, int(value)) for key, value in usage.to_json().items()}
    return billed if any(billed.values()) else None


def _decoded(arguments: str) -> Any:
    try:
        return decode(arguments or "{}")
    except ProtocolError:
        return arguments


def _describe(changes: dict[str, Any]) -> str:
    parts = []
    if "model" in changes:
        parts.append(f"model {changes['model'][0]} -> {changes['model'][1]}")
    for key in ("tools_added", "tools_removed", "tools_changed"):
        if key in changes:
            parts.append(f"{key.replace('_', ' ')}: {', '.join(changes[key])}")
    if changes.get("instructions"):
        parts.append("instructions changed")
    if "sources_changed" in changes:
        parts.append(f"tool servers changed: {', '.join(changes['sources_changed'])}")
    return "; ".join(parts) or "changed"


def _unknown_tool(call: ToolCall, agent: Agent) -> dict[str, Any]:
    available = ", ".join(sorted(agent.tools)) or "none"
    return {"error": f"unknown tool {call.name!r}; available tools: {available}"}


def _still_fits(decision: Any, tool: Tool, *, sent: bool = False) -> bool:
    """False for an approval whose edited arguments today's tool would not run exactly as
    approved (its schema changed since: a new field, a default), or of a tool the site did
    not write whose definition changed since it was asked (an MCP server's new schema,
    description or annotations): it is asked again. A denial always stands, and so does an
    approval recorded before decisions named their tool's definition, and one ``sent`` (its
    call went out under it)."""
    if not decision.get("approved"):
        return True
    asked_about = decision.get("tool_digest")
    if asked_about and not sent and asked_about != (tool.definition_digest or ""):
        return False
    edited = decision.get("edited")
    if not edited:
        return True
    try:
        valid = tool.validate(encode(edited.get("arguments")))
    except ToolArgumentsError:
        return False
    return encode(valid) == encode(edited.get("arguments"))


def _error_result(exc: ToolResultError) -> Any:
    """The error result a tool raised, journaled whole; as its text when JSON cannot hold it."""
    try:
        return json_result(exc.result)
    except ProtocolError:
        return error_text(exc)


def _rejection(decision: Any) -> dict[str, Any]:
    if deadlines.is_expiry(decision):
        return deadlines.rejection(decision)
    note = str(decision.get("note") or "")
    if decision.get("automatic"):
        # Refused by a rule, nobody asked: its message says what to do instead.
        return {
            "error": "denied",
            "message": f"the approval policy refused this call ({decision.get('rule')}): {note}",
            "note": note,
            "by": str(decision.get("by") or ""),
        }
    # The denier's message is what the model reads first: it says what to do instead.
    return {
        "error": "denied",
        "message": f"a person denied this call: {note}"
        if note
        else "a person denied this call; do not retry it without asking",
        "note": decision.get("note") or "",
        "by": _deniers(decision),
    }


def _deniers(decision: Any) -> str:
    """Who denied: the tally's deniers (a failed quorum's vote written last may be an
    approval, and one whose approvers disagreed has no denier), else the decider."""
    tally = decision.get("tally")
    if isinstance(tally, dict) and "denied_by" in tally:
        return ", ".join(str(by) for by in tally["denied_by"])
    return str(decision.get("by") or "")
