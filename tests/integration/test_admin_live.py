"""The admin's live views: the run page's Server-Sent Events (staff session, view
permission, through pauses until the run ends) and the queue's list of pending calls."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

import durable_agents as da
from durable_agents.models import ApprovalRequest, JournalEntry
from tests.support.agents import echo, gated
from tests.support.people import make_user
from tests.support.sse import parse, records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_run_pages_stream_needs_a_staff_session_that_may_view_runs():
    echo.run("live-1", "where is order 7?")
    url = reverse("admin:durable_agents_run_events", args=["live-1"])
    assert Client().get(url).status_code == 302  # to the login page
    assert logged_in(make_user("outsider")).get(url).status_code == 403
    viewer = logged_in(make_user("viewer", "durable_agents.view_run"))
    response = viewer.get(url)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = parse(b"".join(response.streaming_content).decode())
    names = list(JournalEntry.objects.filter(run_id="live-1").values_list("seq", "name"))
    assert records(events) == names
    assert events[-1] == {"event": "end", "data": {"status": "finished"}}
    after = viewer.get(url, {"after": names[-2][0]})
    assert records(parse(b"".join(after.streaming_content).decode())) == names[-1:]
    assert viewer.get(url, {"after": "soon"}).status_code == 400
    assert Client(enforce_csrf_checks=False).post(url).status_code == 302
    viewer_post = viewer.post(url)
    assert viewer_post.status_code == 405
    gone = viewer.get(reverse("admin:durable_agents_run_events", args=["nope"]))
    assert gone.status_code == 302


def test_the_run_page_carries_the_stream_url_while_the_run_is_unfinished():
    with pytest.raises(da.ApprovalPending):
        gated.run("live-2", "refund order 7")
    viewer = logged_in(make_user("viewer", "durable_agents.view_run"))
    page = viewer.get(reverse("admin:durable_agents_run_change", args=["live-2"])).content.decode()
    assert 'id="da-live"' in page and 'data-status="awaiting_approval"' in page
    assert reverse("admin:durable_agents_run_events", args=["live-2"]) in page
    assert "durable_agents/live.js" in page
    echo.run("live-3", "where is order 7?")
    done = viewer.get(reverse("admin:durable_agents_run_change", args=["live-3"])).content
    assert b'id="da-live"' not in done  # a finished run has nothing to follow


def test_the_queue_polls_the_ids_of_pending_calls():
    with pytest.raises(da.ApprovalPending):
        gated.run("live-4", "refund order 7")
    url = reverse("admin:durable_agents_approvalrequest_pending")
    assert logged_in(make_user("outsider")).get(url).status_code == 403
    approver = logged_in(make_user("approver", "durable_agents.approve_toolcall"))
    pending = list(ApprovalRequest.objects.filter(status="pending").values_list("pk", flat=True))
    assert approver.get(url).json() == {"pending": pending} and pending
    queue = approver.get(reverse("admin:durable_agents_approvalrequest_changelist"))
    assert b"durable_agents/live.js" in queue.content
