"""A run read as steps, from its journal alone (no model or tool is called):

* ``history(run_id)`` — a run's steps, one per model turn (its text, its tool calls with
  their results, approvals); ``as_of(run_id, step)`` — the transcript as it stood after
  that step;
* ``compare(a, b)`` — each run's steps, the first step where they differ (call ids aside),
  and the drift: tool order, arguments, step count, finish.

Forking a run at a step is a command: ``engine.commands.forks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import names, runtime
from .errors import ConfigError, NotFound
from .journal import Journal
from .model import Message
from .ports import Store
from .records import Record, decode, encode
from .transcript import RunState, ToolResult


@dataclass(frozen=True)
class ToolStep:
    call_id: str
    name: str
    arguments: Any
    result: Any = None
    is_error: bool = False
    has_result: bool = False
    reconciled: bool = False
    approval: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Step:
    step: int
    text: str
    tool_calls: tuple[ToolStep, ...]
    usage: Mapping[str, int]
    finish: str
    at: str | None

    def shape(self) -> tuple[Any, ...]:
        """What the step did, call ids aside: for comparing trajectories."""
        return (
            self.text,
            tuple(
                (t.name, encode(t.arguments), encode(t.result), t.is_error) for t in self.tool_calls
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "text": self.text,
            "tool_calls": [t.__dict__ for t in self.tool_calls],
            "usage": dict(self.usage),
            "finish": self.finish,
            "at": self.at,
        }


def _args(raw: str) -> Any:
    try:
        return decode(raw or "{}")
    except Exception:
        return raw


def steps_of(records: Sequence[Record]) -> list[Step]:
    state = RunState.of(records)
    by_name = {r.name: r for r in records}
    steps = []
    for n, turn in enumerate(state.turns, start=1):
        message = state.assistant(turn)
        calls = []
        for call in message.tool_calls:
            rec = state.results.get(call.id)
            outcome = ToolResult.of(rec) if rec is not None else None
            approval = by_name.get(names.decision(call.id))
            calls.append(
                ToolStep(
                    call_id=call.id,
                    name=call.name,
                    arguments=_args(call.arguments),
                    result=outcome.result if outcome else None,
                    is_error=outcome.is_error if outcome else False,
                    has_result=outcome is not None,
                    reconciled=outcome.reconciled if outcome else False,
                    approval=dict(approval.body) if approval else None,
                )
            )
        steps.append(
            Step(
                step=n,
                text=message.content,
                tool_calls=tuple(calls),
                usage=dict(turn.get("usage") or {}),
                finish=str(turn.get("finish") or ""),
                at=turn.created_at.isoformat() if turn.created_at else None,
            )
        )
    return steps


def history(run_id: str, *, store: Store | None = None) -> list[Step]:
    """The steps of a run, in order, from its journal (no model or tool is called)."""
    store = store or runtime.store()
    return steps_of(Journal(store).records(run_id))


def as_of(run_id: str, step: int, *, store: Store | None = None) -> list[Message]:
    """The transcript as it stood after ``step`` (0: just the input)."""
    store = store or runtime.store()
    records = Journal(store).records(run_id)
    state = RunState.of(records)
    check_step(run_id, step, len(state.turns))
    return RunState.of(prefix(records, step)).messages()


def check_step(run_id: str, step: Any, count: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= count:
        raise ConfigError(
            f"run {run_id!r} has no step {step!r}; its steps are 0-{count} (0 is the input)",
            code="history.step",
        )


def prefix(records: Sequence[Record], step: int) -> list[Record]:
    """The records a run held right after ``step``: its turns up to it, their results, the
    attempts of their calls (a claim with no result is an outcome nobody knows) with what a
    tool said of one it could not tell, and the user messages sent after them."""
    state = RunState.of(records)
    keep_calls = {c.id for turn in state.turns[:step] for c in state.calls(turn)}
    out = []
    for rec in records:
        name = rec.name
        head, colon, rest = name.partition(":")
        kind = head + colon  # the name's prefix, as ``names`` spells it
        if (
            name in (names.HEADER, names.RUN_START)
            or (kind == names.MODEL and int(rest) <= step)
            or (kind == names.USER and int(rest) <= step)
            or (kind == names.TOOL and rest in keep_calls)
            or (
                kind in (names.ATTEMPT, names.NOT_STARTED) and rest.rpartition(":")[0] in keep_calls
            )
            or (name.startswith(names.SPEND) and int(name.split("/")[1]) <= step)
            or (name.startswith(names.UNKNOWN) and _op_of(name[len(names.UNKNOWN) :]) in keep_calls)
        ):
            out.append(rec)
    return out


def _op_of(attempt_name: str) -> str | None:
    parsed = names.parse_attempt(attempt_name)
    return parsed[0] if parsed is not None else None


@dataclass(frozen=True)
class Comparison:
    a: list[Step]
    b: list[Step]
    diverged_at: int | None
    drift: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": [s.to_json() for s in self.a],
            "b": [s.to_json() for s in self.b],
            "diverged_at": self.diverged_at,
            "drift": self.drift,
        }


def compare(a: str, b: str, *, store: Store | None = None) -> Comparison:
    """Where two runs' trajectories part, call ids aside."""
    store = store or runtime.store()
    for run_id in (a, b):
        if store.get_run(run_id) is None:
            raise NotFound(f"no run {run_id!r}", code="run.not_found")
    journal = Journal(store)
    ra, rb = journal.records(a), journal.records(b)
    sa, sb = steps_of(ra), steps_of(rb)
    diverged = None
    for i in range(max(len(sa), len(sb))):
        if i >= len(sa) or i >= len(sb) or sa[i].shape() != sb[i].shape():
            diverged = i + 1
            break
    fa, fb = RunState.of(ra).complete, RunState.of(rb).complete
    drift: dict[str, Any] = {
        "tool_order": [
            [t.name for s in sa for t in s.tool_calls],
            [t.name for s in sb for t in s.tool_calls],
        ],
        "arguments": [
            {"step": x.step, "tool": tx.name, "a": tx.arguments, "b": ty.arguments}
            for x, y in zip(sa, sb, strict=False)
            for tx, ty in zip(x.tool_calls, y.tool_calls, strict=False)
            if tx.name == ty.name and encode(tx.arguments) != encode(ty.arguments)
        ],
        "step_count": [len(sa), len(sb)],
        "finish": [
            fa.get("answer") if fa else None,
            fb.get("answer") if fb else None,
        ],
    }
    drift["tool_order_changed"] = drift["tool_order"][0] != drift["tool_order"][1]
    return Comparison(sa, sb, diverged, drift)
