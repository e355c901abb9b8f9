"""Read models: a run's journal as pages and endpoints read it, decoded in one place.

The admin and the API never spell a journal name or test a record's name themselves: they
read here (``database.reads`` brings the rows). Each record kind is told in one place:

* ``KINDS`` — the table from a record's name (whole, or its prefix) to its kind; ``read``
  turns a record into an ``Entry``: its kind and the part of its name past the prefix
  (a call id, a turn number, a step's name), decoded by that kind's key decoder.
* ``Start`` — a ``run:start`` record: agent, input, fingerprint, which start of the run id.
* ``Child`` — a ``child:`` record: the sub-run a call started (or, in a fork, its source's).
* ``Drift`` — an ``@drift/`` record: the fingerprint a run resumed under, and what changed.
* ``decided_by``, ``late_results``, ``saga_aborted`` — what a page asks of a run's records:
  who decided a call, the results that came after their driver lost the run, whether its
  saga was aborted.

``Record`` (a record as read back) is here for the pages' annotations; ``canonical`` is the
journal's encoding, for comparing two values as the journal would.

Also the checks a reader applies to an id it is handed (a run id, a session id, a wait's
name): the journal's own rules, so an endpoint refuses what the journal could never hold.
Read-only: nothing here writes, and nothing here queries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import names
from .errors import ProtocolError
from .names import (
    API_CHANNEL,
    SESSION_JOURNAL_SUFFIX,
    session_journal,
    validate_session_id,
    validate_wait_name,
)
from .records import Record, decode, encode, validate_run_id

__all__ = [
    "API_CHANNEL",
    "KINDS",
    "SESSION_JOURNAL_SUFFIX",
    "Child",
    "Drift",
    "Entry",
    "Record",
    "Start",
    "canonical",
    "decided_by",
    "late_results",
    "read",
    "saga_aborted",
    "session_journal",
    "validate_run_id",
    "validate_session_id",
    "validate_wait_name",
]

# A record's kind by its whole name, then by its name's prefix. The kinds the admin's
# timeline describes, each once; a name no entry claims is read as OTHER.
WHOLE: dict[str, str] = {
    names.HEADER: "header",
    names.FORK_DONE: "fork-done",
    names.RUN_START: "start",
    names.SAGA_ABORT: "saga-abort",
    names.RUN_COMPENSATED: "compensated",
    names.RUN_COMPLETE: "complete",
    names.RUN_CANCELLED: "cancelled",
    names.FORK: "fork",
}
PREFIXES: dict[str, str] = {
    names.LATE: "late",
    names.CHILD: "child",
    names.HANDLE: "handle",
    names.PROGRESS: "progress",
    names.UNKNOWN: "unknown",
    names.MODEL: "model",
    names.ATTEMPT: "attempt",
    names.NOT_STARTED: "not-started",
    names.TOOL: "tool",
    names.COMPENSATE: "undo",
    names.APPROVAL: "approval",
    names.DRIFT: "drift",
    names.TAKEOVER: "takeover",
    names.SPEND: "spend",
    names.USER: "user",
    names.STEP: "step",
    names.RULE: "rule",
    names.DEADLINE: "deadline",
    names.WAIT: "wait",
    names.INPUT: "input",
    names.SIGNAL: "signal",
    names.WAITED: "waited",
    names.MESSAGE: "message",
    names.ACK: "ack",
    names.RECEIVING: "receiving",
}
OTHER = "other"
KINDS = frozenset([*WHOLE.values(), *PREFIXES.values(), OTHER])


def canonical(value: Any) -> str:
    """``value`` as the journal holds it, byte for byte (``ProtocolError`` if it cannot be):
    two values are the same value when these are."""
    return encode(value)


@dataclass(frozen=True)
class Entry:
    """One record read as its kind.

    ``key`` is the name past the kind's prefix ("" for a kind named whole); ``call`` and
    ``attempt`` are an attempt marker's call (or undo) and attempt number; ``turn`` is a
    model turn's number; ``undoes`` is the call an undo's attempt marker undoes. ``internal``:
    a name the engine keeps for itself (``@``), shown styled as such.
    """

    kind: str
    key: str
    record: Record
    call: str | None = None
    attempt: str | None = None
    turn: int | None = None
    undoes: str | None = None

    @property
    def internal(self) -> bool:
        return self.record.name.startswith("@")


def _plain(kind: str, key: str, rec: Record) -> Entry:
    return Entry(kind, key, rec)


def _model(kind: str, key: str, rec: Record) -> Entry:
    return Entry(kind, key, rec, turn=int(key))


def _attempt(kind: str, key: str, rec: Record) -> Entry:
    call, _, k = key.rpartition(":")
    undoes = call[len(names.COMPENSATE) :] if names.is_compensation(call) else None
    return Entry(kind, key, rec, call=call, attempt=k, undoes=undoes)


# The key decoder of each kind that reads more from a name than the part past its prefix.
_KEYS: dict[str, Callable[[str, str, Record], Entry]] = {
    "model": _model,
    "attempt": _attempt,
    "not-started": _attempt,
}


def kind_of(name: str) -> tuple[str, str]:
    """A record name's kind and the part of it past the kind's prefix."""
    kind = WHOLE.get(name)
    if kind is not None:
        return kind, ""
    for prefix, kind in PREFIXES.items():
        if name.startswith(prefix):
            return kind, name[len(prefix) :]
    return OTHER, name


def read(rec: Record) -> Entry:
    """``rec`` as its kind (a model turn's number is decoded here: a malformed one raises
    ``ValueError``, as reading its body would)."""
    kind, key = kind_of(rec.name)
    return _KEYS.get(kind, _plain)(kind, key, rec)


def decided_by(records: Iterable[Record], call_id: str) -> str:
    """Who the journal's last decision on the call names ("dora for lena" when a deputy
    made it), "" when there is none: a call asked again is decided again, under a name per
    argument set (``approval:<call>:<tag>``)."""
    first = names.decision(call_id)
    found = [
        r
        for r in records
        if r.name == first
        or (r.name.startswith(first + ":") and ":" not in r.name[len(first) + 1 :])
    ]
    if not found:
        return ""
    return str(found[-1].get("decided_by") or found[-1].get("by") or "")


def saga_aborted(records: Iterable[Record]) -> bool:
    """Whether the run's saga was aborted (``saga:abort``): it only rolls back from there."""
    return any(rec.name == names.SAGA_ABORT for rec in records)


def late_results(records: Iterable[Record], call_id: str) -> list[Record]:
    """The call's results that arrived after their driver lost the run (``@late/``): kept
    as evidence, never as the call's result."""
    prefix = f"{names.LATE}{call_id}/"
    return [rec for rec in records if rec.name.startswith(prefix)]


@dataclass(frozen=True)
class Start:
    """A run's ``run:start``: which start of its id this is (``incarnation``, signed
    decisions bind it) at which commit position, and what it started with."""

    run_id: str
    seq: int
    incarnation: str
    agent: str | None = None
    input: Any = None
    fingerprint: dict[str, Any] | None = None

    @classmethod
    def of(cls, rec: Record) -> Start:
        return cls.of_body(rec.run_id, rec.seq, rec.body)

    @classmethod
    def of_body(cls, run_id: str, seq: int, body: Any) -> Start:
        body = body if isinstance(body, dict) else {}
        agent, fingerprint = body.get("agent"), body.get("fingerprint")
        return cls(
            run_id=run_id,
            seq=seq,
            incarnation=str(body.get("incarnation") or ""),
            agent=agent if isinstance(agent, str) else None,
            input=body.get("input"),
            fingerprint=fingerprint if isinstance(fingerprint, dict) else None,
        )

    @classmethod
    def of_row(cls, run_id: str, seq: int, data: str) -> Start | None:
        """From a stored row's columns; None when its data is not JSON."""
        try:
            return cls.of_body(run_id, seq, decode(data))
        except ProtocolError:
            return None


@dataclass(frozen=True)
class Child:
    """A ``child:<call>`` record: the sub-run the call started (``<run>/<call>``), or, in a
    fork, its source's ended child, which the fork references instead of running again."""

    call_id: str
    run_id: str
    agent: str | None

    @classmethod
    def of(cls, call_id: str, data: str) -> Child:
        try:
            body = decode(data)
        except ProtocolError:
            body = {}
        body = body if isinstance(body, dict) else {}
        agent = body.get("agent")
        return cls(call_id, str(body.get("run_id")), agent if isinstance(agent, str) else None)


@dataclass(frozen=True)
class Drift:
    """An ``@drift/<hash>`` record: the run resumed under a changed agent."""

    seq: int
    at: Any
    hash: Any
    changes: Any

    @classmethod
    def of(cls, rec: Record, key: str) -> Drift:
        """``key``: the name past its prefix (the hash, when the body does not say)."""
        to = rec.body.get("to")
        return cls(
            seq=rec.seq,
            at=rec.created_at,
            hash=to.get("hash") if isinstance(to, dict) else key,
            changes=rec.body.get("changes"),
        )
