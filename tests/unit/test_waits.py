"""Interrupts and signals: a tool waits, the run pauses ``awaiting_input``, an answer or a
signal from outside resolves the wait once and the run goes on (in-memory store, runs
handed over inline)."""

from __future__ import annotations

import pydantic
import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.runs import create_run
from durable_agents.engine.identity import Actor
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


class Warehouse(pydantic.BaseModel):
    code: str = pydantic.Field(pattern="^[A-Z]{3}$")
    express: bool = False


def asking_agent(fired, name="unit-waits", schema=Warehouse, concurrency=1, crash_after=False):
    @da.tool(read_only=True)
    def pick_warehouse(order: str, ctx: da.ToolContext) -> str:
        """Ask staff which warehouse ships ``order``."""
        fired.append(("ask", order))
        answer = ctx.interrupt("warehouse", f"Which warehouse ships {order}?", schema=schema)
        if crash_after and fired.count(("ask", order)) == 2:
            raise Crash()  # the answer is journaled, the tool's result is not
        code = answer.code if isinstance(answer, Warehouse) else answer["code"]
        fired.append(("picked", code))
        return code

    @da.tool(idempotent=True)
    def note(text: str) -> str:
        fired.append(("note", text))
        return "noted"

    script = [
        scripted.calls(
            scripted.call("note", {"text": "hello"}),
            scripted.call("pick_warehouse", {"order": "o-1"}),
        ),
        scripted.text("shipping"),
    ]
    return da.Agent(
        name, ScriptedModel(script), "", [note, pick_warehouse], tool_concurrency=concurrency
    )


def signal_agent(fired, name="unit-signals", timeout=None, safe=True):
    @da.tool(idempotent=safe)
    def wait_payment(invoice: str, ctx: da.ToolContext) -> dict:
        """Wait for the payment provider's callback."""
        fired.append(("wait", invoice))
        got = ctx.await_signal("paid", timeout=timeout)
        if isinstance(got, da.TimedOut):
            return {"timed_out": True}
        return {"paid": got}

    script = [
        scripted.calls(scripted.call("wait_payment", {"invoice": "i-1"})),
        scripted.text("ok"),
    ]
    return da.Agent(name, ScriptedModel(script), "", [wait_payment])


# -- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 3])
def test_interrupt_pauses_then_the_answer_finishes_the_run(store, fired, concurrency):
    a = asking_agent(fired, concurrency=concurrency)
    with pytest.raises(da.InterruptPending) as info:
        a.run("r1", "ship it", store=store)
    assert info.value.details["waits"] == ["warehouse"]
    run = store.get_run("r1")
    assert run.status == "awaiting_input"
    assert ("note", "hello") in fired  # the other call of the turn settled
    [p] = da.pending(store=store)
    [w] = p.waits
    assert (w.kind, w.name, w.tool) == ("interrupt", "warehouse", "pick_warehouse")
    assert w.prompt == "Which warehouse ships o-1?" and w.schema["properties"]["code"]
    assert p.to_json()["waits"][0]["prompt"] == w.prompt

    outcome = da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by="ann", store=store)
    assert outcome.recorded and outcome.woke
    assert store.get_run("r1").status == "finished"
    assert fired.count(("picked", "BER")) == 1 and fired.count(("note", "hello")) == 1
    assert [(x.actor, x.action, x.target) for x in store.list_actions(run_id="r1")] == [
        ("ann", "answer", "warehouse")
    ]
    assert da.pending(store=store) == []


def test_invalid_answer_is_refused_with_nothing_recorded(store, fired):
    a = asking_agent(fired)
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship it", store=store)
    before = [r.name for r in Journal(store).records("r1")]
    for bad in ({"code": "berlin"}, {"express": True}, "BER", {"code": "BER", "x": "\x00"}):
        with pytest.raises(da.InterruptAnswerInvalid) as info:
            da.answer_interrupt("r1", "warehouse", bad, by="ann", store=store)
        assert info.value.http_status == 400
    assert [r.name for r in Journal(store).records("r1")] == before
    assert store.list_actions(run_id="r1") == []
    assert store.get_run("r1").status == "awaiting_input"


def test_first_answer_wins_and_repeating_it_changes_nothing(store, fired):
    a = asking_agent(fired, schema={"type": "object", "properties": {"code": {"type": "string"}}})
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship it", store=store)
    da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by="ann", store=store)
    again = da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by="bob", store=store)
    assert not again.recorded
    with pytest.raises(da.InterruptAlreadyAnswered) as info:
        da.answer_interrupt("r1", "warehouse", {"code": "HAM"}, by="bob", store=store)
    assert info.value.details["standing"] == {"value": {"code": "BER"}, "by": "ann"}
    assert fired.count(("picked", "BER")) == 1 and ("picked", "HAM") not in fired
    assert len(store.list_actions(run_id="r1")) == 1


def test_answers_are_refused_for_unknown_questions_and_people_who_may_not(store, fired):
    a = asking_agent(fired)
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship it", store=store)
    with pytest.raises(da.InterruptNotFound):
        da.answer_interrupt("r1", "colour", "red", by="ann", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.answer_interrupt("nope", "warehouse", {"code": "BER"}, by="ann", store=store)
    assert info.value.code == "run.not_found"
    clerk = Actor(id="7", username="clerk", permissions=frozenset())
    with pytest.raises(da.ConfigError) as info:
        da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by=clerk, store=store)
    assert info.value.code == "actor.forbidden"
    with pytest.raises(da.ConfigError) as info:
        da.answer_interrupt("r1", "bad name!", {"code": "BER"}, by="ann", store=store)
    assert info.value.code == "config.wait_name"
    assert store.get_run("r1").status == "awaiting_input"


def test_a_crash_after_the_answer_before_the_result_asks_nothing_again(store, fired, clock):
    a = asking_agent(fired, crash_after=True)
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship it", store=store)
    with pytest.raises(Crash):
        da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by="ann", store=store)
    assert Journal(store).get("r1", names.interrupt_answer("warehouse")) is not None
    assert Journal(store).get("r1", names.tool("call_1_2")) is None
    clock.advance(31)  # whatever lease the dead driver held has expired
    assert a.run("r1", store=store).answer == "shipping"
    assert fired.count(("picked", "BER")) == 1
    assert len([r for r in Journal(store).records("r1") if r.name.startswith(names.WAIT)]) == 1


def test_cancel_works_while_awaiting_input_and_a_late_answer_is_refused(store, fired):
    a = asking_agent(fired)
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship it", store=store)
    da.cancel("r1", by="ann", store=store)
    assert store.get_run("r1").status == "cancelled"
    with pytest.raises(da.ConfigError) as info:
        da.answer_interrupt("r1", "warehouse", {"code": "BER"}, by="ann", store=store)
    assert info.value.code == "run.cancelled"
    assert Journal(store).get("r1", names.interrupt_answer("warehouse")) is None


def test_a_wait_in_a_tool_that_is_not_retry_safe_is_refused(store, fired):
    a = signal_agent(fired, safe=False)
    with pytest.raises(da.WaitNotRetrySafe) as info:
        a.run("r1", "pay", store=store)
    assert "its own tool marked read_only=True" in str(info.value)
    assert info.value.code == "config.wait_not_retry_safe"
    assert store.get_run("r1").status == "failed"
    assert Journal(store).get("r1", names.wait("paid")) is None


def test_two_calls_may_not_share_a_wait_name(store, fired):
    @da.tool(read_only=True)
    def ask(q: str, ctx: da.ToolContext) -> str:
        return ctx.interrupt("same", q)

    script = [
        scripted.calls(scripted.call("ask", {"q": "a?"}), scripted.call("ask", {"q": "b?"})),
        scripted.text("ok"),
    ]
    a = da.Agent("unit-same-name", ScriptedModel(script), "", [ask])
    with pytest.raises(da.WaitNameTaken):
        a.run("r1", "go", store=store)


def test_a_schema_with_unchecked_keywords_is_refused_when_asked(store, fired):
    a = asking_agent(fired, schema={"type": "object", "patternProperties": {}})
    with pytest.raises(da.ConfigError) as info:
        a.run("r1", "go", store=store)
    assert info.value.code == "config.wait_schema"


# -- signals --------------------------------------------------------------------------------


def test_a_signal_wakes_the_waiting_run_and_duplicates_change_nothing(store, fired):
    a = signal_agent(fired)
    with pytest.raises(da.SignalPending):
        a.run("r1", "pay", store=store)
    assert store.get_run("r1").status == "awaiting_input"
    [p] = da.pending(store=store)
    assert [(w.kind, w.name) for w in p.waits] == [("signal", "paid")]
    first = da.signal("r1", "paid", {"amount": 5}, store=store)
    assert first.recorded and first.woke
    assert store.get_run("r1").status == "finished"
    again = da.signal("r1", "paid", {"amount": 6}, store=store)  # a webhook's retry
    assert (again.recorded, again.value, again.woke) == (False, {"amount": 5}, False)
    with pytest.raises(da.ConfigError) as late:
        da.signal("r1", "other", 1, store=store)
    assert late.value.code == "run.finished"
    tool = Journal(store).get("r1", names.tool("call_1_1"))
    assert tool.get("result") == {"paid": {"amount": 5}}


def test_a_signal_before_the_wait_is_kept_and_consumed_when_it_comes(store, fired):
    a = signal_agent(fired)
    # The signal arrives between the run's start and its wait.
    create_run(a, "pay", "r1", store=store)
    early = da.signal("r1", "paid", "early", store=store)
    assert early.recorded and not early.woke
    assert da.signal("r1", "paid", "twice", store=store).recorded is False
    assert a.run("r1", store=store).answer == "ok"
    assert Journal(store).get("r1", names.tool("call_1_1")).get("result") == {"paid": "early"}
    assert fired.count(("wait", "i-1")) == 1  # it never waited
    assert store.get_run("r1").status == "finished"


def test_a_timeout_is_decided_once_and_a_late_signal_cannot_flip_it(store, fired, clock):
    a = signal_agent(fired, timeout=60)
    with pytest.raises(da.SignalPending) as info:
        a.run("r1", "pay", store=store)
    assert info.value.details["waits"] == ["paid"]
    [p] = da.pending(store=store)
    assert p.waits[0].deadline is not None
    clock.advance(30)
    with pytest.raises(da.SignalPending):
        a.run("r1", store=store)  # before the deadline: still waiting, same deadline
    clock.advance(31)
    assert a.run("r1", store=store).answer == "ok"
    assert Journal(store).get("r1", names.tool("call_1_1")).get("result") == {"timed_out": True}
    with pytest.raises(da.ConfigError) as late:
        da.signal("r1", "paid", "late", store=store)
    assert late.value.code == "run.finished"


def test_a_signal_late_for_a_timed_out_wait_of_an_unfinished_run_is_kept_not_used(
    store, fired, clock
):
    @da.tool(read_only=True)
    def wait_then_ask(ctx: da.ToolContext) -> str:
        got = ctx.await_signal("paid", timeout=10)
        ctx.interrupt("confirm", "confirm?")
        return "timeout" if isinstance(got, da.TimedOut) else str(got)

    script = [scripted.calls(scripted.call("wait_then_ask", {})), scripted.text("ok")]
    a = da.Agent("unit-late", ScriptedModel(script), "", [wait_then_ask])
    with pytest.raises(da.SignalPending):
        a.run("r1", "go", store=store)
    clock.advance(11)
    with pytest.raises(da.InterruptPending):
        a.run("r1", store=store)
    late = da.signal("r1", "paid", "late", store=store)
    assert late.recorded and not late.woke
    da.answer_interrupt("r1", "confirm", "yes", by="ann", store=store)
    assert Journal(store).get("r1", names.tool("call_1_1")).get("result") == "timeout"


def test_cancel_works_while_awaiting_a_signal(store, fired):
    a = signal_agent(fired)
    with pytest.raises(da.SignalPending):
        a.run("r1", "pay", store=store)
    da.cancel("r1", by="ann", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.signal("r1", "paid", 1, store=store)
    assert info.value.code == "run.cancelled"


def test_signal_with_by_is_logged_and_needs_permission(store, fired):
    a = signal_agent(fired)
    with pytest.raises(da.SignalPending):
        a.run("r1", "pay", store=store)
    clerk = Actor(id="7", username="clerk", permissions=frozenset())
    with pytest.raises(da.ConfigError) as info:
        da.signal("r1", "paid", 1, by=clerk, store=store)
    assert info.value.code == "actor.forbidden"
    assert Journal(store).get("r1", names.signal("paid")) is None
    da.signal("r1", "paid", 1, by="ann", store=store)
    assert [(x.actor, x.action) for x in store.list_actions(run_id="r1")] == [("ann", "signal")]


def test_calling_a_waiting_tool_outside_a_run_is_refused():
    ctx = da.ToolContext(run_id="r", call_id="c", tool_name="t", idempotency_key="k")
    with pytest.raises(da.ConfigError) as info:
        ctx.interrupt("x", "?")
    assert info.value.code == "config.wait_outside_run"
