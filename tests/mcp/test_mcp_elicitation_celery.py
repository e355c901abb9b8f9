"""An MCP server's question during a call, across processes: a real Celery worker drives
the run and waits inside the call; staff answer in the admin (the awaiting-input queue and
the inbox list the running run's question, the answer form posts it) or through the API,
on PostgreSQL. The answer reaches the server and its refund fires once; an answer by
someone without the permission, or a bad one, is refused with nothing written; a question
nobody answers in time is cancelled and a late answer refused. Effects are counted by the
server, in a file."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from celery import _state as celery_state
from django.contrib.admin.utils import quote
from django.urls import reverse

import durable_agents as da
import durable_agents.tasks  # (registers drive_run with the test's Celery app)
from durable_agents.engine import names
from durable_agents.models import ActionLog, JournalEntry, Run
from tests.support import mcp_elicit_agents
from tests.support.admin_pages import client_for, messages_of, text_of
from tests.support.api import error, staff_with
from tests.support.mcp_servers import effects
from tests.support.people import make_user
from tests.support.workers import CeleryProcesses, CeleryTarget, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

QUESTION = "mcp.call_1_1.1"


@pytest.fixture(scope="module")
def target():
    target = CeleryTarget.fresh(os.environ.get("PYTEST_XDIST_WORKER", "master"))
    yield target
    target.clean()


@pytest.fixture
def worker(target, settings, tmp_path):
    """This process dispatches to the module's queue; one real worker (threads) drives."""
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "DISPATCH": "celery",
        "CELERY_QUEUE": target.queue,
    }
    previous = celery_state.get_current_app()
    app = target.app()
    target.purge(app)
    procs = CeleryProcesses(target, tmp_path)
    try:
        yield procs.worker(
            "threads",
            2,
            name="elicit",
            DA_EXTRA_AGENTS="tests.support.mcp_elicit_agents.agents",
            DA_MCP_EFFECTS=str(mcp_elicit_agents.EFFECTS),
        ).wait_ready()
    finally:
        procs.kill_all()
        target.purge(app)
        app.close()
        previous.set_current()
        da.mcp.close_all()  # the servers this process started to list the tools


def asked(run_id: str, name: str = QUESTION) -> dict:
    entry = wait_for(
        lambda: JournalEntry.objects.filter(run_id=run_id, name=names.wait(name)).first(),
        60,
        f"run {run_id} to ask {name}",
    )
    return json.loads(entry.data)


def answer_url(run_id: str, name: str = QUESTION) -> str:
    return reverse("admin:durable_agents_run_answer", args=[quote(run_id), name])


def answered(run_id: str) -> bool:
    return JournalEntry.objects.filter(
        run_id=run_id, name=names.interrupt_answer(QUESTION)
    ).exists()


def finished(run_id: str) -> Run:
    return wait_for(
        lambda: Run.objects.filter(run_id=run_id, status="finished").first(),
        60,
        f"run {run_id} to finish",
    )


def refunds(order_id: str) -> list[dict]:
    return [
        e
        for e in effects(mcp_elicit_agents.EFFECTS, "confirmed_refund")
        if e["order_id"] == order_id
    ]


def test_staff_answer_in_the_admin_reaches_the_server_and_it_refunds_once(worker):
    run_id = mcp_elicit_agents.ask.start("refund e1", run_id=f"el-{uuid.uuid4().hex[:10]}")
    before = len(refunds("e1"))
    question = asked(run_id)
    assert question["prompt"] == "Refund 42 cents on order e1?" and question["live"]
    assert Run.objects.get(run_id=run_id).status == "running"  # the worker waits in the call

    # The running run's question is in the queue and the inbox, with its form.
    boss = client_for(make_user("boss", "view_run", "approve_toolcall"))
    for page in ("admin:durable_agents_run_waiting", "admin:durable_agents_inbox"):
        shown = text_of(boss.get(reverse(page)))
        assert "Refund 42 cents on order e1?" in shown and 'name="a-approve"' in shown, page
    assert "The call waits for this answer until" in text_of(boss.get(answer_url(run_id)))
    run_page = reverse("admin:durable_agents_run_change", args=[quote(run_id)])
    assert "A person is needed" in text_of(boss.get(run_page))

    # Someone without the permission is refused, in the admin and in the API.
    viewer = client_for(make_user("viewer", "view_run"))
    refused = viewer.post(answer_url(run_id), {"a-approve": "true", "a-note": "me"})
    assert refused.status_code == 403
    error(
        staff_with(name="api-viewer").post(
            f"/runs/{run_id}/interrupts/{QUESTION}/answer", {"value": {"approve": True}}
        ),
        403,
        "auth.forbidden",
    )
    # A bad answer: a form error in the admin, 400 in the API; nothing written.
    bad = boss.post(answer_url(run_id), {"a-approve": "", "a-note": "x"})
    assert bad.status_code == 200 and "errorlist" in text_of(bad)
    error(
        staff_with("durable_agents.approve_toolcall", name="api-boss").post(
            f"/runs/{run_id}/interrupts/{QUESTION}/answer", {"value": {"approve": "yes"}}
        ),
        400,
        "interrupt.invalid_answer",
    )
    assert not answered(run_id) and not ActionLog.objects.filter(run_id=run_id).exists()

    good = boss.post(answer_url(run_id), {"a-approve": "true", "a-note": "ok by boss"})
    assert good.status_code == 302
    assert any("the call waiting for it sends it" in m for m in messages_of(good))
    run = finished(run_id)
    assert run.answer == "asked"
    tool = json.loads(JournalEntry.objects.get(run_id=run_id, name=names.tool("call_1_1")).data)
    assert json.loads(tool["result"]["content"][0]["text"]) == {
        "refunded": 42,
        "order": "e1",
        "note": "ok by boss",
    }
    fired = refunds("e1")[before:]
    assert [(e["cents"], e["note"]) for e in fired] == [(42, "ok by boss")]
    sent = json.loads(JournalEntry.objects.get(run_id=run_id, name=names.waited(QUESTION)).data)
    assert sent["outcome"] == "accept"
    [log] = ActionLog.objects.filter(run_id=run_id)
    assert (log.actor, log.action, log.target) == ("boss", "answer", QUESTION)
    # Answered and done: the question is off the queue.
    assert "Refund 42 cents on order e1?" not in text_of(
        boss.get(reverse("admin:durable_agents_run_waiting"))
    )


def test_a_question_nobody_answers_in_time_is_cancelled_and_a_late_answer_refused(worker):
    run_id = mcp_elicit_agents.late.start("refund e2", run_id=f"el-{uuid.uuid4().hex[:10]}")
    before = len(refunds("e2"))
    assert asked(run_id)["deadline_ms"]
    run = finished(run_id)
    tool = json.loads(JournalEntry.objects.get(run_id=run_id, name=names.tool("call_1_1")).data)
    assert json.loads(tool["result"]["content"][0]["text"])["action"] == "cancel"
    assert refunds("e2")[before:] == []
    gave_up = json.loads(
        JournalEntry.objects.get(run_id=run_id, name=names.interrupt_answer(QUESTION)).data
    )
    assert (gave_up["outcome"], gave_up["reason"]) == ("cancel", "timeout")
    count = JournalEntry.objects.filter(run_id=run_id).count()
    boss = staff_with("durable_agents.approve_toolcall", name="late-boss")
    error(
        boss.post(f"/runs/{run_id}/interrupts/{QUESTION}/answer", {"value": {"approve": True}}),
        409,
        "interrupt.expired",
    )
    assert JournalEntry.objects.filter(run_id=run_id).count() == count
    assert run.status == "finished"
