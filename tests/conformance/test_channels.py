"""Channels on every store (InMemoryStore, PostgreSQL, SQLite): enqueues racing each other
and the run's receive — a key is recorded once whoever wins, and each message is handled
once, in the channel's commit order."""

from __future__ import annotations

import threading
import uuid

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.procs import in_threads

HANDLED: list[str] = []
LOCK = threading.Lock()


@da.tool(idempotent=True)
def drain(box: str, ctx: da.ToolContext) -> int:
    """Handle every message of ``box`` until one says stop."""
    while True:
        msg = ctx.receive("box")
        with LOCK:
            HANDLED.append(msg.key)
        ctx.ack("box", msg.key)
        if msg.payload == "stop":
            return 0


AGENT = da.Agent(
    "conformance-channels",
    ScriptedModel([scripted.calls(scripted.call("drain", {"box": "b"})), scripted.text("done")]),
    "",
    [drain],
)


@pytest.fixture
def wired(store):
    with wiring.wired(dispatcher=lambda run_id: drive_quietly(run_id, store=store)):
        HANDLED.clear()
        yield store


def test_racing_enqueues_record_a_key_once_and_each_message_is_handled_once_in_order(wired):
    store = wired
    rid = f"ch-{uuid.uuid4().hex[:10]}"
    with pytest.raises(da.ChannelPending):
        AGENT.run(rid, "drain", store=store)

    def send(i: int):
        mine = da.enqueue(rid, "box", f"k{i}", i, store=store)
        dup = da.enqueue(rid, "box", "dup", i, store=store)
        return mine.recorded, dup.recorded, dup.value

    outcomes = in_threads(6, send)
    assert all(mine for mine, _, _ in outcomes)
    assert sum(1 for _, dup, _ in outcomes if dup) == 1, "one enqueue of a key is recorded"
    assert len({value for _, _, value in outcomes}) == 1, "every sender sees the first payload"
    # A racing wake-up may have found the run busy: whatever is left, a driver finishes.
    if store.get_run(rid).status in ("queued", "running"):
        drive_quietly(rid, store=store)
    assert store.get_run(rid).status == "awaiting_input"
    assert da.enqueue(rid, "box", "last", "stop", store=store).woke
    assert store.get_run(rid).status == "finished"
    order = [
        names.message_key("box", r.name)
        for r in Journal(store).records(rid)
        if r.name.startswith(names.MESSAGE)
    ]
    assert order == HANDLED, "handled once each, in the channel's commit order"
    assert len(order) == 8
