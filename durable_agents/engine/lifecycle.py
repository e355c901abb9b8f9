"""A run's lifecycle: its statuses and every move between them, in one table.

The journal is the truth; a run's status is its projection. Each row of ``MOVES`` is a move
the engine makes: to which status, from which, by whom, and on what. This module is the one
writer of a run's status (a test holds every other module to that), and it writes none the
table does not hold:

* ``move`` (and ``hand_over``): every conditional write (``Store.update_run(...,
  if_status=...)``), its from-statuses taken from the table;
* ``record`` / ``record_in`` / ``finish_with``: a record and the row change it carries, in
  one write — ``RECORD_MOVES`` says which status each record (``run:complete``,
  ``run:cancelled``, ``saga:abort``, ``run:compensated``, ``fork:done``) moves its run to,
  and which row fields it takes from the record's body;
* ``project``: a row brought in step with a record its journal already holds (a row a
  crash left behind), whatever the row said;
* ``hold``: a fenced write under the run's lease, the lease its condition (a driver's
  pauses, its taking and giving back the run; a resolution under the lease);
* ``created``: a new run's row, in a status the table creates runs in.

The simulator checks every status change it sees against ``allowed`` (docs/guarantees.md,
"A run's lifecycle").

No move leaves ``cancelled`` or ``compensated``; the one move out of ``finished`` is a
sub-run's rollback, when its parent's saga aborts after it finished. Every status a crash
can leave a run in is terminal or picked up by something that does not need a person:

* ``queued``, ``running``, ``compensating`` and a retryable ``failed``: recovery hands the
  run to a driver once nobody holds its lease (``commands.recovery``);
* ``awaiting_approval``, ``awaiting_input``, ``sleeping``, ``halted``: a person's decision,
  answer, resolution, a signal or a timer moves it on, and the sweep (``wake_timers``)
  finishes what one of them left half done, or what its ancestors' stop asks of it;
* ``throttled``: a limit was full (``engine.limits``); the sweep hands it over when its retry
  is due, a driver giving back a slot it waits for sooner, and a decision or an answer that
  lands meanwhile queues it as it would a paused run. It is a paused status (``PAUSED``)
  wherever a pause is meant: the sweep hands it over at once when an ancestor's stop is not
  recorded in it yet, as it does the others, not at its retry (a day off for ``1/d``);
* ``failed`` for good: a person's (``pending()`` says why); nothing drives it again on
  its own, and under a stopped ancestor nothing can (its drive stops first).

An approval request's status has a table of its own (``APPROVAL_MOVES``), and
``move_request`` is the one place that writes it (a test holds every other module to that):
a request is asked ``pending``, and leaves it once — ``approved`` or ``denied`` by the
decision the journal holds, ``expired`` by its deadline (``engine.deadlines``), or
``withdrawn`` when its call will never run under it — until a drive asks the call again (a
new start of the run, other arguments: the row is replaced, its votes dropped). Escalation is
no status: the request stays pending, with more people who may decide it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import names
from .ports import (
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_PENDING,
    APPROVAL_STATUSES,
    APPROVAL_WITHDRAWN,
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    COMPENSATED,
    COMPENSATING,
    FAILED,
    FINISHED,
    HALTED,
    NOT_TERMINAL_STATUSES,
    QUEUED,
    RUNNING,
    SLEEPING,
    STATUSES,
    THROTTLED,
    RunInfo,
    Store,
)
from .records import Record

# Who moves a run.
CREATE = "create"  # the write that creates the row
DRIVER = "driver"  # the holder of the run's lease, fenced by it
PERSON = "person"  # a command someone called: a decision, an answer, a cancel, a fork
SUB_RUN = "sub-run"  # a sub-run that ended hands its paused parent over
RECOVERY = "recovery"  # a recovery pass (``commands.recovery``)
SWEEP = "sweep"  # the sweep of paused runs (``commands.timers.wake_timers``)

MOVERS = (CREATE, DRIVER, PERSON, SUB_RUN, RECOVERY, SWEEP)

# Every status a run waits in with nobody driving it, throttled included: what "paused"
# means in every rule (the sweep, a stop above, a sub-run a parent waits on).
PAUSED = (AWAITING_APPROVAL, AWAITING_INPUT, SLEEPING, HALTED, THROTTLED)
_NOT_TERMINAL = frozenset(NOT_TERMINAL_STATUSES)


@dataclass(frozen=True)
class Move:
    """Moving a run to ``to`` from any of ``from_`` (empty: creating it), by ``by``."""

    to: str
    from_: frozenset[str]
    by: str
    on: str

    def row(self) -> tuple[str, str, str, str]:
        """The move as docs/guarantees.md lists it: from, to, who, on what."""
        froms = "(new)" if not self.from_ else ", ".join(s for s in STATUSES if s in self.from_)
        return froms, self.to, self.by, self.on


def _m(to: str, from_: Any, by: str, on: str) -> Move:
    return Move(to, frozenset(from_), by, on)


MOVES: tuple[Move, ...] = (
    _m(QUEUED, (), CREATE, "a run started for a worker (`start`, `send_once`)"),
    _m(RUNNING, (), CREATE, "a run started and leased in one write (`run`)"),
    _m(FAILED, (), CREATE, "a fork's row, until its journal is copied"),
    _m(FINISHED, (), CREATE, "a session's or a plain journal's row (never driven)"),
    _m(
        RUNNING,
        (QUEUED, RUNNING, FAILED, *PAUSED),
        DRIVER,
        "a drive takes the run (its lease), nothing stopping it",
    ),
    # A driver's pause moves its run from running; from failed too, where recovery judged
    # the run from a read before this driver took its lease (a dead driver's): stale.
    _m(
        AWAITING_APPROVAL,
        (RUNNING, QUEUED, FAILED),
        DRIVER,
        "a gated call's request saved (a wake-up that queued the run meanwhile waits too)",
    ),
    _m(
        HALTED,
        _NOT_TERMINAL,
        DRIVER,
        "a live attempt with no outcome, or a request expired to halt (a halt row saved)",
    ),
    _m(AWAITING_INPUT, (RUNNING, FAILED), DRIVER, "a wait, a sub-run's pause (`wait:`, `child:`)"),
    _m(SLEEPING, (RUNNING, FAILED), DRIVER, "every wait is a timer"),
    _m(THROTTLED, (RUNNING,), DRIVER, "a limit is full: a slot or a rate permit (`Throttled`)"),
    _m(QUEUED, (RUNNING,), DRIVER, "the worker shuts down after the step in flight"),
    _m(FINISHED, _NOT_TERMINAL, DRIVER, "`run:complete` (a row behind its journal repaired)"),
    _m(FAILED, _NOT_TERMINAL, DRIVER, "a drive's error (its agent not loaded here, too)"),
    _m(CANCELLED, _NOT_TERMINAL, DRIVER, "`run:cancelled`: a cancel, or an ancestor's"),
    _m(COMPENSATING, _NOT_TERMINAL, DRIVER, "`saga:abort`: its own, a cancel's, an ancestor's"),
    _m(
        COMPENSATING,
        (FINISHED,),
        DRIVER,
        "`saga:abort` after `run:complete`: a parent's saga rolls a finished sub-run back",
    ),
    _m(AWAITING_INPUT, (COMPENSATING,), DRIVER, "a rollback waits on a sub-run"),
    _m(AWAITING_APPROVAL, (COMPENSATING,), DRIVER, "a rollback waits on a sub-run's request"),
    _m(SLEEPING, (COMPENSATING,), DRIVER, "a rollback waits on a sub-run's timer"),
    _m(COMPENSATED, _NOT_TERMINAL, DRIVER, "`run:compensated`: every undo done"),
    _m(FAILED, (COMPENSATING,), DRIVER, "`run:compensated` with an undo that failed"),
    _m(CANCELLED, _NOT_TERMINAL, PERSON, "`cancel` (under the run's lease)"),
    _m(COMPENSATING, _NOT_TERMINAL, PERSON, "`cancel(compensate=True)` (`saga:abort`)"),
    _m(
        QUEUED,
        (RUNNING, FAILED, *PAUSED),
        PERSON,
        "a decision (`approval:`): the run goes on, never a rollback forward",
    ),
    _m(QUEUED, (HALTED,), PERSON, "a halt's resolution (`tool:` reconciled)"),
    _m(QUEUED, (AWAITING_INPUT, RUNNING), PERSON, "an answer, a signal, a channel message"),
    _m(QUEUED, (SLEEPING, AWAITING_INPUT, RUNNING), PERSON, "a timer woken early (`waited:`)"),
    _m(QUEUED, PAUSED, PERSON, "a sub-run's request withdrawn: its ancestor stopped"),
    _m(FAILED, _NOT_TERMINAL, PERSON, "a resume of a run whose agent is not loaded"),
    _m(
        QUEUED,
        (FAILED,),
        PERSON,
        "`fork:done` (or `halted`, `awaiting_input`: where its copy stands)",
    ),
    _m(HALTED, (FAILED,), PERSON, "`fork:done` with a call in flight"),
    _m(AWAITING_INPUT, (FAILED,), PERSON, "`fork:done` of a sub-run its forked parent drives"),
    _m(QUEUED, PAUSED, SUB_RUN, "a sub-run ended: its paused parent goes on"),
    _m(
        QUEUED,
        PAUSED,
        SWEEP,
        "a timer due, a wait answered, a sub-run ended, a stop above; a throttled run's "
        "retry due, or a slot it waits for given back",
    ),
    _m(RUNNING, (RUNNING,), RECOVERY, "its driver died: a failed attempt, handed over"),
    _m(COMPENSATING, (COMPENSATING,), RECOVERY, "its rollback's driver died: handed over"),
    _m(FAILED, (RUNNING, COMPENSATING), RECOVERY, "its driver died too often in a row"),
)


def allowed(frm: str, to: str, by: str | None = None) -> bool:
    """Whether the table holds a move from ``frm`` to ``to`` (by ``by``, or anyone)."""
    return any(m.to == to and frm in m.from_ and (by is None or m.by == by) for m in MOVES) or (
        frm == to and frm in _NOT_TERMINAL
    )


def froms(to: str, by: str) -> tuple[str, ...]:
    """The statuses ``by`` may move a run from to ``to``, in ``STATUSES`` order."""
    found: set[str] = set()
    for m in MOVES:
        if m.to == to and m.by == by:
            found |= m.from_
    if not found:
        raise ValueError(f"the lifecycle has no move to {str(to)!r} by {by!r}")
    return tuple(s for s in STATUSES if s in found)


def move(
    store: Store,
    run_id: str,
    to: str,
    by: str,
    *,
    changes: Mapping[str, Any] | None = None,
    only_from: Any = None,
    fence: str | None = None,
) -> bool:
    """Move run ``run_id`` to ``to`` (with ``changes`` to other fields) if its status is one
    ``by`` may move it from (narrowed to ``only_from``, a status the caller saw); True if it
    moved. Conditional on the row, atomically, as ``Store.update_run`` is."""
    statuses = froms(to, by)
    if only_from is not None:
        narrow = {only_from} if isinstance(only_from, str) else set(only_from)
        statuses = tuple(s for s in statuses if s in narrow)
        if not statuses:
            return False
    return store.update_run(
        run_id, {**(changes or {}), "status": to}, fence=fence, if_status=statuses
    )


def hand_over(store: Store, run_id: str, by: str, *, only_from: Any = None) -> bool:
    """Queue a run for a driver (failures in a row and the last error cleared), from what
    ``by`` may queue it from; True if it moved (the caller dispatches it)."""
    return move(
        store,
        run_id,
        QUEUED,
        by,
        changes={"attempts": 0, "last_error": None},
        only_from=only_from,
    )


def hold(
    store: Store,
    run_id: str,
    to: str,
    by: str,
    *,
    changes: Mapping[str, Any] | None = None,
    fence: str,
) -> bool:
    """Move run ``run_id`` to ``to`` (with ``changes``) under the lease ``fence`` names: a
    fenced write, not a conditional one (the lease is the condition; a lost lease raises
    ``LeaseLost``). A driver's pause, its taking the run and its handing it back; a person's
    resolution under the run's lease."""
    froms(to, by)  # a move the table does not hold is never written
    return store.update_run(run_id, {"status": to, **(changes or {})}, fence=fence)


def created(to: str, **fields: Any) -> RunInfo:
    """A new run's row, in status ``to`` (one the table creates a run in)."""
    if not any(m.by == CREATE and m.to == to for m in MOVES):
        raise ValueError(f"the lifecycle creates no run in {str(to)!r}")
    return RunInfo(status=to, **fields)


# -- records and the row change each writes with it ---------------------------------------


@dataclass(frozen=True)
class RecordMove:
    """Record ``name``, written, moves its run to one of ``to`` (``pick`` says which from its
    body; without it the writer names one), in the same write, with the row fields
    ``fields`` takes from its body."""

    name: str
    to: tuple[str, ...]
    fields: Callable[[Mapping[str, Any]], dict[str, Any]]
    pick: Callable[[Mapping[str, Any]], str] | None = None


def _completed(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "answer": body["answer"],
        "last_error": None,
        "attempts": 0,
        "turns": body["turns"],
        "usage": body["usage"],
        "spend": body["spend"],
    }


RECORD_MOVES: Mapping[str, RecordMove] = {
    m.name: m
    for m in (
        # The answer and the totals; no error, no failures in a row.
        RecordMove(names.RUN_COMPLETE, (FINISHED,), _completed),
        RecordMove(names.RUN_CANCELLED, (CANCELLED,), lambda body: {}),
        # The abort's cause is the run's last error while it rolls back.
        RecordMove(
            names.SAGA_ABORT,
            (COMPENSATING,),
            lambda body: {"last_error": body["cause"], "attempts": 0},
        ),
        # Failed when an undo failed (the writer says why in ``last_error``).
        RecordMove(
            names.RUN_COMPENSATED,
            (COMPENSATED, FAILED),
            lambda body: {"attempts": 0},
            pick=lambda body: FAILED if body.get("failed") else COMPENSATED,
        ),
        # Where the fork's copy stands: queued, halted on a call in flight, or a sub-run
        # its forked parent drives.
        RecordMove(
            names.FORK_DONE,
            (QUEUED, HALTED, AWAITING_INPUT),
            lambda body: {"last_error": None, "attempts": 0},
        ),
    )
}


def _status_of(name: str, body: Mapping[str, Any], by: str, to: str | None) -> str:
    move_ = RECORD_MOVES.get(name)
    if move_ is None:
        raise ValueError(f"the lifecycle has no row change for record {name!r}")
    if to is None:
        to = move_.pick(body) if move_.pick is not None else move_.to[0]
        if move_.pick is None and len(move_.to) > 1:
            raise ValueError(
                f"record {name!r} moves a run to one of {list(map(str, move_.to))}: say which"
            )
    if to not in move_.to:
        raise ValueError(f"record {name!r} moves no run to {str(to)!r}")
    froms(to, by)  # a move the table does not hold is never written
    return to


def row_change(
    name: str,
    body: Mapping[str, Any],
    by: str,
    *,
    to: str | None = None,
    changes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run-row change record ``name`` (``body``) is written with, by ``by``: its status
    and the fields it takes from the body (``RECORD_MOVES``), then ``changes``."""
    status = _status_of(name, body, by, to)
    return {"status": status, **RECORD_MOVES[name].fields(body), **(changes or {})}


class DriverLog(Protocol):
    """A driver's log of its run, fenced by its lease (``journal.RunLog``)."""

    def write(
        self,
        name: str,
        body: dict[str, Any],
        run_changes: dict[str, Any] | None = None,
        *,
        release: bool = False,
        sync: bool = True,
    ) -> tuple[Record, bool]: ...

    def finish_with(
        self, records: Sequence[tuple[str, dict[str, Any]]], run_changes: dict[str, Any]
    ) -> list[Record] | None: ...


class JournalWriter(Protocol):
    """The journal of every run (``journal.Journal``)."""

    def write(
        self,
        run_id: str,
        name: str,
        body: dict[str, Any],
        *,
        fence: str | None = None,
        run_changes: dict[str, Any] | None = None,
        release: bool = False,
        sync: bool = True,
    ) -> tuple[Record, bool]: ...


def record(
    log: DriverLog,
    name: str,
    body: dict[str, Any],
    by: str = DRIVER,
    *,
    to: str | None = None,
    changes: Mapping[str, Any] | None = None,
    release: bool = False,
) -> tuple[Record, bool]:
    """Write record ``name`` to a driver's log with its row change (``row_change``), both or
    neither; ``release``: the driver's last write, its lease dropped with it."""
    run_changes = row_change(name, body, by, to=to, changes=changes)
    return log.write(name, body, run_changes, release=release)


def record_in(
    journal: JournalWriter,
    run_id: str,
    name: str,
    body: dict[str, Any],
    by: str,
    *,
    fence: str,
    to: str | None = None,
) -> tuple[Record, bool]:
    """Write record ``name`` of run ``run_id`` under the lease ``fence`` names, with its row
    change (``row_change``), both or neither."""
    run_changes = row_change(name, body, by, to=to)
    return journal.write(run_id, name, body, fence=fence, run_changes=run_changes)


def finish_with(
    log: DriverLog, records: Sequence[tuple[str, dict[str, Any]]], by: str = DRIVER
) -> list[Record] | None:
    """A driver's last records in one write (``RunLog.finish_with``), with the row change of
    the last one (its end)."""
    name, body = records[-1]
    return log.finish_with(records, row_change(name, body, by))


def project(
    store: Store,
    run_id: str,
    name: str,
    by: str,
    *,
    body: Mapping[str, Any] | None = None,
    changes: Mapping[str, Any] | None = None,
    fence: str | None = None,
) -> bool:
    """Bring run ``run_id``'s row in step with record ``name`` (``body``) its journal holds:
    the record's status, with ``changes``, whatever the row said (the journal is the truth;
    a row a crash or a racing writer left behind). Not conditional; fenced with ``fence``."""
    status = _status_of(name, body or {}, by, None)
    return store.update_run(run_id, {"status": status, **(changes or {})}, fence=fence)


# -- approval requests -------------------------------------------------------------------


@dataclass(frozen=True)
class RequestMove:
    """Moving an approval request to ``to`` from any of ``from_`` (empty: asking it), by
    ``by``."""

    to: str
    from_: frozenset[str]
    by: str
    on: str

    def row(self) -> tuple[str, str, str, str]:
        """The move as docs/guarantees.md lists it: from, to, who, on what."""
        froms = (
            "(new)"
            if not self.from_
            else ", ".join(s for s in APPROVAL_STATUSES if s in self.from_)
        )
        return froms, self.to, self.by, self.on


def _r(to: str, from_: Any, by: str, on: str) -> RequestMove:
    return RequestMove(to, frozenset(from_), by, on)


_DECIDED = (APPROVAL_APPROVED, APPROVAL_DENIED)
_ASKED_BEFORE = (APPROVAL_APPROVED, APPROVAL_DENIED, APPROVAL_WITHDRAWN, APPROVAL_EXPIRED)

APPROVAL_MOVES: tuple[RequestMove, ...] = (
    _r(APPROVAL_PENDING, (), DRIVER, "a gated call asked (its request saved, fenced)"),
    _r(
        APPROVAL_PENDING,
        _ASKED_BEFORE,
        DRIVER,
        "asked again: a new start of the run, or other arguments (the row replaced, its "
        "votes dropped)",
    ),
    _r(APPROVAL_APPROVED, (APPROVAL_PENDING,), PERSON, "a decision journaled (`approval:`)"),
    _r(APPROVAL_DENIED, (APPROVAL_PENDING,), PERSON, "a decision journaled (`approval:`)"),
    _r(
        APPROVAL_EXPIRED,
        (APPROVAL_PENDING,),
        PERSON,
        "a decision finding its deadline's expiry journaled first",
    ),
    _r(
        APPROVAL_APPROVED,
        (APPROVAL_PENDING,),
        DRIVER,
        "a drive carrying out a decision its maker stopped before marking",
    ),
    _r(
        APPROVAL_DENIED,
        (APPROVAL_PENDING,),
        DRIVER,
        "a drive carrying out a decision its maker stopped before marking",
    ),
    _r(
        APPROVAL_EXPIRED,
        (APPROVAL_PENDING,),
        DRIVER,
        "a drive carrying out an expiry its sweep stopped before marking",
    ),
    _r(
        APPROVAL_APPROVED,
        (APPROVAL_PENDING,),
        SWEEP,
        "a decision its maker stopped before marking",
    ),
    _r(
        APPROVAL_DENIED,
        (APPROVAL_PENDING,),
        SWEEP,
        "a decision its maker stopped before marking",
    ),
    _r(
        APPROVAL_EXPIRED,
        (APPROVAL_PENDING,),
        SWEEP,
        "its deadline: `deadline:<call>:expire`, then the expiry's `approval:` by the deadline",
    ),
    _r(
        APPROVAL_WITHDRAWN,
        (APPROVAL_PENDING,),
        PERSON,
        "the call never runs under it: its run cancelled or its saga aborted (by whoever "
        "records or finishes the stop), deleted, or started again",
    ),
    _r(
        APPROVAL_WITHDRAWN,
        _DECIDED,
        PERSON,
        "a decision found orphaned as it was recorded (a cancel landed meanwhile)",
    ),
    _r(
        APPROVAL_WITHDRAWN,
        (APPROVAL_PENDING,),
        DRIVER,
        "the call got its result otherwise (another decision, a resolution)",
    ),
)


def request_allowed(frm: str | None, to: str, by: str | None = None) -> bool:
    """Whether the table holds a move of a request from ``frm`` (None: asking it) to
    ``to`` (by ``by``, or anyone)."""
    if frm is not None and frm == to:
        return True
    return any(
        m.to == to
        and (frm in m.from_ if frm is not None else not m.from_)
        and (by is None or m.by == by)
        for m in APPROVAL_MOVES
    )


def request_froms(to: str, by: str) -> tuple[str, ...]:
    """The statuses ``by`` may move a request from to ``to``, in ``APPROVAL_STATUSES``
    order."""
    found: set[str] = set()
    for m in APPROVAL_MOVES:
        if m.to == to and m.by == by:
            found |= m.from_
    if not found:
        raise ValueError(f"the lifecycle has no move of a request to {str(to)!r} by {by!r}")
    return tuple(s for s in APPROVAL_STATUSES if s in found)


def move_request(
    store: Store,
    run_id: str,
    call_id: str,
    to: str,
    by: str,
    *,
    only_from: Any = None,
    if_arguments: Any = None,
    if_asked_again: bool | None = None,
    if_tool_digest: str | None = None,
) -> bool:
    """Move the request of call ``call_id`` of run ``run_id`` to ``to`` if its status is one
    ``by`` may move it from (narrowed to ``only_from``); with ``if_arguments``,
    ``if_asked_again`` and ``if_tool_digest``, only the request a decision is about
    (``Store.set_approval_status``).
    True if it moved. The one writer of a request's status."""
    statuses = request_froms(to, by)
    if only_from is not None:
        narrow = {only_from} if isinstance(only_from, str) else set(only_from)
        statuses = tuple(s for s in statuses if s in narrow)
        if not statuses:
            return False
    return store.set_approval_status(
        run_id,
        call_id,
        to,
        if_status=statuses,
        if_arguments=if_arguments,
        if_asked_again=if_asked_again,
        if_tool_digest=if_tool_digest,
    )


def decided(decision: Any) -> str:
    """The status a request takes from the decision the journal holds for it."""
    if decision.get("expired"):
        return APPROVAL_EXPIRED
    return APPROVAL_APPROVED if decision.get("approved") else APPROVAL_DENIED
