"""Rebuilding what the model saw from the journal alone.

The transcript of a run is: its input as the first user message (after any seed messages a
session put before it), then for each recorded model turn ``model:<n>`` its assistant
message, then one tool message per call **in call order** (the ``tool:<call>`` records),
then any user messages recorded after that turn (``user:<n>``, which holds one, or more
when a fork of a fork appended again at the same step; ``user:0`` follows the input).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import names
from .model import Message, ToolCall, Usage
from .records import Record, encode


def input_text(value: Any) -> str:
    return value if isinstance(value, str) else encode(value)


def result_text(record: Record | Mapping[str, Any]) -> str:
    """The text a tool message carries for a recorded result."""
    body = record.body if isinstance(record, Record) else record
    result = body.get("result")
    return result if isinstance(result, str) else encode(result)


def user_messages(record: Record) -> list[Message]:
    """The messages a ``user:<n>`` record sends: its text, then any a fork of a fork
    appended at the same step (``then``)."""
    texts = [record.get("text"), *(record.get("then") or ())]
    return [Message("user", input_text(text)) for text in texts]


# ``RunState.of`` folds every record of a run on each drive: it tells names apart by their
# first five characters, which differ for every prefix below.
_P = 5
_MODEL = names.MODEL[:_P]
_TOOL = names.TOOL[:_P]
_USER = names.USER[:_P]
_SPEND = names.SPEND[:_P]
_ATTEMPT = names.ATTEMPT[:_P]
_NOT_STARTED = names.NOT_STARTED[:_P]
_STEP = names.STEP[:_P]
_COMPENSATE = names.COMPENSATE[:_P]
_CHILD = names.CHILD[:_P]
_UNKNOWN = names.UNKNOWN[:_P]
_HANDLE = names.HANDLE[:_P]


@dataclass
class RunState:
    """What the journal says about a run, read in one pass."""

    start: Record | None = None
    turns: list[Record] = field(default_factory=list)
    results: dict[str, Record] = field(default_factory=dict)
    user_after: dict[int, Record] = field(default_factory=dict)
    complete: Record | None = None
    cancelled: Record | None = None
    fork: Record | None = None
    fork_done: bool = False
    # A fork's records before this seq (its ``fork:done``) were copied from its source.
    copied_until: int = 0
    # A saga's abort (from then on the run only rolls back), its undos by call id, its end.
    saga_abort: Record | None = None
    compensations: dict[str, Record] = field(default_factory=dict)
    compensated: Record | None = None
    spend_records: list[Record] = field(default_factory=list)
    # Attempt claims (``attempt:<op>:<k>``), the attempts recorded as never started, and the
    # values of durable steps: what decides whether an op's outcome is unknown.
    markers: list[Record] = field(default_factory=list)
    not_started: set[str] = field(default_factory=set)
    step_values: set[str] = field(default_factory=set)
    # What a tool said of an attempt it could not tell the outcome of, by attempt name.
    unknown: dict[str, Record] = field(default_factory=dict)
    # Where a call's work is held while it runs elsewhere (``handle:<call>``), by call id: a
    # live attempt with one is resumed by waiting on it, not halted (``engine.handles``).
    handles: dict[str, Record] = field(default_factory=dict)
    # The sub-run each call started (``child:<call>``), by call id: ``<run>/<call>``, or, in a
    # fork, a child of its source that had ended before the fork point (a reference).
    children: dict[str, str] = field(default_factory=dict)
    # Parsed messages by record name: records never change, and a driver rebuilds the
    # transcript every turn, which would otherwise re-parse every earlier turn.
    _parsed: dict[str, Message] = field(default_factory=dict, repr=False, compare=False)
    # Running totals, caught up when asked (a driver asks after every turn; a finished run's
    # re-entry never asks, so its records are not even decoded).
    _usage: Usage = field(default_factory=Usage, repr=False, compare=False)
    _extra: Usage = field(default_factory=Usage, repr=False, compare=False)
    _call_ids: set[str] = field(default_factory=set, repr=False, compare=False)
    _counted: list[int] = field(default_factory=lambda: [0, 0, 0], repr=False, compare=False)
    # The transcript's settled prefix (``messages``): the messages of the first turns whose
    # calls all have results, rebuilt only when what it was built from may have changed.
    _prefix: list[Message] = field(default_factory=list, init=False, repr=False, compare=False)
    _prefix_turns: int = field(default=0, init=False, repr=False, compare=False)
    _prefix_key: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, records: Iterable[Record]) -> RunState:
        state = cls()
        models: dict[int, Record] = {}
        for rec in records:
            name = rec.name
            prefix = name[:_P]
            if prefix == _MODEL:
                models[int(name[len(names.MODEL) :])] = rec
            elif prefix == _TOOL:
                state.results[name[len(names.TOOL) :]] = rec
            elif prefix == _USER:
                state.user_after[int(name[len(names.USER) :])] = rec
            elif prefix == _SPEND:
                state.spend_records.append(rec)
            elif prefix == _ATTEMPT:
                state.markers.append(rec)
            elif prefix == _NOT_STARTED:
                state.not_started.add(name)
            elif prefix == _STEP:
                state.step_values.add(name)
            elif prefix == _COMPENSATE:
                state.compensations[name[len(names.COMPENSATE) :]] = rec
            elif prefix == _CHILD:
                state.children[name[len(names.CHILD) :]] = str(rec.get("run_id"))
            elif prefix == _UNKNOWN:
                state.unknown[name[len(names.UNKNOWN) :]] = rec
            elif prefix == _HANDLE:
                state.handles[name[len(names.HANDLE) :]] = rec
            elif name == names.SAGA_ABORT:
                state.saga_abort = rec
            elif name == names.RUN_COMPENSATED:
                state.compensated = rec
            elif name == names.RUN_START:
                state.start = rec
            elif name == names.RUN_COMPLETE:
                state.complete = rec
            elif name == names.RUN_CANCELLED:
                state.cancelled = rec
            elif name == names.FORK:
                state.fork = rec
            elif name == names.FORK_DONE:
                state.fork_done = True
                state.copied_until = rec.seq
        n = 1
        while n in models:  # turns are recorded in order; stop at the first gap
            state.turns.append(models[n])
            n += 1
        return state

    def add(self, rec: Record) -> None:
        """Fold in a record this driver just wrote."""
        name = rec.name
        if name.startswith(names.MODEL):
            self.turns.append(rec)
        elif name.startswith(names.TOOL):
            self.results[name[len(names.TOOL) :]] = rec
        elif name.startswith(names.USER):
            self.user_after[int(name[len(names.USER) :])] = rec
        elif name.startswith(names.SPEND):
            self.spend_records.append(rec)
        elif name.startswith(names.ATTEMPT):
            self.markers.append(rec)
        elif name.startswith(names.NOT_STARTED):
            self.not_started.add(name)
        elif name.startswith(names.STEP):
            self.step_values.add(name)
        elif name.startswith(names.COMPENSATE):
            self.compensations[name[len(names.COMPENSATE) :]] = rec
        elif name == names.SAGA_ABORT:
            self.saga_abort = rec
        elif name == names.RUN_COMPENSATED:
            self.compensated = rec
        elif name == names.RUN_START:
            self.start = rec
        elif name == names.RUN_COMPLETE:
            self.complete = rec
        elif name == names.RUN_CANCELLED:
            self.cancelled = rec
        elif name.startswith(names.UNKNOWN):
            self.unknown[name[len(names.UNKNOWN) :]] = rec
        elif name.startswith(names.HANDLE):
            self.handles[name[len(names.HANDLE) :]] = rec

    def has_outcome(self, op: str) -> bool:
        """Whether ``op`` (a call id, ``step:<name>`` or ``compensate:<call>``) has a
        recorded outcome."""
        if names.is_compensation(op):
            return op[len(names.COMPENSATE) :] in self.compensations
        return op in self.results or op in self.step_values

    def live_attempts(self) -> dict[str, Record]:
        """Each op's live attempt marker: a claim with no outcome recorded for its op and no
        record that it never started. Its effect may have happened: the run must halt."""
        claims: dict[str, dict[int, Record]] = {}
        for rec in self.markers:
            parsed = names.parse_attempt(rec.name)
            if parsed is not None and parsed[0]:
                claims.setdefault(parsed[0], {})[parsed[1]] = rec
        live: dict[str, Record] = {}
        for op, by_k in claims.items():
            if self.has_outcome(op):
                continue
            k = 1
            while k in by_k:
                if names.not_started(op, k) not in self.not_started:
                    live[op] = by_k[k]
                    break
                k += 1
        return live

    @staticmethod
    def assistant(turn: Record) -> Message:
        return Message.from_json(turn.get("message") or {"role": "assistant"})

    def _assistant(self, turn: Record) -> Message:
        message = self._parsed.get(turn.name)
        if message is None:
            message = self._parsed[turn.name] = self.assistant(turn)
        return message

    def _tool(self, call: ToolCall, rec: Record) -> Message:
        message = self._parsed.get(rec.name)
        if message is None:
            message = self._parsed[rec.name] = Message(
                "tool",
                result_text(rec),
                tool_call_id=call.id,
                name=call.name,
                is_error=bool(rec.get("is_error")),
            )
        return message

    def calls(self, turn: Record) -> tuple[ToolCall, ...]:
        return self._assistant(turn).tool_calls

    def usage(self) -> Usage:
        for turn in self.turns[self._counted[0] :]:
            self._usage = self._usage + Usage.from_json(turn.get("usage"))
        self._counted[0] = len(self.turns)
        return self._usage

    def spend(self) -> Usage:
        for rec in self.spend_records[self._counted[1] :]:
            self._extra = self._extra + Usage.from_json(rec.get("usage"))
        self._counted[1] = len(self.spend_records)
        return self.usage() + self._extra

    def instructions(self, default: str) -> str:
        """The instructions this run's model calls get: a fork's patch may replace them."""
        if self.fork is not None:
            patched = (self.fork.get("patch") or {}).get("instructions")
            if patched is not None:
                return str(patched)
        return default

    def seed(self) -> list[Message]:
        if self.start is None:
            return []
        return [Message.from_json(m) for m in self.start.get("seed") or ()]

    def messages(self) -> list[Message]:
        """The transcript as the model sees it after every recorded step.

        A driver asks before every turn. Records never change and a settled turn (every
        call answered) stays settled, so the messages of settled turns are kept and only
        later turns are added: a run of n turns costs O(n), not O(n²). The kept prefix is
        dropped if the run's start or its user messages change (a session's next message)."""
        key = (self.start, self.user_after.get(0), len(self.user_after))
        if key != self._prefix_key:
            out = self.seed()
            if self.start is not None:
                out.append(Message("user", input_text(self.start.get("input"))))
            first = self.user_after.get(0)  # a fork at step 0 may add a message to the input
            if first is not None:
                out.extend(user_messages(first))
            self._prefix, self._prefix_turns, self._prefix_key = out, 0, key
        prefix = self._prefix
        out = list(prefix)
        settled = True
        for n in range(self._prefix_turns + 1, len(self.turns) + 1):
            message = self._assistant(self.turns[n - 1])
            out.append(message)
            for call in message.tool_calls:
                rec = self.results.get(call.id)
                if rec is None:
                    settled = False
                    break  # a pending call: nothing after it is sent yet
                out.append(self._tool(call, rec))
            user = self.user_after.get(n)
            if user is not None:
                out.extend(user_messages(user))
            if settled:
                prefix[len(prefix) :] = out[len(prefix) :]
                self._prefix_turns = n
        return out

    def call_ids(self) -> set[str]:
        for turn in self.turns[self._counted[2] :]:
            self._call_ids.update(c.id for c in self.calls(turn))
        self._counted[2] = len(self.turns)
        return set(self._call_ids)


@dataclass(frozen=True)
class ToolResult:
    """A call's recorded outcome (``tool:<call>``, or an undo's ``compensate:<call>``) read
    once, typed: what ``names.tool_body`` wrote. The history API, compare and the admin's
    timeline read results through it."""

    call_id: str
    name: str
    result: Any
    is_error: bool
    read_only: bool = False
    patched: bool = False  # a fork's patch replaced it
    reconciled: bool = False  # a person recorded it (a halt resolved), with ``by``
    by: str | None = None
    evidence: Any = None
    compensates: str | None = None  # an undo: the call it undid

    @classmethod
    def of(cls, rec: Record) -> ToolResult:
        by = rec.get("by")
        return cls(
            call_id=str(rec.get("call_id") or rec.name.split(":", 1)[-1]),
            name=str(rec.get("name") or ""),
            result=rec.get("result"),
            is_error=bool(rec.get("is_error")),
            read_only=bool(rec.get("read_only")),
            patched=bool(rec.get("patched")),
            reconciled=bool(rec.get("reconciled")),
            by=str(by) if by is not None else None,
            evidence=rec.get("evidence"),
            compensates=rec.get("compensates"),
        )


def outcome_of(record: Record) -> dict[str, Any]:
    """A halt row's resolution, as the journal's outcome record (``tool:`` or ``step:``)
    holds it."""
    if record.kind == "step":
        return {
            "result": record.get("value"),
            "is_error": False,
            "evidence": record.get("evidence"),
        }
    return {
        "result": record.get("result"),
        "is_error": bool(record.get("is_error")),
        "evidence": record.get("evidence"),
    }
