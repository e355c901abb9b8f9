"""Sessions on the in-memory store: turns, the transcript, send_once dedupe, open turns."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


def chat_agent(name="unit-chat", seen=None, tools=(), script=None):
    script = script or [
        scripted.text("hello!"),
        scripted.text("a table for 2"),
        scripted.text("done"),
    ]
    model = ScriptedModel(
        script, on_request=(lambda r: seen.append(r.messages)) if seen is not None else None
    )
    return da.Agent(name, model, "You book tables.", list(tools))


def test_turns_build_a_transcript_each_turn_sees(store):
    seen = []
    session = chat_agent(seen=seen).session("chat-1", store=store)
    assert session.send("hi").answer == "hello!"
    assert session.send("book for 2").answer == "a table for 2"
    assert [m.content for m in seen[1]] == ["hi", "hello!", "book for 2"]
    assert [(m.role, m.content) for m in session.history()] == [
        ("user", "hi"),
        ("assistant", "hello!"),
        ("user", "book for 2"),
        ("assistant", "a table for 2"),
    ]
    assert session.turns == 2
    # A new handle (a restarted process) rebuilds the same transcript from the journal.
    again = chat_agent("unit-chat").session("chat-1", store=store)
    assert [m.content for m in again.history()] == ["hi", "hello!", "book for 2", "a table for 2"]


def test_two_sessions_never_share_a_run(store):
    agent = chat_agent("unit-chat-2")
    agent.session("a", store=store).send("hi")
    agent.session("b", store=store).send("hello there")
    assert store.get_run("a>turn/1").input == "hi"
    assert store.get_run("b>turn/1").input == "hello there"
    assert [m.content for m in agent.session("b", store=store).history()] == [
        "hello there",
        "hello!",
    ]


def test_send_once_runs_a_key_once(store):
    fired = []

    @da.tool
    def book(size: int) -> str:
        fired.append(size)
        return "booked"

    script = [scripted.calls(scripted.call("book", {"size": 2})), scripted.text("booked it")]
    session = chat_agent("unit-once", tools=[book], script=script).session("c", store=store)
    first = session.send_once("delivery-1", "book for 2")
    assert first.status == "queued"  # handed over: inline here, so it already ran
    again = session.send_once("delivery-1", "book for 2")
    assert (again.status, again.answer) == ("answered", "booked it")
    assert fired == [2] and session.turns == 1
    with pytest.raises(da.ConfigError, match="another message"):
        session.send_once("delivery-1", "book for 3")
    assert fired == [2]


def test_send_once_resumes_an_interrupted_turn(store):
    fired = []

    @da.tool(read_only=True)
    def lookup(day: str) -> str:
        fired.append(day)
        if len(fired) == 1:
            raise Crash()
        return "free"

    script = [scripted.calls(scripted.call("lookup", {"day": "mon"})), scripted.text("free")]
    session = chat_agent("unit-once-crash", tools=[lookup], script=script).session("d", store=store)
    with pytest.raises(Crash):
        session.send_once("k/1?x", "is monday free?")
    out = session.send_once("k/1?x", "is monday free?", wait=True)
    assert (out.status, out.answer) == ("answered", "free")
    assert out.run_id == "d>event/k%2F1%3Fx" and fired == ["mon", "mon"]


def test_open_turn_refuses_another_message(store):
    @da.tool(requires_approval=True)
    def book(size: int) -> str:
        return "booked"

    script = [scripted.calls(scripted.call("book", {"size": 2})), scripted.text("booked")]
    session = chat_agent("unit-open", tools=[book], script=script).session("e", store=store)
    with pytest.raises(da.ApprovalPending):
        session.send("book for 2")
    with pytest.raises(da.ApprovalPending, match="awaits approval of 'call_1_1'"):
        session.send("actually 3")
    Journal(store).write("e>turn/1", "approval:call_1_1", {"kind": "approval", "approved": True})
    assert session.send("book for 2").answer == "booked"
    assert session.turns == 1


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "a>b", None])
def test_bad_session_ids(store, bad):
    with pytest.raises(da.ConfigError, match="session id"):
        chat_agent("unit-bad").session(bad, store=store)


# -- issue 10 -----------------------------------------------------------------------------


def test_a_turn_that_failed_for_good_does_not_block_the_session(store):
    @da.tool(read_only=True)
    def look(x: int) -> int:
        return x

    looping = [scripted.calls(scripted.call("look", {"x": 1}))] * 3 + [scripted.text("done")]
    agent = da.Agent("unit-stuck", ScriptedModel(looping), "", [look], max_turns=2)
    session = agent.session("stuck", store=store)
    with pytest.raises(da.BudgetError):
        session.send("first")
    agent.max_turns = 20
    assert session.send("second").answer == "done"
    assert store.get_run("stuck>turn/2").status == "finished"
    transcript = [(m.role, m.content) for m in session.history()]
    assert transcript[0] == ("user", "first")
    assert transcript[1][0] == "assistant" and "did not finish" in transcript[1][1]
    assert "budget.max_turns" in transcript[1][1]
    assert transcript[2:] == [("user", "second"), ("assistant", "done")]


def test_a_cancelled_turn_does_not_block_the_session(store):
    @da.tool(requires_approval=True)
    def book(size: int) -> str:
        return "booked"

    script = [scripted.calls(scripted.call("book", {"size": 2})), scripted.text("hi")]
    session = chat_agent("unit-cancelled-turn", tools=[book], script=script).session(
        "cx", store=store
    )
    with pytest.raises(da.ApprovalPending):
        session.send("book for 2")
    da.cancel("cx>turn/1", by="staff", store=store)
    assert session.send("book for 3").answer == "hi"  # a new turn, seeded with the closed one
    assert store.get_run("cx>turn/2").status == "finished"
    assert "cancelled" in session.history()[1].content


def test_concurrent_deliveries_with_wait_all_get_the_first_ones_answer(store):
    import threading

    from tests.support.procs import in_threads

    entered = threading.Event()
    release = threading.Event()

    @da.tool(read_only=True)
    def slow(x: int) -> int:
        entered.set()
        release.wait(10)
        return x

    script = [scripted.calls(scripted.call("slow", {"x": 1})), scripted.text("slow answer")]
    session = chat_agent("unit-wait", tools=[slow], script=script).session("w", store=store)

    def deliver(i):
        if i:
            entered.wait(10)  # the first delivery is driving the turn
            threading.Timer(0.3, release.set).start()
        return session.send_once("d-1", "go slow", wait=True, timeout=10)

    results = in_threads(4, deliver)
    assert {(r.status, r.answer) for r in results} == {("answered", "slow answer")}
    waited = session.send_once("d-2", "go slow", wait=True, timeout=0.01)
    assert waited.status in ("answered", "running")


def test_a_redelivery_never_hands_over_a_turn_halted_while_it_read(store):
    """A delivery redelivered while its turn is being driven: between the redelivery's read
    of the turn's row and its hand-over, the driver halts the turn on an unknown outcome.
    The redelivery says "paused" and hands nothing over: a halted turn is a person's (issue
    43, found by the simulator: ``halted_never_driven``)."""
    from tests.support.wiring import wired

    sent: list[str] = []
    session = chat_agent("unit-once-halted").session("c", store=store)
    with wired(dispatcher=sent.append):
        first = session.send_once("delivery-1", "book for 2")
        assert first.status == "queued" and sent == [first.run_id]
        get = store.get

        def halted_meanwhile(run_id, name):
            if name == "run:start" and run_id == first.run_id:
                store.update_run(run_id, {"status": "halted"})  # the driver's pause
            return get(run_id, name)

        store.get = halted_meanwhile
        again = session.send_once("delivery-1", "book for 2")
    assert again.status == "paused"
    assert sent == [first.run_id], "the halted turn was not handed over again"
