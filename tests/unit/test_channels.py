"""Channels: an ordered per-run inbox. ``da.enqueue`` appends (deduped by key, the first
payload wins), ``ctx.receive`` returns the oldest message nothing acked, pausing the run
``awaiting_input`` while there is none, and ``ctx.ack`` consumes a message once (in-memory
store, runs handed over inline)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.runs import create_run
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


def inbox_agent(fired, name="unit-channels", safe=True, crash_on=None):
    @da.tool(idempotent=safe)
    def read_replies(ticket: str, ctx: da.ToolContext) -> list:
        """Handle the customer's replies on ``ticket`` until one says stop."""
        while True:
            msg = ctx.receive("replies")
            fired.append(("handled", msg.key, msg.payload))
            if crash_on == msg.key and fired.count(("handled", msg.key, msg.payload)) == 1:
                raise Crash()  # handled, not acked: the message is received again
            assert ctx.ack("replies", msg.key)
            if msg.payload == "stop":
                return [k for (_, k, _) in fired]

    script = [
        scripted.calls(scripted.call("read_replies", {"ticket": "t-1"})),
        scripted.text("read"),
    ]
    return da.Agent(name, ScriptedModel(script), "", [read_replies])


def messages(store, run_id="r1"):
    return [r.name for r in Journal(store).records(run_id) if r.name.startswith(names.MESSAGE)]


def test_receive_pauses_and_each_message_is_handled_once_in_order(store, fired):
    a = inbox_agent(fired)
    with pytest.raises(da.ChannelPending) as info:
        a.run("r1", "read", store=store)
    assert info.value.code == "run.awaiting_message"
    assert store.get_run("r1").status == "awaiting_input"
    [p] = da.pending(store=store)
    [w] = p.waits
    assert (w.kind, w.name, w.tool) == ("channel", "replies", "read_replies")
    assert p.to_json()["waits"][0]["kind"] == "channel"

    first = da.enqueue("r1", "replies", "m1", "hello", store=store)
    assert first.recorded and first.woke and (first.name, first.key) == ("replies", "m1")
    # The run handled m1 and waits again, for the next message.
    assert store.get_run("r1").status == "awaiting_input"
    assert fired == [("handled", "m1", "hello")]
    [p] = da.pending(store=store)
    assert [w.kind for w in p.waits] == ["channel"]

    again = da.enqueue("r1", "replies", "m1", "changed", store=store)
    assert (again.recorded, again.woke, again.value) == (False, False, "hello")
    da.enqueue("r1", "replies", "m2", "more", store=store)
    da.enqueue("r1", "replies", "m3", "stop", store=store)
    assert store.get_run("r1").status == "finished"
    assert fired == [
        ("handled", "m1", "hello"),
        ("handled", "m2", "more"),
        ("handled", "m3", "stop"),
    ]
    assert messages(store) == [names.message("replies", k) for k in ("m1", "m2", "m3")]
    assert da.pending(store=store) == []
    # A redelivery after the run finished is harmless: the standing payload comes back.
    late = da.enqueue("r1", "replies", "m2", "other", store=store)
    assert (late.recorded, late.woke, late.value) == (False, False, "more")


def test_messages_enqueued_before_the_run_waits_are_received_without_a_pause(store, fired):
    a = inbox_agent(fired)
    with pytest.raises(da.ChannelPending):
        a.run("r1", "read", store=store)
    with pytest.raises(da.ChannelPending):
        a.run("r1", store=store)  # a resume while still empty pauses again, nothing new
    receiving = [r.name for r in Journal(store).records("r1") if r.name.startswith(names.RECEIVING)]
    assert receiving == [names.receiving("replies", 0)]
    da.cancel("r1", by="ann", store=store)
    b = inbox_agent(fired, name="unit-channels-early")
    create_run(b, "read", "r2", store=store)  # created, not driven yet
    da.enqueue("r2", "replies", "a", "one", store=store)
    da.enqueue("r2", "replies", "b", "stop", store=store)
    assert b.run("r2", store=store).answer == "read"
    assert ("handled", "a", "one") in fired and ("handled", "b", "stop") in fired
    assert not [r for r in Journal(store).records("r2") if r.name.startswith(names.RECEIVING)]


def test_a_message_handled_but_not_acked_is_received_again(store, fired, clock):
    a = inbox_agent(fired, crash_on="m1")
    with pytest.raises(da.ChannelPending):
        a.run("r1", "read", store=store)
    with pytest.raises(Crash):
        da.enqueue("r1", "replies", "m1", "hello", store=store)
    assert Journal(store).get("r1", names.ack("replies", "m1")) is None
    clock.advance(31)  # the dead driver's lease expired
    # The run is not waiting for m2 (its dead driver still had m1 to handle): no wake-up,
    # recovery (here: a resume) hands the run over.
    assert not da.enqueue("r1", "replies", "m2", "stop", store=store).woke
    assert a.run("r1", store=store).answer == "read"
    assert fired.count(("handled", "m1", "hello")) == 2  # handled again: it was never acked
    assert fired.count(("handled", "m2", "stop")) == 1


def test_ack_consumes_once(store, fired):
    seen = []

    @da.tool(read_only=True)
    def consume(who: str, ctx: da.ToolContext) -> bool:
        msg = ctx.receive("jobs")
        took = ctx.ack("jobs", msg.key)
        seen.append((who, msg.key, took))
        with pytest.raises(da.WaitError):
            ctx.ack("jobs", "never-enqueued")
        return took

    script = [
        scripted.calls(scripted.call("consume", {"who": "a"})),
        scripted.calls(scripted.call("consume", {"who": "b"})),
        scripted.text("ok"),
    ]
    a = da.Agent("unit-channels-ack", ScriptedModel(script), "", [consume])
    create_run(a, "go", "r1", store=store)
    da.enqueue("r1", "jobs", "j1", 1, store=store)
    da.enqueue("r1", "jobs", "j2", 2, store=store)
    assert a.run("r1", store=store).answer == "ok"
    assert seen == [("a", "j1", True), ("b", "j2", True)]
    ack = Journal(store).get("r1", names.ack("jobs", "j1"))
    assert ack is not None and ack.get("call_id") == "call_1_1"


def test_receive_in_a_tool_that_is_not_retry_safe_is_refused(store, fired):
    a = inbox_agent(fired, safe=False)
    with pytest.raises(da.WaitNotRetrySafe):
        a.run("r1", "read", store=store)
    assert store.get_run("r1").status == "failed"
    assert not [r for r in Journal(store).records("r1") if r.name.startswith(names.RECEIVING)]


def test_bad_enqueues_are_refused_with_nothing_written(store, fired):
    a = inbox_agent(fired)
    with pytest.raises(da.ChannelPending):
        a.run("r1", "read", store=store)
    before = [r.name for r in Journal(store).records("r1")]
    for channel, key in (("bad channel", "k"), ("replies", "a:b"), ("", "k"), ("replies", 7)):
        with pytest.raises(da.ConfigError) as info:
            da.enqueue("r1", channel, key, "x", store=store)
        assert info.value.code == "config.channel_name"
    with pytest.raises(da.ConfigError):
        da.enqueue("r1", "replies", "k", "\x00", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.enqueue("nope", "replies", "k", "x", store=store)
    assert info.value.code == "run.not_found"
    assert [r.name for r in Journal(store).records("r1")] == before
    da.cancel("r1", by="ann", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.enqueue("r1", "replies", "k", "x", store=store)
    assert info.value.code == "run.cancelled"
    assert messages(store) == []


def test_messages_of_lists_a_runs_inbox_with_who_consumed_what(store, fired):
    from durable_agents.engine.commands.waits import messages_of

    a = inbox_agent(fired)
    with pytest.raises(da.ChannelPending):
        a.run("r1", "read", store=store)
    da.enqueue("r1", "replies", "m1", {"text": "hi"}, by="ann", store=store)
    assert [(m.key, m.payload, m.by, m.acked_by) for m in messages_of("r1", store=store)] == [
        ("m1", {"text": "hi"}, "ann", "call_1_1")
    ]
    assert messages_of("r1", "other", store=store) == []
    assert [(x.action, x.target) for x in store.list_actions(run_id="r1")] == [
        ("enqueue", "replies:m1")
    ]
    with pytest.raises(da.ConfigError) as info:
        messages_of("nope", store=store)
    assert info.value.code == "run.not_found"
