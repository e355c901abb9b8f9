"""The API's session and history routes on PostgreSQL (inline dispatch drives the turns)."""

from __future__ import annotations

import pytest

from durable_agents.models import ActionLog, Run
from tests.support.api import error, staff_with, with_key
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_send_once_new_then_answered_then_conflict():
    caller = staff_with("durable_agents.add_run")
    first = caller.put("/sessions/chat-1/messages/d-1", {"text": "hi", "agent": "echo"})
    assert first.status_code == 202 and first.json()["status"] == "queued", first.content
    # Inline dispatch drove it after the commit: the redelivery gets the answer.
    again = caller.put("/sessions/chat-1/messages/d-1", {"text": "hi"})
    assert again.status_code == 200 and again.json()["answer"] == "order 7 shipped"
    assert again.json()["run_id"] == "chat-1>event/d-1"
    error(
        caller.put("/sessions/chat-1/messages/d-1", {"text": "other"}), 409, "session.key_conflict"
    )
    assert Run.objects.filter(session_id="chat-1").exclude(run_id__endswith=">session").count() == 1


def test_send_once_of_a_paused_turn_is_accepted_not_rerun():
    caller = staff_with("durable_agents.add_run")
    body = {"text": "refund order 7", "agent": "gated"}
    first = caller.put("/sessions/chat-2/messages/d-1", body)
    assert first.status_code == 202 and first.json()["status"] in ("queued", "paused")
    second = caller.put("/sessions/chat-2/messages/d-1", body)
    assert second.status_code == 202 and second.json()["status"] == "paused"


def test_messages_and_the_session_page():
    caller = staff_with("durable_agents.add_run")
    sent = caller.post("/sessions/chat-3/messages", {"text": "hi", "agent": "echo"})
    assert sent.status_code == 202 and sent.json()["run_id"] == "chat-3>turn/1"
    page = caller.get("/sessions/chat-3")
    assert page.status_code == 200
    assert page.json()["transcript"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "order 7 shipped"},
    ]
    gated = caller.post("/sessions/chat-4/messages", {"text": "refund order 7", "agent": "gated"})
    assert gated.status_code == 202
    view = caller.get("/sessions/chat-4").json()
    assert view["open_turns"] == [{"run_id": "chat-4>turn/1", "status": "awaiting_approval"}]
    assert view["approvals"][0]["tool_name"] == "refund"
    refused = caller.post("/sessions/chat-4/messages", {"text": "something else"})
    error(refused, 409, "session.awaiting_approval")


def test_session_routes_refuse_bad_input_and_callers():
    caller = staff_with("durable_agents.add_run")
    error(
        caller.post("/sessions/bad id/messages", {"text": "hi", "agent": "echo"}),
        400,
        "config.session_id",
    )
    error(caller.post("/sessions/new-one/messages", {"text": "hi"}), 400, "session.agent_missing")
    error(caller.get("/sessions/nobody"), 404, "session.not_found")
    reader = with_key(make_user("reader"))
    error(
        reader.post("/sessions/s/messages", {"text": "hi", "agent": "echo"}), 403, "auth.forbidden"
    )
    assert not Run.objects.exists()


def test_history_fork_and_compare():
    caller = staff_with("durable_agents.add_run", "durable_agents.fork_run")
    caller.post("/runs", {"agent": "echo", "input": "where is 7?", "run_id": "h-1"})
    steps = caller.get("/runs/h-1/history").json()["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    call_id = steps[0]["tool_calls"][0]["call_id"]
    forked = caller.post(
        "/runs/h-1/fork", {"from_step": 1, "tool_results": {call_id: {"status": "lost"}}}
    )
    assert forked.status_code == 202, forked.content
    fork_id = forked.json()["run_id"]
    assert fork_id == "h-1.fork-1" and Run.objects.get(run_id=fork_id).status == "finished"
    assert ActionLog.objects.filter(action="fork", run_id="h-1").exists()
    diff = caller.get("/runs/compare", a="h-1", b=fork_id).json()
    assert diff["diverged_at"] == 1 and diff["drift"]["step_count"] == [2, 2]
    error(caller.post("/runs/h-1/fork", {"from_step": 9}), 400, "history.step")
    error(
        caller.post("/runs/h-1/fork", {"from_step": 1, "new_run_id": fork_id}),
        409,
        "history.fork_exists",
    )
    error(caller.get("/runs/compare", a="h-1", b="nope"), 404, "run.not_found")
    plain = staff_with("durable_agents.add_run", name="plain")
    error(plain.post("/runs/h-1/fork", {"from_step": 1}), 403, "auth.forbidden")


def test_a_turn_that_did_not_finish_reads_the_same_in_the_api_the_admin_and_the_model():
    """One decoder of a session's journal (engine.session_log): a cancelled turn is "did not
    finish" for the model, in the API's transcript and on the admin's session page."""
    from django.urls import reverse

    import durable_agents as da
    from tests.support.admin_pages import client_for, text_of
    from tests.support.agents import gated

    caller = staff_with("durable_agents.add_run", "durable_agents.view_run")
    assert caller.post("/sessions/chat-5/messages", {"text": "refund order 7", "agent": "gated"})
    da.cancel("chat-5>turn/1", by=make_user("ops", "durable_agents.cancel_run"))
    later = caller.post("/sessions/chat-5/messages", {"text": "and order 8?"})
    assert later.status_code == 202  # the cancelled turn closed; the next one runs
    said = "[this turn did not finish: cancelled]"
    transcript = caller.get("/sessions/chat-5").json()["transcript"]
    assert transcript[:2] == [
        {"role": "user", "content": "refund order 7"},
        {"role": "assistant", "content": said},
    ]
    assert [(m.role, m.content) for m in gated.session("chat-5", channel="api").history()] == [
        (t["role"], t["content"]) for t in transcript
    ]
    root = make_user("root", superuser=True)
    page = text_of(
        client_for(root).get(reverse("admin:durable_agents_run_session", args=["chat-5"]))
    )
    assert said in page
