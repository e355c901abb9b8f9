"""A run paused on input whose answer, signal, channel message or early wake was journaled
but never handed over — the sender died between its record and its hand-over (the engine's
crash points ``after-answer``, ``after-signal``, ``after-enqueue``, raised here as
``Crash``) — is handed over by the next sweep (``wake_timers``), once; a run that still
waits for something is left alone (in-memory store, runs handed over inline)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import durable_agents as da
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.commands.timers import _QUIET, wake_timers
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash
from tests.support.wiring import wired


@pytest.fixture
def handed(store) -> Iterator[list[str]]:
    """The run ids handed to a driver, each driven inline at once (the site's inline
    dispatch)."""
    sent: list[str] = []

    def dispatch(run_id: str) -> None:
        sent.append(run_id)
        drive_quietly(run_id, store=store)

    with wired(dispatcher=dispatch):
        yield sent


def _agent(fired: list, name: str) -> da.Agent:
    @da.tool(read_only=True)
    def ask(ctx: da.ToolContext) -> str:
        """Ask a person."""
        fired.append("ask")
        return str(ctx.interrupt("where", "Which warehouse?"))

    @da.tool(idempotent=True)
    def pay(ctx: da.ToolContext) -> str:
        """Wait for the payment."""
        fired.append("pay")
        return str(ctx.await_signal("paid"))

    @da.tool(idempotent=True)
    def read(ctx: da.ToolContext) -> str:
        """Read one message."""
        fired.append("read")
        msg = ctx.receive("box")
        ctx.ack("box", msg.key)
        return str(msg.payload)

    @da.tool(idempotent=True)
    def nap(ctx: da.ToolContext) -> str:
        """Sleep an hour."""
        fired.append("nap")
        return ctx.sleep("later", 3600).isoformat()

    tool = {"ask": ask, "pay": pay, "read": read, "nap": nap}[name]
    script = [scripted.calls(scripted.call(name, {})), scripted.text("done")]
    return da.Agent(f"lost-{name}", ScriptedModel(script), "", [tool])


SENDERS = {
    "ask": (
        "after-answer:where",
        lambda s: da.answer_interrupt("r1", "where", "HAM", by="ann", store=s),
    ),
    "pay": ("after-signal:paid", lambda s: da.signal("r1", "paid", {"ok": True}, store=s)),
    "read": ("after-enqueue:box:m1", lambda s: da.enqueue("r1", "box", "m1", "hello", store=s)),
    "nap": ("after-wake:later", lambda s: da.wake_timer("r1", "later", by="ann", store=s)),
}


@pytest.mark.parametrize("name", ["ask", "pay", "read", "nap"])
def test_a_wake_up_lost_with_its_sender_is_handed_over_by_the_next_sweep(
    store, fired, handed, crash_at, name
):
    agent = _agent(fired, name)
    with pytest.raises(da.Pause):
        agent.run("r1", "go", store=store)
    paused = store.get_run("r1").status
    assert wake_timers(store=store) == [] and handed == [], "nothing answered yet"
    point, send = SENDERS[name]
    crash_at(point)
    with pytest.raises(Crash):
        send(store)
    assert store.get_run("r1").status == paused, "recorded, never handed over"

    assert wake_timers(store=store) == ["r1"]
    assert store.get_run("r1").status == "finished"
    assert wake_timers(store=store) == [] and handed == ["r1"], "handed over once"


def test_a_run_that_still_waits_is_not_handed_over(store, fired, handed):
    for name in ("ask", "pay", "read"):
        with pytest.raises(da.Pause):
            _agent(fired, name).run(f"r-{name}", "go", store=store)
    da.signal("r-ask", "unrelated", 1, store=store)  # kept for later: nothing waits for it
    da.enqueue("r-pay", "box", "m1", "hello", store=store)  # a channel nobody reads
    for _ in range(3):
        assert wake_timers(store=store) == []
    assert handed == []
    assert {store.get_run(f"r-{n}").status for n in ("ask", "pay", "read")} == {"awaiting_input"}


def test_a_parent_paused_on_its_child_is_left_to_the_child(store, fired, handed):
    child = _agent(fired, "ask")
    parent = da.Agent(
        "lost-parent",
        ScriptedModel(
            [scripted.calls(scripted.call(child.name, {"input": "go"})), scripted.text("done")]
        ),
        "",
        [child.as_tool()],
    )
    with pytest.raises(da.Pause):
        parent.run("p1", "go", store=store)
    assert store.get_run("p1").status == "awaiting_input"
    assert wake_timers(store=store) == []
    assert handed == []
    # A parent is never remembered as quiet (its child moves without its journal): every
    # sweep reads it again, while the child itself is read once.
    quiet = _QUIET[store]
    assert "p1" not in quiet and any(run_id != "p1" for run_id in quiet)
