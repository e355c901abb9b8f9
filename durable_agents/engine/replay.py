"""``replay(run_id, agent=None)``: today's agent code against a recorded run.

A replay re-drives the recording step by step, the way the loop would, with the model's
turns and the tools' results taken from the journal: no model and no tool is called, and
nothing is written. At each step it builds the request today's code would send (the
agent's instructions and tool schemas, the transcript) and checks it against what the
recording was sent (``replay_model.request_divergence``); then it settles the turn's calls
as today's loop would — an unknown tool, arguments today's schema refuses, a call that now
needs an approval the recording never had, a denial — using the recorded results for the
calls today's code would run.

The report says ``identical``, or the first step where today's code diverges, with its
kind and both sides, in the shape of ``compare``: the recorded steps (``a``), the steps
today's code reproduced (``b``), ``diverged_at`` and ``drift``.

Scope: a replay checks what the agent definition decides (instructions, tools, schemas,
approval gates, the turn limit) and what the loop sends; it does not run tool code, so a
tool whose body changed but whose schema did not replays identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import names, runtime
from .approvals import decision_name
from .definition import AgentDefinition
from .errors import ConfigError, NotFound, ToolArgumentsError
from .journal import Journal
from .loop import _rejection, _unknown_tool
from .model import ModelRequest, ToolCall
from .ports import Store
from .records import Record, encode
from .registry import get_agent
from .replay_model import REFUSED, TOOL_CHANGED, Divergence, instructions_for, request_divergence
from .steps import Step, prefix, steps_of
from .transcript import RunState, result_text


@dataclass(frozen=True)
class ReplayReport:
    """What a replay found. ``a``: the recorded steps; ``b``: the steps today's code
    reproduced (all of them when identical); ``diverged_at``: the first step that differs
    (None when identical); ``drift``: the divergence (``kind``, ``message``, ``recorded``,
    ``today``), empty when identical."""

    run_id: str
    agent: str
    a: list[Step]
    b: list[Step]
    diverged_at: int | None
    drift: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.diverged_at is None

    @property
    def kind(self) -> str | None:
        return self.drift.get("kind")

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "identical": self.identical,
            "a": [s.to_json() for s in self.a],
            "b": [s.to_json() for s in self.b],
            "diverged_at": self.diverged_at,
            "drift": self.drift,
        }

    def describe(self) -> str:
        """One paragraph a person reads: identical, or where and how it diverged."""
        if self.identical:
            return f"run {self.run_id!r} replays identical ({len(self.a)} steps)"
        return (
            f"run {self.run_id!r} diverges at step {self.diverged_at} of {len(self.a)} "
            f"({self.kind}): {self.drift.get('message')}\n"
            f"  recorded: {encode(self.drift.get('recorded'))}\n"
            f"  today:    {encode(self.drift.get('today'))}"
        )


def replay(
    run_id: str, agent: AgentDefinition | None = None, *, store: Store | None = None
) -> ReplayReport:
    """Replay run ``run_id`` against today's ``agent`` (default: the agent registered under
    the name the run recorded). Calls no model and no tool, and writes nothing."""
    store = store or runtime.store()
    records = Journal(store).records(run_id)
    if not records:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    return replay_records(records, agent, run_id=run_id)


def replay_records(
    records: Sequence[Record], agent: AgentDefinition | None = None, *, run_id: str | None = None
) -> ReplayReport:
    """``replay`` over records already read (an exported file, another store)."""
    records = list(records)
    state = RunState.of(records)
    run_id = run_id or (records[0].run_id if records else "")
    if state.start is None:
        raise ConfigError(
            f"run {run_id!r} has no run:start record: there is nothing to replay",
            code="replay.not_started",
        )
    agent = agent or get_agent(str(state.start.get("agent")))
    a = steps_of(records)
    today = list(records)
    for n, turn in enumerate(state.turns, start=1):
        found = _step_divergence(agent, records, today, state, n, turn)
        if isinstance(found, Divergence):
            return ReplayReport(
                run_id, agent.name, a, steps_of(prefix(today, n - 1)), n, found.to_json()
            )
        today = found
    return ReplayReport(run_id, agent.name, a, steps_of(today), None)


def _step_divergence(
    agent: AgentDefinition,
    records: list[Record],
    today: list[Record],
    state: RunState,
    n: int,
    turn: Record,
) -> Divergence | list[Record]:
    """The divergence at step ``n``, or today's records with the step's calls settled."""
    if n > agent.max_turns:
        return Divergence(
            n,
            REFUSED,
            f"today's agent stops after max_turns={agent.max_turns} turns; the recording "
            f"has {len(state.turns)}",
            len(state.turns),
            agent.max_turns,
        )
    now = RunState.of(prefix(today, n - 1))
    request = ModelRequest(
        instructions=instructions_for(state, n, agent.instructions),
        messages=now.messages(),
        tools=agent.tool_specs(),
    )
    found = request_divergence(records, n, request)
    if found is not None:
        return found
    by_name = {r.name: r for r in records}
    for call in state.calls(turn):
        rec = state.results.get(call.id)
        settled = _settle(agent, by_name, n, call, rec)
        if isinstance(settled, Divergence):
            return settled
        if settled is not None and rec is not None:
            today = [settled if r.name == rec.name else r for r in today]
    return today


def _settle(
    agent: AgentDefinition,
    by_name: dict[str, Record],
    n: int,
    call: ToolCall,
    rec: Record | None,
) -> Divergence | Record | None:
    """How today's loop settles ``call``: a divergence, the result record today's loop would
    write itself (an error it gives without running the tool), or None when the recorded
    result stands (the tool ran, or the recording still waits on the call)."""
    tool = agent.tools.get(call.name)
    if tool is None:  # a tool the recorded turn was not offered either: the model made it up
        return _own(rec, call, _unknown_tool(call, agent))
    try:
        args = tool.validate(call.arguments)
    except ToolArgumentsError as exc:
        own = {"error": str(exc)}
        if rec is not None and not rec.get("is_error"):
            return Divergence(
                n,
                REFUSED,
                f"today's tool {call.name!r} refuses the arguments of call {call.id!r}, which "
                "the recording ran",
                rec.get("result"),
                own,
            )
        return _own(rec, call, own)
    decisions = [
        d
        for d in (
            by_name.get(decision_name(call.id, args, again=False)),
            by_name.get(
                decision_name(call.id, args, again=True, tool_digest=tool.definition_digest or "")
            ),
        )
        if d is not None
    ]
    decision = next(
        (
            d
            for d in decisions
            if not d.get("approved")
            or d.get("arguments") is None
            or encode(d.get("arguments")) == encode(args)
        ),
        None,
    )
    if tool.safety.gated:
        if decision is None:
            if rec is None:
                return None  # the recording awaits this decision too
            return Divergence(
                n,
                REFUSED,
                f"today's tool {call.name!r} requires an approval of call {call.id!r} with "
                "these arguments; the recording ran it without one",
                {"arguments": args, "approval": None},
                {"arguments": args, "requires_approval": True},
            )
        if not decision.get("approved"):
            return _own(rec, call, _rejection(decision))
        return None
    if decision is not None and not decision.get("approved") and rec is not None:
        return Divergence(
            n,
            TOOL_CHANGED,
            f"tool {call.name!r} no longer requires approval: today's code would run call "
            f"{call.id!r}, which the recording's approver denied",
            {"requires_approval": True, "approved": False},
            {"requires_approval": False},
        )
    return None


def _own(rec: Record | None, call: ToolCall, result: Any) -> Record | None:
    """The error result today's loop writes for ``call`` without running a tool, in place of
    the recorded one (the next request shows any difference)."""
    if rec is None:
        return None
    body = names.tool_body(call.id, call.name, result, is_error=True)
    if result_text(body) == result_text(rec) and rec.get("is_error"):
        return None
    return Record(rec.run_id, rec.name, rec.seq, encode(body), rec.created_at)
