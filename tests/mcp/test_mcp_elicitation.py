"""Elicitation: a real MCP server (``tests/support/mcp_server.py``, the SDK's ``MCPServer``)
asks for input during a call; staff answer it through ``answer_interrupt`` from another
thread while the driving thread waits, the engine on the in-memory store. The server counts
its effects in a file. The Django/Celery/admin path is ``test_mcp_elicitation_celery.py``."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.waits import waits_of
from durable_agents.engine.errors import ConfigError, WaitError
from durable_agents.engine.journal import Journal
from durable_agents.mcp import elicitation
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.mcp_servers import effects, server_env, stdio

pytestmark = pytest.mark.timeout(90)

QUESTION = "mcp.call_1_1.1"


def agent(name: str, tools: list[Any], tool: str, **args: Any) -> da.Agent:
    model = ScriptedModel([scripted.calls(scripted.call(tool, args)), scripted.text("done")])
    return da.Agent(name, model, "Use the tools.", tools)


def answer_when_asked(store, run_id: str, value: Any, *, name: str = QUESTION, tries=None):
    """A member of staff, in another thread: answers ``name`` once the run asks it (first
    ``tries``, values refused, then ``value``). Returns the thread and what happened."""
    seen: dict[str, Any] = {"refused": []}

    def staff() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Journal(store).get(run_id, names.wait(name)) is not None:
                seen["open"] = [w.name for w in waits_of(run_id, store=store)]
                for bad in tries or ():
                    try:
                        da.answer_interrupt(run_id, name, bad, by="ann", store=store)
                    except WaitError as exc:
                        seen["refused"].append(exc.code)
                seen["outcome"] = da.answer_interrupt(run_id, name, value, by="ann", store=store)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=staff, daemon=True)
    thread.start()
    return thread, seen


def result_of(store, run_id: str) -> dict[str, Any]:
    rec = Journal(store).get(run_id, "tool:call_1_1")
    assert rec is not None
    return json.loads(rec.get("result")["content"][0]["text"])


def test_without_opt_in_the_question_is_declined_at_once_and_the_call_goes_on(
    store, crm, effects_file
):
    a = agent("el-off", [crm], "crm__confirmed_refund", order_id="off1", cents=5)
    assert not a.tools["crm__confirmed_refund"].elicitation
    assert a.run("el-off", "refund", store=store).answer == "done"
    assert result_of(store, "el-off") == {"refunded": 0, "order": "off1", "action": "decline"}
    asked = [e for e in effects(effects_file) if e.get("order_id") == "off1"]
    # Two rounds on the wire (SEP-2322): the question, then the call again with the answer.
    assert [(e["tool"], e.get("action")) for e in asked] == [
        ("confirmed_refund_round", None),
        ("confirmed_refund_round", None),
        ("confirmed_refund_asked", "decline"),
    ]
    assert not [r for r in Journal(store).records("el-off") if r.name.startswith("wait:")]


def test_an_answer_given_while_the_call_waits_reaches_the_server_and_it_refunds_once(
    store, effects_file
):
    server = stdio(
        effects_file,
        name="crm-ask",
        tools={"confirmed_refund": da.mcp.ToolOptions(elicitation=True)},
    )
    try:
        a = agent("el-on", [server], "crm-ask__confirmed_refund", order_id="on1", cents=7)
        assert a.tools["crm-ask__confirmed_refund"].origin["elicitation"] is True
        assert not a.tools["crm-ask__refund"].elicitation  # opted in per tool
        thread, seen = answer_when_asked(
            store,
            "el-on",
            {"approve": True, "note": "ok by ann"},
            tries=[{"approve": "maybe"}, {"note": "no approve"}],
        )
        assert a.run("el-on", "refund", store=store).answer == "done"
        thread.join(10)
    finally:
        server.close()
    # Bad answers were refused with nothing written; the good one reached the server.
    assert seen["refused"] == ["interrupt.invalid_answer", "interrupt.invalid_answer"]
    assert seen["open"] == [QUESTION] and seen["outcome"].recorded
    assert not seen["outcome"].woke  # the asking thread reads the journal itself
    assert result_of(store, "el-on") == {"refunded": 7, "order": "on1", "note": "ok by ann"}
    fired = [e for e in effects(effects_file, "confirmed_refund") if e["order_id"] == "on1"]
    assert [(e["cents"], e["note"]) for e in fired] == [(7, "ok by ann")]
    journal = Journal(store)
    asked = journal.get("el-on", names.wait(QUESTION))
    assert asked.get("prompt") == "Refund 7 cents on order on1?"
    assert asked.get("live") and asked.get("call_id") == "call_1_1"
    assert asked.get("schema")["required"] == ["approve"]
    assert journal.get("el-on", names.interrupt_answer(QUESTION)).get("by") == "ann"
    assert journal.get("el-on", names.waited(QUESTION)).get("outcome") == "accept"
    assert waits_of("el-on", store=store) == []
    # Answering again with another value: the first answer stands.
    with pytest.raises(WaitError) as info:
        da.answer_interrupt("el-on", QUESTION, {"approve": False}, by="ann", store=store)
    assert info.value.code == "interrupt.already_answered"


def test_no_answer_within_the_call_timeout_cancels_and_a_late_answer_is_refused(
    store, effects_file
):
    server = stdio(effects_file, name="crm-late", elicitation=True, call_timeout=3)
    try:
        a = agent("el-late", [server], "crm-late__confirmed_refund", order_id="late1", cents=9)
        started = time.monotonic()
        assert a.run("el-late", "refund", store=store).answer == "done"
        waited = time.monotonic() - started
    finally:
        server.close()
    assert 2.0 <= waited < 10, waited  # the answer window: 3 s less a fifth
    assert result_of(store, "el-late") == {"refunded": 0, "order": "late1", "action": "cancel"}
    assert not [e for e in effects(effects_file, "confirmed_refund") if e["order_id"] == "late1"]
    journal = Journal(store)
    gave_up = journal.get("el-late", names.interrupt_answer(QUESTION))
    assert (gave_up.get("outcome"), gave_up.get("reason"), gave_up.get("by")) == (
        "cancel",
        "timeout",
        None,
    )
    assert journal.get("el-late", names.waited(QUESTION)).get("outcome") == "cancel"
    before = len(journal.records("el-late"))
    with pytest.raises(WaitError) as info:
        da.answer_interrupt("el-late", QUESTION, {"approve": True}, by="ann", store=store)
    assert info.value.code == "interrupt.expired" and info.value.http_status == 409
    assert len(journal.records("el-late")) == before  # nothing written


class LegacyServer(da.mcp.Server):
    """A server spoken to on protocol 2025-11-25: its questions come as elicitation/create
    requests while the call is open (the SDK's ``ctx.elicit``)."""

    def client(self) -> Any:
        client = super().client()
        client.mode = "legacy"
        return client


def test_an_elicitation_request_mid_call_of_an_older_protocol_is_answered_the_same_way(
    store, effects_file
):
    import sys

    from tests.support.mcp_servers import ROOT

    server = LegacyServer(
        "crm-old",
        command=[sys.executable, "-m", "tests.support.mcp_server", "stdio"],
        env=server_env(effects_file),
        cwd=str(ROOT),
        connect_timeout=30,
        elicitation=True,
    )
    try:
        a = agent("el-old", [server], "crm-old__classic_refund", order_id="old1", cents=3)
        thread, seen = answer_when_asked(store, "el-old", {"approve": True, "note": "legacy"})
        assert a.run("el-old", "refund", store=store).answer == "done"
        thread.join(10)
    finally:
        server.close()
    assert seen["outcome"].recorded
    assert result_of(store, "el-old") == {"refunded": 3, "order": "old1", "note": "legacy"}
    fired = [e for e in effects(effects_file, "classic_refund") if e["order_id"] == "old1"]
    assert len(fired) == 1


def test_elicitation_options_are_checked():
    with pytest.raises(ConfigError) as info:
        da.mcp.Server("x", command=["x"], elicitation="yes")
    assert info.value.code == "config.mcp_elicitation"
    with pytest.raises(ConfigError) as info:
        da.mcp.Server("x", command=["x"], tools={"t": da.mcp.ToolOptions(elicitation=1)})
    assert info.value.code == "config.mcp_elicitation"


def test_the_answer_schema_is_the_requested_schema_checked_as_an_interrupts():
    requested = {
        "type": "object",
        "properties": {
            "size": {"type": "string", "enum": ["s", "m"], "enumNames": ["Small", "Medium"]},
            "n": {"type": "integer", "minimum": 1},
        },
        "required": ["size"],
    }
    schema = elicitation.form_schema(requested)
    assert "enumNames" not in schema["properties"]["size"]
    assert requested["properties"]["size"]["enumNames"]  # the server's own is not changed
    with pytest.raises(WaitError):
        elicitation.form_schema({"type": "object", "propertyNames": {"maxLength": 3}})
    assert elicitation.question_prefix("call_1_1") == "mcp.call_1_1."
    odd = elicitation.question_prefix("toolu_01.A/B")
    assert odd.startswith("mcp.") and len(odd) == len("mcp.") + 32 + 1
    assert elicitation.answer_window(60) == 50 and elicitation.answer_window(5) == 4


def test_an_answer_after_the_questions_deadline_by_the_stores_clock_is_refused(store, effects_file):
    server = stdio(effects_file, name="crm-clock", elicitation=True, call_timeout=3)
    refused: list[str] = []

    def staff() -> None:
        deadline = time.monotonic() + 60
        while Journal(store).get("el-clock", names.wait(QUESTION)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        store._clock.advance(5)  # the database's clock is past the question's deadline
        try:
            da.answer_interrupt("el-clock", QUESTION, {"approve": True}, by="ann", store=store)
        except WaitError as exc:
            refused.append(exc.code)

    thread = threading.Thread(target=staff, daemon=True)
    thread.start()
    try:
        a = agent("el-clock", [server], "crm-clock__confirmed_refund", order_id="clk1", cents=1)
        assert a.run("el-clock", "refund", store=store).answer == "done"
        thread.join(10)
    finally:
        server.close()
    assert refused == ["interrupt.expired"]
    assert result_of(store, "el-clock")["action"] == "cancel"
    gave_up = Journal(store).get("el-clock", names.interrupt_answer(QUESTION))
    assert gave_up.get("outcome") == "cancel" and gave_up.get("by") is None
    assert not [e for e in effects(effects_file, "confirmed_refund") if e["order_id"] == "clk1"]


def test_a_live_question_whose_call_has_its_result_is_no_open_wait():
    from durable_agents.engine.records import Record, encode
    from durable_agents.engine.waits import open_waits

    asked = {"kind": "interrupt", "name": QUESTION, "call_id": "call_1_1", "tool": "t"}
    records = [
        Record("r", names.wait(QUESTION), 1, encode({**asked, "prompt": "?", "live": True})),
        Record("r", names.wait("plain"), 2, encode({**asked, "name": "plain", "prompt": "?"})),
    ]
    assert [w.name for w in open_waits(records)] == [QUESTION, "plain"]
    settled = [*records, Record("r", names.tool("call_1_1"), 3, encode({"result": 1}))]
    # The server's question went with its call; a tool's own interrupt stays until answered.
    assert [w.name for w in open_waits(settled)] == ["plain"]


def test_over_streamable_http_too(store, effects_file, http_server):
    server = http_server.server(
        "tickets-ask",
        elicitation=True,
        tools={"refund": da.mcp.ToolOptions(elicitation=False)},  # a tool's own wins
    )
    try:
        a = agent("el-http", [server], "tickets-ask__confirmed_refund", order_id="h1", cents=4)
        assert a.tools["tickets-ask__confirmed_refund"].elicitation is True
        assert a.tools["tickets-ask__refund"].elicitation is False
        thread, seen = answer_when_asked(store, "el-http", {"approve": True})
        assert a.run("el-http", "refund", store=store).answer == "done"
        thread.join(10)
    finally:
        server.close()
    assert seen["outcome"].recorded
    assert result_of(store, "el-http") == {"refunded": 4, "order": "h1", "note": ""}
    assert len([e for e in effects(effects_file, "confirmed_refund") if e["order_id"] == "h1"]) == 1
