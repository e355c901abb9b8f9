"""Waits in the admin on PostgreSQL (inline dispatch): the awaiting-input queue with a form
generated from each question's schema (errors on the form, nothing recorded), "Wake now" for
a sleeping run, early signals and channel messages on the run page, a run waiting on a
channel and a ``da.ask_staff`` question in the queue, all behind permissions and in the action log;
the queue costs the same number of queries with 2 or 20 waiting runs."""

from __future__ import annotations

from typing import Literal

import pydantic
import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import durable_agents as da
from durable_agents.admin.answerform import AnswerForm
from durable_agents.engine import names
from durable_agents.models import ActionLog, JournalEntry, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.admin_pages import client_for, messages_of, text_of
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

QUEUE = "admin:durable_agents_run_waiting"


class Shipping(pydantic.BaseModel):
    warehouse: Literal["BER", "HAM"] = pydantic.Field(description="where it ships from")
    boxes: int = pydantic.Field(ge=1, le=10)
    note: str | None = None


@da.tool(read_only=True)
def adm_pick_warehouse(order: str, ctx: da.ToolContext) -> str:
    """Ask staff how the order ships."""
    got = ctx.interrupt("shipping", f"How does {order} ship?", schema=Shipping)
    return f"{order}: {got.boxes} box(es) from {got.warehouse}"


@da.tool(idempotent=True)
def adm_cool_off(order: str, ctx: da.ToolContext) -> str:
    """Wait a day."""
    ctx.sleep("cool-off", 24 * 3600)
    return f"{order} cooled off"


@da.tool(idempotent=True)
def adm_await_payment(invoice: str, ctx: da.ToolContext) -> dict:
    """Wait for the payment provider."""
    return {"paid": ctx.await_signal(f"paid-{invoice}")}


@da.tool(idempotent=True)
def adm_read_replies(ticket: str, ctx: da.ToolContext) -> str:
    """Read the customer's replies until one closes the ticket."""
    while True:
        msg = ctx.receive("replies")
        ctx.ack("replies", msg.key)
        if msg.payload == "close":
            return f"{ticket} closed"


def _agent(name: str, tool: da.Tool, args: dict) -> da.Agent:
    script = [scripted.calls(scripted.call(tool.name, args)), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [tool])


ASK = _agent("adm-ask", adm_pick_warehouse, {"order": "o-1"})
NAP = _agent("adm-nap", adm_cool_off, {"order": "o-2"})
PAY = _agent("adm-pay", adm_await_payment, {"invoice": "i-3"})
INBOX = _agent("adm-inbox", adm_read_replies, {"ticket": "t-1"})
STAFF = da.Agent(
    "adm-staff",
    ScriptedModel(
        [
            scripted.calls(
                scripted.call(
                    "ask_staff",
                    {"question": "Which warehouse ships o-5?", "choices": ["BER", "HAM"]},
                    id="call_ask",
                )
            ),
            scripted.text("done"),
        ]
    ),
    "",
    [da.ask_staff],
)


def answer_url(run_id: str, name: str) -> str:
    return reverse("admin:durable_agents_run_answer", args=[quote(run_id), name])


def wake_url(run_id: str, name: str) -> str:
    return reverse("admin:durable_agents_run_wake", args=[quote(run_id), name])


def run_page(run_id: str) -> str:
    return reverse("admin:durable_agents_run_change", args=[quote(run_id)])


def test_the_queue_shows_the_question_and_a_schema_form_that_refuses_bad_answers():
    ASK.start("ship", run_id="q-1")
    boss = make_user("boss", "view_run", "approve_toolcall")
    client = client_for(boss)
    queue = text_of(client.get(reverse(QUEUE)))
    assert (
        "How does o-1 ship?" in queue
        and 'name="a-warehouse"' in queue
        and 'name="a-boxes"' in queue
    )
    assert "where it ships from" in queue  # the field's description as help text

    # A form error (not a number) and a schema error (too many boxes): nothing recorded.
    response = client.post(
        answer_url("q-1", "shipping"), {"a-warehouse": '"BER"', "a-boxes": "many"}
    )
    assert response.status_code == 200 and "Enter a whole number" in text_of(response)
    response = client.post(answer_url("q-1", "shipping"), {"a-warehouse": '"BER"', "a-boxes": "11"})
    assert response.status_code == 200
    assert "answer.boxes" in text_of(response)
    assert not JournalEntry.objects.filter(run_id="q-1", name=names.interrupt_answer("shipping"))
    assert not ActionLog.objects.filter(run_id="q-1").exists()

    response = client.post(
        answer_url("q-1", "shipping"), {"a-warehouse": '"HAM"', "a-boxes": "2", "a-note": ""}
    )
    assert response.status_code == 302 and response["Location"] == reverse(QUEUE)
    assert any("Answered 'shipping'" in m for m in messages_of(response))
    run = Run.objects.get(run_id="q-1")
    assert run.status == "finished" and run.answer == "done"
    tool = JournalEntry.objects.get(run_id="q-1", name=names.tool("call_1_1"))
    assert "o-1: 2 box(es) from HAM" in tool.data
    [log] = ActionLog.objects.filter(run_id="q-1")
    assert (log.actor, log.action, log.target, log.channel) == (
        "boss",
        "answer",
        "shipping",
        "admin",
    )
    assert "No run awaits input." in text_of(client.get(reverse(QUEUE)))


def test_the_run_page_banner_answers_and_comes_back_to_the_run():
    ASK.start("ship", run_id="q-2")
    client = client_for(make_user("boss", "view_run", "approve_toolcall"))
    page = text_of(client.get(run_page("q-2")))
    assert "A person is needed" in page and "How does o-1 ship?" in page
    response = client.post(
        answer_url("q-2", "shipping"), {"a-warehouse": '"BER"', "a-boxes": "1", "back": "run"}
    )
    assert response.status_code == 302 and response["Location"] == run_page("q-2")
    assert Run.objects.get(run_id="q-2").status == "finished"
    # Answered: the question's page sends back to the run.
    assert client.get(answer_url("q-2", "shipping")).status_code == 302


OWED = {"o-9": 100}


@da.tool(idempotent=True)
def adm_confirm_refund(order: str, ctx: da.ToolContext) -> str:
    """Ask staff to confirm what the order is owed now."""
    cents = OWED[order]
    ok = ctx.interrupt(
        "confirm", f"Refund {cents} cents on {order}?", schema={"enum": ["yes", "no"]}
    )
    return f"{order}: {ok} for {cents}"


def test_an_answer_is_for_the_question_its_page_showed():
    """The form posts back the question it showed: the tool asking another one under the
    same name since (it ran again on other data) makes it a form error, nothing written."""
    OWED["o-9"] = 100
    _agent("adm-refund-ask", adm_confirm_refund, {"order": "o-9"}).start("refund", run_id="q-9")
    client = client_for(make_user("boss", "view_run", "approve_toolcall"))
    page = client.get(answer_url("q-9", "confirm")).content.decode()
    assert "Refund 100 cents on o-9?" in page
    shown = page.split('name="shown_prompt_sha256" value="')[1].split('"')[0]
    OWED["o-9"] = 5000
    with pytest.raises(da.InterruptPending):  # the tool runs again and asks about 5000 cents
        da.resume("q-9")
    before = list(JournalEntry.objects.filter(run_id="q-9").values_list("name", flat=True))
    response = client.post(
        answer_url("q-9", "confirm"), {"value": '"yes"', "shown_prompt_sha256": shown}
    )
    assert response.status_code == 200
    assert "asks another question by now" in text_of(response)
    assert "Refund 5000 cents on o-9?" in text_of(response)
    after = list(JournalEntry.objects.filter(run_id="q-9").values_list("name", flat=True))
    assert after == before and not ActionLog.objects.filter(run_id="q-9").exists()
    fresh = text_of(response).split('name="shown_prompt_sha256" value="')[1].split('"')[0]
    response = client.post(
        answer_url("q-9", "confirm"), {"value": '"no"', "shown_prompt_sha256": fresh}
    )
    assert response.status_code == 302
    tool = JournalEntry.objects.get(run_id="q-9", name=names.tool("call_1_1"))
    assert "o-9: no for 5000" in tool.data


def test_answering_and_waking_need_their_permissions():
    ASK.start("ship", run_id="q-3")
    NAP.start("nap", run_id="n-3")
    viewer = client_for(make_user("viewer", "view_run"))
    queue = text_of(viewer.get(reverse(QUEUE)))
    assert "How does o-1 ship?" in queue and "needs the approve_toolcall permission" in queue
    assert "Wake now" not in queue
    assert (
        viewer.post(
            answer_url("q-3", "shipping"), {"a-warehouse": '"BER"', "a-boxes": "1"}
        ).status_code
        == 403
    )
    assert viewer.post(wake_url("n-3", "cool-off")).status_code == 403
    nobody = client_for(make_user("nobody"))
    assert nobody.get(reverse(QUEUE)).status_code == 403
    assert nobody.get(answer_url("q-3", "shipping")).status_code == 403
    # Who may answer sees the queue without view_run (as deciders see the approval queue).
    answerer = text_of(client_for(make_user("answerer", "approve_toolcall")).get(reverse(QUEUE)))
    assert "How does o-1 ship?" in answerer and 'name="a-boxes"' in answerer
    assert Run.objects.get(run_id="q-3").status == "awaiting_input"
    assert Run.objects.get(run_id="n-3").status == "sleeping"
    assert not ActionLog.objects.exists()


def test_wake_now_from_the_queue_and_the_run_page():
    NAP.start("nap", run_id="n-1")
    NAP.start("nap", run_id="n-2")
    ops = client_for(make_user("ops", "view_run", "cancel_run"))
    queue = text_of(ops.get(reverse(QUEUE)))
    assert "n-1" in queue and "Wake now" in queue
    assert ops.get(wake_url("n-1", "cool-off")).status_code == 405

    response = ops.post(wake_url("n-1", "cool-off"))
    assert response.status_code == 302 and response["Location"] == reverse(QUEUE)
    assert Run.objects.get(run_id="n-1").status == "finished"
    waited = JournalEntry.objects.get(run_id="n-1", name=names.waited("cool-off"))
    assert '"early":true' in waited.data.replace(" ", "") and '"by":"ops"' in waited.data

    assert "Wake now" in text_of(ops.get(run_page("n-2")))
    response = ops.post(wake_url("n-2", "cool-off"), {"back": "run"})
    assert response["Location"] == run_page("n-2")
    assert Run.objects.get(run_id="n-2").status == "finished"
    again = ops.post(wake_url("n-2", "cool-off"), {"back": "run"})
    assert any("had already woken" in m for m in messages_of(again))
    missing = ops.post(wake_url("n-2", "nope"), {"back": "run"})
    assert any("timer.not_found" in m for m in messages_of(missing))
    assert list(ActionLog.objects.order_by("id").values_list("run_id", "action")) == [
        ("n-1", "wake"),
        ("n-2", "wake"),
    ]


def test_the_run_page_shows_signals_awaited_and_delivered_early():
    PAY.start("pay", run_id="s-1")
    da.signal("s-1", "refund-i-3", {"cents": 7}, by=make_user("ops", "cancel_run"))
    page = text_of(client_for(make_user("viewer", "view_run")).get(run_page("s-1")))
    assert "Awaits signal paid-i-3" in page.replace("<code>", "").replace("</code>", "")
    assert "Signals delivered, not consumed yet" in page and "refund-i-3" in page
    assert '"cents": 7' in page


def test_a_run_waiting_on_a_channel_in_the_queue_and_its_messages_on_the_run_page():
    INBOX.start("read", run_id="ch-1")
    viewer = client_for(make_user("viewer", "view_run", "approve_toolcall"))
    queue = text_of(viewer.get(reverse(QUEUE)))
    flat = queue.replace("<code>", "").replace("</code>", "")
    assert "ch-1" in queue and "Waits for a message on channel replies" in flat
    # No form: the message comes from outside, and the queue says from where.
    assert "POST /runs/ch-1/channels/replies/messages" in flat
    assert (
        "python manage.py durable_agents send ch-1 replies '<key>' --payload '<json>' --by viewer"
        in flat
    )
    assert "da-answer" not in queue and "No run awaits input." not in queue

    ops = make_user("ops", "cancel_run")
    assert da.enqueue("ch-1", "replies", "m1", {"text": "hello"}, by=ops).woke
    da.enqueue("ch-1", "notes", "n1", "nobody reads this")
    page = text_of(viewer.get(run_page("ch-1")))
    flat = page.replace("<code>", "").replace("</code>", "")
    assert "Waiting on the world" in page and "Waits for a message on channel replies" in flat
    assert "Channel messages" in page
    assert "replies</td><td>m1" in flat and '"text": "hello"' in page
    assert "acked by call call_1_1" in flat
    assert "notes</td><td>n1" in flat and "not received yet" in page
    assert "ops" in page and "a system" in page

    da.enqueue("ch-1", "replies", "m2", "close")
    assert Run.objects.get(run_id="ch-1").status == "finished"
    page = text_of(viewer.get(run_page("ch-1")))
    assert "Waits for a message" not in page and "Channel messages" in page
    assert "No run awaits input." in text_of(viewer.get(reverse(QUEUE)))


def test_a_question_from_ask_staff_in_the_queue_with_its_choices():
    STAFF.start("ship", run_id="st-1")
    boss = client_for(make_user("boss", "view_run", "approve_toolcall"))
    queue = text_of(boss.get(reverse(QUEUE)))
    assert "Which warehouse ships o-5?" in queue and "staff.call_ask" in queue
    assert '<select name="value"' in queue
    assert ">BER</option>" in queue and ">HAM</option>" in queue
    response = boss.post(answer_url("st-1", "staff.call_ask"), {"value": '"MUC"'})
    assert response.status_code == 200 and "errorlist" in text_of(response)
    assert not JournalEntry.objects.filter(
        run_id="st-1", name=names.interrupt_answer("staff.call_ask")
    ).exists()
    response = boss.post(answer_url("st-1", "staff.call_ask"), {"value": '"HAM"'})
    assert response.status_code == 302, text_of(response)
    run = Run.objects.get(run_id="st-1")
    assert run.status == "finished" and run.answer == "done"
    assert "HAM" in JournalEntry.objects.get(run_id="st-1", name=names.tool("call_ask")).data


def _queue_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse(QUEUE)).status_code == 200
    return len(ctx.captured_queries)


def test_the_queue_costs_the_same_with_2_or_20_waiting_runs():
    client = client_for(make_user("boss", "view_run", "approve_toolcall", "cancel_run"))
    for i in range(2):
        ASK.start("ship", run_id=f"c-{i}")
    few = _queue_queries(client)
    for i in range(2, 20):
        (ASK, NAP, INBOX)[i % 3].start("x", run_id=f"c-{i}")
    assert _queue_queries(client) == few


def test_forms_for_a_scalar_choice_no_schema_and_nested_values():
    choice = AnswerForm({"type": "string", "enum": ["BER", "HAM"]}, {"value": '"HAM"'})
    assert choice.is_valid() and choice.value() == "HAM"
    assert not AnswerForm({"enum": ["BER"]}, {"value": '"MUC"'}).is_valid()
    anything = AnswerForm(None, {"value": '{"any": [1, 2]}'})
    assert anything.is_valid() and anything.value() == {"any": [1, 2]}
    assert not AnswerForm(None, {"value": "{nope"}).is_valid()
    nested = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "at": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["ok", "tags"],
    }
    form = AnswerForm(nested, {"a-ok": "false", "a-tags": '["x"]', "a-at": ""})
    assert form.is_valid(), form.errors
    assert form.value() == {"ok": False, "tags": ["x"]}  # an empty optional field: no key
