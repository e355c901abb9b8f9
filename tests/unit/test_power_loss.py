"""A power loss after every write of a run, in both durability modes, on the in-memory store.

``Recorder`` keeps every write the engine makes, in order, with its ``sync`` flag, and
"loses power" right after the n-th one: the process dies there (nothing more reaches the
store), and the store that comes back holds what a database with a write-ahead log in
commit order would keep in the worst case — every write up to the last durable one, none
of the relaxed writes after it. A fresh driver then resumes the run on that store.

The model answers differently each time it is asked (its arguments carry a counter), so a
turn that is lost and asked again is visible: a side effect may never fire twice, nor an
idempotent call fire again with other arguments; a read-only call may. The rule this
defends is in ``engine/durability.py`` (docs/durability.md).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Clock

FIRED: list[tuple[str, str, str]] = []  # (call id, tool, arguments as JSON)
SIDE_EFFECT = "charge"

# The tools each turn calls; then an answer.
PLAN = [["look"], ["notify"], ["charge"], ["look", "charge"], ["notify", "look"]]
MUTATING = frozenset(
    {
        "create_run",
        "start_run",
        "start_or_load",
        "insert",
        "finish_run",
        "update_run",
        "acquire_lease",
        "release_lease",
        "save_halt",
        "resolve_halt_row",
        "orphan_halts",
        "save_approval_request",
        "set_approval_status",
        "advance_deadline",
        "save_decision",
        "log_action",
        "mark_dispatched",
        "delete_run",
    }
)


class PowerLoss(BaseException):
    """The process died with the machine: nothing catches it."""


class Recorder:
    """An ``InMemoryStore`` whose writes are kept in order; the power goes after write
    ``fail_after`` (counted from 1), and every call after that dies too."""

    def __init__(self, store: InMemoryStore, fail_after: int | None) -> None:
        self._store = store
        self.fail_after = fail_after
        self.writes: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise PowerLoss(name)
            result = attr(*args, **kwargs)
            if name in MUTATING:
                self.writes.append((name, args, kwargs))
                if len(self.writes) == self.fail_after:
                    self.dead = True
                    raise PowerLoss(name)
            return result

        return call

    def survivor(self, clock: Clock) -> InMemoryStore:
        """What comes back: every write up to the last durable one (relaxed ones before it
        are durable with it), none of the relaxed writes after it."""
        last_durable = max(
            (i for i, (_, _, kw) in enumerate(self.writes) if kw.get("sync", True)), default=-1
        )
        store = InMemoryStore(clock=clock)
        for name, args, kwargs in self.writes[: last_durable + 1]:
            getattr(store, name)(*args, **kwargs)
        return store

    def relaxed_lost(self) -> list[str]:
        tail: list[str] = []
        for name, args, kwargs in self.writes:
            if kwargs.get("sync", True):
                tail = []
            else:
                tail.append(f"{name} {args[1]}")
        return tail


class Fickle:
    """A model that answers by the plan, with arguments that change every time it is asked."""

    model_id = "fickle"

    def __init__(self) -> None:
        self.asked = 0

    def generate(self, request: ModelRequest) -> ModelResponse:
        self.asked += 1
        n = sum(1 for m in request.messages if m.role == "assistant")
        if n >= len(PLAN):
            return ModelResponse(Message("assistant", "done"), Usage(10, 5), FINISH_STOP)
        calls = tuple(
            ToolCall(f"c{n + 1}_{i}", tool, json.dumps({"item": f"{n + 1}/{self.asked}"}))
            for i, tool in enumerate(PLAN[n])
        )
        return ModelResponse(
            Message("assistant", "", tool_calls=calls), Usage(10, 5), FINISH_TOOL_CALLS
        )


def _fire(ctx: da.ToolContext, tool: str, item: str) -> dict:
    FIRED.append((ctx.call_id, tool, item))
    return {"tool": tool, "item": item}


@da.tool(read_only=True, name="look")
def look(item: str, ctx: da.ToolContext) -> dict:
    """Look an item up."""
    return _fire(ctx, "look", item)


@da.tool(idempotent=True, name="notify")
def notify(item: str, ctx: da.ToolContext) -> dict:
    """Notify about an item."""
    return _fire(ctx, "notify", item)


@da.tool(name="charge")
def charge(item: str, ctx: da.ToolContext) -> dict:
    """Charge for an item: at most once."""
    return _fire(ctx, "charge", item)


AGENTS = {
    durability: da.Agent(
        f"power-loss-{durability}",
        Fickle(),
        "Follow the plan.",
        [look, notify, charge],
        durability=durability,
    )
    for durability in ("sync", "async")
}


def _drive(agent: da.Agent, run_id: str, store: Any) -> str:
    try:
        agent.run(run_id, "go", store=store)
        return "finished"
    except da.OutcomeUnknown:
        return "halted"


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_power_loss_after_any_write_never_fires_a_side_effect_twice(durability):
    agent = AGENTS[durability]
    lost_somewhere = 0
    point = 0
    while True:
        point += 1
        FIRED.clear()
        clock = Clock()
        recorder = Recorder(InMemoryStore(clock=clock), fail_after=point)
        run_id = f"pl-{durability}-{point}"
        try:
            _drive(agent, run_id, recorder)
            break  # the run ended before write ``point``: every point was tried
        except PowerLoss:
            pass
        lost = recorder.relaxed_lost()
        if durability == "sync":
            assert lost == [], f"sync relaxed {lost}"
        lost_somewhere += bool(lost)
        survivor = recorder.survivor(clock)
        clock.advance(60)  # the dead driver's lease expires
        outcome = _drive(agent, run_id, survivor)

        effects = Counter(call for call, tool, _ in FIRED if tool == SIDE_EFFECT)
        assert all(n == 1 for n in effects.values()), (point, lost, FIRED)
        notified: dict[str, set[str]] = {}
        for call, tool, item in FIRED:
            if tool == "notify":
                notified.setdefault(call, set()).add(item)
        assert all(len(items) == 1 for items in notified.values()), (
            f"after a power loss at write {point} (lost {lost}) an idempotent call ran again "
            f"with other arguments: {notified}"
        )
        names = {e.name for e in survivor.load(run_id)}
        if outcome == "finished":
            assert "run:complete" in names
            assert all(f"tool:{call}" in names for call, _, _ in FIRED), (point, names)
        else:
            halts = survivor.list_halts(run_id=run_id)
            assert halts and all(h.tool_name == SIDE_EFFECT for h in halts), (point, halts)
            # Only a call in flight at the power loss halts: a side effect's recorded result
            # is never lost (it is durable), so it never turns into an unknown outcome.
            written = {args[1] for name, args, _ in recorder.writes if name == "insert"}
            assert not any(f"tool:{h.op_id}" in written for h in halts), (point, halts)
    assert point > 10, "the run made fewer writes than planned"
    if durability == "async":
        assert lost_somewhere, "async never relaxed a write before a power loss"
