"""The waits API on PostgreSQL with inline dispatch: list what a run waits for, answer a
question (schema-checked, first value wins), send a signal, enqueue a channel message (first
payload per key wins), wake a timer early; who may call each, bad run ids, unknown names,
and that a refused write records nothing."""

from __future__ import annotations

import pytest
from django.test import Client

import durable_agents as da
from durable_agents.engine import names
from durable_agents.models import ActionLog, JournalEntry, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.api import Caller, as_session, error, staff_with, with_key
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string", "enum": ["BER", "HAM"]}},
    "required": ["code"],
    "additionalProperties": False,
}


@da.tool(read_only=True)
def api_pick_warehouse(order: str, ctx: da.ToolContext) -> str:
    """Ask staff which warehouse ships the order."""
    choice = ctx.interrupt("warehouse", f"Which warehouse ships {order}?", schema=SCHEMA)
    return f"{order} ships from {choice['code']}"


@da.tool(idempotent=True)
def api_await_payment(invoice: str, ctx: da.ToolContext) -> dict:
    """Wait for the payment provider."""
    return {"paid": ctx.await_signal(f"paid-{invoice}")}


@da.tool(idempotent=True)
def api_cool_off(order: str, ctx: da.ToolContext) -> str:
    """Wait a day before shipping."""
    ctx.sleep("cool-off", 24 * 3600)
    return f"{order} cooled off"


@da.tool(idempotent=True)
def api_read_replies(ticket: str, ctx: da.ToolContext) -> str:
    """Wait for the customer's replies until one closes the ticket."""
    while True:
        msg = ctx.receive("replies")
        ctx.ack("replies", msg.key)
        if msg.payload == "close":
            return f"{ticket} closed by {msg.key}"


def _agent(name: str, tool: da.Tool, args: dict) -> da.Agent:
    script = [scripted.calls(scripted.call(tool.name, args)), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [tool])


def _journal(run_id: str) -> list[str]:
    return list(JournalEntry.objects.filter(run_id=run_id).values_list("name", flat=True))


def _log(run_id: str) -> list[tuple[str, str, str]]:
    return list(
        ActionLog.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("actor", "action", "target")
    )


def test_list_and_answer_a_question_first_value_wins():
    _agent("api-ask", api_pick_warehouse, {"order": "o-1"}).start("ship", run_id="ask-1")
    viewer = staff_with(name="viewer")
    listed = viewer.get("/runs/ask-1/waits")
    assert listed.status_code == 200, listed.content
    body = listed.json()
    assert body["status"] == "awaiting_input" and body["signals"] == []
    [wait] = body["waits"]
    assert wait["kind"] == "interrupt" and wait["name"] == "warehouse"
    assert wait["prompt"] == "Which warehouse ships o-1?" and wait["answer_schema"] == SCHEMA

    # Wrong permission: view_run is not enough to answer; nothing written.
    before = _journal("ask-1")
    error(
        viewer.post("/runs/ask-1/interrupts/warehouse/answer", {"value": {"code": "HAM"}}),
        403,
        "auth.forbidden",
    )
    boss = staff_with("durable_agents.approve_toolcall", name="boss")
    # A value the schema refuses: 400 with the problems, nothing recorded or logged.
    bad = error(
        boss.post("/runs/ask-1/interrupts/warehouse/answer", {"value": {"code": "MUC"}}),
        400,
        "interrupt.invalid_answer",
    )
    assert bad["details"]["problems"]
    error(boss.post("/runs/ask-1/interrupts/warehouse/answer", {}), 422, "request.invalid")
    error(boss.post("/runs/ask-1/interrupts/nope/answer", {"value": 1}), 404, "interrupt.not_found")
    error(
        boss.post("/runs/ask-1/interrupts/bad name!/answer", {"value": 1}), 400, "config.wait_name"
    )
    error(
        boss.post("/runs/no-such/interrupts/warehouse/answer", {"value": 1}), 404, "run.not_found"
    )
    error(
        boss.post("/runs/bad%20id/interrupts/warehouse/answer", {"value": 1}), 400, "config.run_id"
    )
    assert _journal("ask-1") == before and _log("ask-1") == []

    ok = boss.post("/runs/ask-1/interrupts/warehouse/answer", {"value": {"code": "HAM"}})
    assert ok.status_code == 200, ok.content
    assert ok.json() == {
        "run_id": "ask-1",
        "name": "warehouse",
        "value": {"code": "HAM"},
        "recorded": True,
        "woke": True,
    }
    run = Run.objects.get(run_id="ask-1")
    assert run.status == "finished" and run.answer == "done"
    assert _log("ask-1") == [("boss", "answer", "warehouse")]
    assert ActionLog.objects.get(run_id="ask-1").channel.startswith("api-key:")

    same = boss.post("/runs/ask-1/interrupts/warehouse/answer", {"value": {"code": "HAM"}})
    assert same.status_code == 200 and same.json()["recorded"] is False
    other = error(
        boss.post("/runs/ask-1/interrupts/warehouse/answer", {"value": {"code": "BER"}}),
        409,
        "interrupt.already_answered",
    )
    assert other["details"]["standing"]["value"] == {"code": "HAM"}
    assert _log("ask-1") == [("boss", "answer", "warehouse")]
    assert viewer.get("/runs/ask-1/waits").json()["waits"] == []


def test_a_signal_early_is_kept_listed_and_consumed_once():
    _agent("api-signal", api_await_payment, {"invoice": "i-1"}).start("pay", run_id="sig-1")
    ops = staff_with("durable_agents.cancel_run", name="ops")
    [wait] = ops.get("/runs/sig-1/waits").json()["waits"]
    assert wait["kind"] == "signal" and wait["name"] == "paid-i-1"

    # A signal nothing awaits (yet) is kept and listed as such.
    early = ops.post("/runs/sig-1/signals/refund-i-1", {"payload": {"cents": 9}})
    assert early.status_code == 200 and early.json()["woke"] is False
    [kept] = ops.get("/runs/sig-1/waits").json()["signals"]
    assert kept["name"] == "refund-i-1" and kept["payload"] == {"cents": 9}
    assert kept["by"] == "ops"

    viewer = staff_with(name="viewer")
    error(viewer.post("/runs/sig-1/signals/paid-i-1", {"payload": 1}), 403, "auth.forbidden")
    error(ops.post("/runs/nope/signals/paid-i-1", {"payload": 1}), 404, "run.not_found")
    error(ops.post("/runs/sig-1/signals/x%00y", {"payload": 1}), 400, "config.wait_name")
    assert not JournalEntry.objects.filter(run_id="sig-1", name="signal:paid-i-1").exists()

    first = ops.post("/runs/sig-1/signals/paid-i-1", {"payload": {"cents": 500}})
    assert first.status_code == 200, first.content
    assert first.json()["recorded"] is True and first.json()["woke"] is True
    assert Run.objects.get(run_id="sig-1").status == "finished"
    again = ops.post("/runs/sig-1/signals/paid-i-1", {"payload": {"cents": 1}})
    assert again.json()["recorded"] is False and again.json()["value"] == {"cents": 500}
    assert _log("sig-1") == [
        ("ops", "signal", "refund-i-1"),
        ("ops", "signal", "paid-i-1"),
    ]


def test_wake_a_sleeping_run_now_is_a_journaled_staff_decision():
    _agent("api-timer", api_cool_off, {"order": "o-7"}).start("ship", run_id="tim-1")
    assert Run.objects.get(run_id="tim-1").status == "sleeping"
    viewer = staff_with(name="viewer")
    [wait] = viewer.get("/runs/tim-1/waits").json()["waits"]
    assert wait["kind"] == "timer" and wait["deadline"]

    error(viewer.post("/runs/tim-1/timers/cool-off/wake"), 403, "auth.forbidden")
    ops = staff_with("durable_agents.cancel_run", name="ops")
    error(ops.post("/runs/tim-1/timers/nope/wake"), 404, "timer.not_found")
    error(ops.post("/runs/nope/timers/cool-off/wake"), 404, "run.not_found")
    assert Run.objects.get(run_id="tim-1").status == "sleeping" and _log("tim-1") == []

    woke = ops.post("/runs/tim-1/timers/cool-off/wake")
    assert woke.status_code == 200, woke.content
    body = woke.json()
    assert body["recorded"] and body["woke"] and body["early"] and body["by"] == "ops"
    assert body["woke_at"] < body["wake_at"]  # the wake time stays what was journaled
    run = Run.objects.get(run_id="tim-1")
    assert run.status == "finished" and run.answer == "done"
    record = JournalEntry.objects.get(run_id="tim-1", name=names.waited("cool-off"))
    assert '"early":true' in record.data.replace(" ", "") and '"by":"ops"' in record.data
    assert _log("tim-1") == [("ops", "wake", "cool-off")]

    again = ops.post("/runs/tim-1/timers/cool-off/wake").json()
    assert again["recorded"] is False and again["early"] is True
    assert _log("tim-1") == [("ops", "wake", "cool-off")]


def test_waits_of_a_cancelled_run_are_refused_and_its_timer_stays_asleep():
    _agent("api-timer-cancel", api_cool_off, {"order": "o-8"}).start("ship", run_id="tim-2")
    da.cancel("tim-2", by=make_user("boss", "cancel_run"))
    ops = staff_with("durable_agents.cancel_run", name="ops")
    error(ops.post("/runs/tim-2/timers/cool-off/wake"), 409, "run.cancelled")
    error(ops.post("/runs/tim-2/signals/late", {"payload": 1}), 409, "run.cancelled")
    assert not JournalEntry.objects.filter(run_id="tim-2", name__startswith="waited:").exists()


def test_enqueue_a_channel_message_first_payload_wins_and_is_listed():
    _agent("api-inbox", api_read_replies, {"ticket": "t-1"}).start("read", run_id="box-1")
    viewer = staff_with(name="viewer")
    body = viewer.get("/runs/box-1/waits").json()
    assert body["status"] == "awaiting_input" and body["messages"] == []
    [wait] = body["waits"]
    assert (wait["kind"], wait["name"], wait["tool"]) == ("channel", "replies", "api_read_replies")

    # Wrong permission, unknown run, bad channel or key, a missing key: nothing written.
    before = _journal("box-1")
    error(
        viewer.post("/runs/box-1/channels/replies/messages", {"key": "m1", "payload": "hi"}),
        403,
        "auth.forbidden",
    )
    ops = staff_with("durable_agents.cancel_run", name="ops")
    error(
        ops.post("/runs/nope/channels/replies/messages", {"key": "m1", "payload": 1}),
        404,
        "run.not_found",
    )
    error(
        ops.post("/runs/box-1/channels/bad%20name/messages", {"key": "m1"}),
        400,
        "config.channel_name",
    )
    error(
        ops.post("/runs/box-1/channels/replies/messages", {"key": "m 1", "payload": 1}),
        400,
        "config.channel_name",
    )
    error(ops.post("/runs/box-1/channels/replies/messages", {"payload": 1}), 422, "request.invalid")
    assert _journal("box-1") == before and _log("box-1") == []

    first = ops.post("/runs/box-1/channels/replies/messages", {"key": "m1", "payload": "hi"})
    assert first.status_code == 200, first.content
    assert first.json() == {
        "run_id": "box-1",
        "channel": "replies",
        "key": "m1",
        "value": "hi",
        "recorded": True,
        "woke": True,
    }
    # Received and acked by the tool, which waits on the channel again.
    body = viewer.get("/runs/box-1/waits").json()
    assert body["status"] == "awaiting_input"
    [wait] = body["waits"]
    assert wait["kind"] == "channel"
    [msg] = body["messages"]
    assert (msg["channel"], msg["key"], msg["payload"], msg["by"]) == ("replies", "m1", "hi", "ops")
    assert msg["acked_by"] == "call_1_1" and msg["enqueued_at"]

    # A duplicate key: 200, nothing recorded, the standing payload back, nothing logged.
    again = ops.post("/runs/box-1/channels/replies/messages", {"key": "m1", "payload": "close"})
    assert again.status_code == 200
    assert (again.json()["recorded"], again.json()["value"]) == (False, "hi")
    assert Run.objects.get(run_id="box-1").status == "awaiting_input"

    last = ops.post("/runs/box-1/channels/replies/messages", {"key": "m2", "payload": "close"})
    assert last.json()["recorded"] is True and last.json()["woke"] is True
    run = Run.objects.get(run_id="box-1")
    assert run.status == "finished" and run.answer == "done"
    assert "t-1 closed by m2" in JournalEntry.objects.get(run_id="box-1", name="tool:call_1_1").data
    body = viewer.get("/runs/box-1/waits").json()
    assert body["waits"] == [] and [m["acked_by"] for m in body["messages"]] == ["call_1_1"] * 2
    assert _log("box-1") == [("ops", "enqueue", "replies:m1"), ("ops", "enqueue", "replies:m2")]
    error(
        ops.post("/runs/box-1/channels/replies/messages", {"key": "m3", "payload": 1}),
        409,
        "run.finished",
    )


def test_a_message_before_the_run_waits_is_kept_unreceived():
    _agent("api-timer-box", api_cool_off, {"order": "o-9"}).start("nap", run_id="box-2")
    ops = staff_with("durable_agents.cancel_run", name="ops")
    early = ops.post("/runs/box-2/channels/replies/messages", {"key": "e1", "payload": [1, 2]})
    assert early.status_code == 200 and early.json()["woke"] is False
    [msg] = ops.get("/runs/box-2/waits").json()["messages"]
    assert msg["key"] == "e1" and msg["payload"] == [1, 2] and msg["acked_by"] is None


# -- who may call each route --------------------------------------------------------------

ROUTES = {
    "list waits": ("get", "/runs/w-ask/waits", None, "durable_agents.view_run", 200),
    "answer": (
        "post",
        "/runs/w-ask/interrupts/warehouse/answer",
        {"value": {"code": "BER"}},
        "durable_agents.approve_toolcall",
        200,
    ),
    "signal": (
        "post",
        "/runs/w-sig/signals/paid-i-2",
        {"payload": 1},
        "durable_agents.cancel_run",
        200,
    ),
    "wake": ("post", "/runs/w-nap/timers/cool-off/wake", None, "durable_agents.cancel_run", 200),
    "enqueue": (
        "post",
        "/runs/w-box/channels/replies/messages",
        {"key": "k1", "payload": "close"},
        "durable_agents.cancel_run",
        200,
    ),
}


@pytest.mark.parametrize(
    "principal", ["anonymous", "non-staff", "staff without permission", "permitted", "api key"]
)
@pytest.mark.parametrize("route", list(ROUTES))
def test_who_may_call_each_waits_route(route, principal):
    _agent("api-ask-m", api_pick_warehouse, {"order": "o-2"}).start("ship", run_id="w-ask")
    _agent("api-sig-m", api_await_payment, {"invoice": "i-2"}).start("pay", run_id="w-sig")
    _agent("api-nap-m", api_cool_off, {"order": "o-3"}).start("nap", run_id="w-nap")
    _agent("api-box-m", api_read_replies, {"ticket": "t-2"}).start("read", run_id="w-box")
    method, path, body, permission, success = ROUTES[route]
    if principal == "anonymous":
        caller = Caller(Client(), {})
    elif principal == "non-staff":
        caller = as_session(make_user("visitor", permission, staff=False))
    elif principal == "staff without permission":
        caller = as_session(make_user("viewer"))
    elif principal == "permitted":
        caller = as_session(make_user("operator", permission))
    else:
        caller = with_key(make_user("robot", permission))
    before = JournalEntry.objects.count()
    response = caller.get(path) if method == "get" else caller.post(path, body)
    refused = {
        "anonymous": (401, "auth.required"),
        "non-staff": (403, "auth.not_staff"),
        "staff without permission": (403, "auth.forbidden"),
    }
    if principal in refused:
        error(response, *refused[principal])
        assert JournalEntry.objects.count() == before and not ActionLog.objects.exists()
        return
    assert response.status_code == success, response.content
    if method == "post":  # in the action log, with the channel the caller came through
        channel = ActionLog.objects.exclude(action="create_key").get().channel
        assert channel == "session" if principal == "permitted" else channel.startswith("api-key:")


# What ``api_confirm_refund`` asks about: read when the tool runs, so a later run of it asks
# another question under the same name.
OWED = {"o-7": 100}


@da.tool(idempotent=True)
def api_confirm_refund(order: str, ctx: da.ToolContext) -> str:
    """Ask staff to confirm what the order is owed now."""
    cents = OWED[order]
    ok = ctx.interrupt(
        "confirm", f"Refund {cents} cents on {order}?", schema={"enum": ["yes", "no"]}
    )
    return f"{order}: {ok} for {cents}"


def test_an_answer_is_for_the_question_it_was_shown_and_a_reworded_one_is_asked_anew():
    OWED["o-7"] = 100
    agent = _agent("api-refund-ask", api_confirm_refund, {"order": "o-7"})
    agent.start("refund", run_id="ask-q")
    boss = staff_with("durable_agents.approve_toolcall", name="boss")
    [wait] = boss.get("/runs/ask-q/waits").json()["waits"]
    shown = wait["prompt"]
    assert shown == "Refund 100 cents on o-7?"
    OWED["o-7"] = 5000  # the tool, run again, asks about another amount
    with pytest.raises(da.InterruptPending):  # a person pressed resume: the tool asks anew
        da.resume("ask-q")
    before = _journal("ask-q")
    refused = error(
        boss.post("/runs/ask-q/interrupts/confirm/answer", {"value": "yes", "prompt": shown}),
        409,
        "interrupt.question_changed",
    )
    assert refused["details"]["prompt"] == "Refund 5000 cents on o-7?"
    assert _journal("ask-q") == before and not ActionLog.objects.filter(run_id="ask-q").exists()
    [wait] = boss.get("/runs/ask-q/waits").json()["waits"]
    assert wait["prompt"] == "Refund 5000 cents on o-7?"
    answered = boss.post(
        "/runs/ask-q/interrupts/confirm/answer", {"value": "no", "prompt": wait["prompt"]}
    )
    assert answered.status_code == 200, answered.content
    run = Run.objects.get(run_id="ask-q")
    assert run.status == "finished"
    tool = JournalEntry.objects.get(run_id="ask-q", name=names.tool("call_1_1"))
    assert "o-7: no for 5000" in tool.data
