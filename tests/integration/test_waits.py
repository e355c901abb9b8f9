"""Interrupts and signals on the site's store (PostgreSQL), with real users: who may answer is
the approvals' rule, an answer or a signal is journaled once and hands the run to a driver
after commit (inline dispatch in the test settings), and a refused one writes nothing."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine import names
from durable_agents.models import ActionLog, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)


@da.tool(read_only=True)
def pick_warehouse(order: str, ctx: da.ToolContext) -> str:
    """Ask staff which warehouse ships the order."""
    answer = ctx.interrupt(
        "warehouse",
        f"Which warehouse ships {order}?",
        schema={"type": "string", "enum": ["BER", "HAM"]},
    )
    return f"{order} ships from {answer}"


@da.tool(idempotent=True)
def await_payment(invoice: str, ctx: da.ToolContext) -> dict:
    """Wait for the payment provider."""
    return {"paid": ctx.await_signal(f"paid-{invoice}")}


def _agent(name: str, tool: da.Tool, args: dict) -> da.Agent:
    script = [scripted.calls(scripted.call(tool.name, args)), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [tool])


def test_an_answer_by_a_permitted_user_finishes_the_run_and_is_logged():
    agent = _agent("waits-ask", pick_warehouse, {"order": "o-1"})
    agent.start("ship", run_id="ask-1")
    assert Run.objects.get(run_id="ask-1").status == "awaiting_input"
    [p] = [p for p in da.pending() if p.run_id == "ask-1"]
    assert p.waits[0].prompt == "Which warehouse ships o-1?"

    clerk = make_user("clerk", "view_run")
    with pytest.raises(da.ConfigError) as refused:
        da.answer_interrupt("ask-1", "warehouse", "BER", by=clerk)
    assert refused.value.code == "actor.forbidden"
    boss = make_user("boss", "approve_toolcall")
    with pytest.raises(da.InterruptAnswerInvalid):
        da.answer_interrupt("ask-1", "warehouse", "MUC", by=boss)
    store = site_store()
    assert store.get("ask-1", names.interrupt_answer("warehouse")) is None

    outcome = da.answer_interrupt("ask-1", "warehouse", "HAM", by=boss)
    assert outcome.recorded and outcome.woke
    run = Run.objects.get(run_id="ask-1")
    assert run.status == "finished" and run.answer == "done"
    tool = store.get("ask-1", names.tool("call_1_1"))
    assert tool is not None and "o-1 ships from HAM" in tool.data
    assert list(ActionLog.objects.filter(run_id="ask-1").values_list("actor", "action")) == [
        ("boss", "answer")
    ]


def test_a_signal_before_the_wait_and_twice_is_consumed_once():
    agent = _agent("waits-signal", await_payment, {"invoice": "i-9"})
    agent.start("pay", run_id="sig-1")
    assert Run.objects.get(run_id="sig-1").status == "awaiting_input"
    first = da.signal("sig-1", "paid-i-9", {"cents": 500})
    second = da.signal("sig-1", "paid-i-9", {"cents": 1})
    assert first.recorded and first.woke and not second.recorded
    assert Run.objects.get(run_id="sig-1").status == "finished"
    tool = site_store().get("sig-1", names.tool("call_1_1"))
    assert tool is not None and '"cents":500' in tool.data.replace(" ", "")


def test_cancel_works_while_a_run_waits():
    agent = _agent("waits-cancel", await_payment, {"invoice": "i-3"})
    agent.start("pay", run_id="sig-2")
    da.cancel("sig-2", by=make_user("ops", "cancel_run"))
    assert Run.objects.get(run_id="sig-2").status == "cancelled"
    with pytest.raises(da.ConfigError) as late:
        da.signal("sig-2", "paid-i-3", 1)
    assert late.value.code == "run.cancelled"
