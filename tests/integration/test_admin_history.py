"""Fork, compare, drift and sessions in the staff admin, on PostgreSQL through Django's test
client: a fork made in the admin is a real run (driven inline here) whose journal holds the
patch while its source stays as it was; refusals write nothing; the sessions list costs the
same number of queries whatever its length."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from durable_agents.models import ActionLog, ApprovalRequest, Run
from tests.support.admin_pages import client_for, messages_of, text_of
from tests.support.agents import echo, gated, lookup
from tests.support.journals import journal
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

FORK = "durable_agents.fork_run"
VIEW = "durable_agents.view_run"


class Parrot:
    """Step 1 looks order 7 up; every later step repeats the last message it was sent, so a
    fork that appends a user message differs from its source at step 2, not before."""

    model_id = "parrot"

    def generate(self, request: ModelRequest) -> ModelResponse:
        if not any(m.role == "assistant" for m in request.messages):
            call = ToolCall("look-1", "lookup", '{"order_id": "7"}')
            message = Message("assistant", "", tool_calls=(call,))
            return ModelResponse(message, Usage(3, 2), FINISH_TOOL_CALLS, model=self.model_id)
        heard = request.messages[-1].content
        return ModelResponse(
            Message("assistant", f"heard: {heard}"), Usage(3, 2), FINISH_STOP, model=self.model_id
        )


parrot = da.Agent("admin-parrot", Parrot(), "Repeat what you hear.", [lookup])


# -- helpers ------------------------------------------------------------------------------


def run_url(run_id: str, suffix: str = "change") -> str:
    return reverse(f"admin:durable_agents_run_{suffix}", args=[quote(run_id)])


def fork_url(run_id: str, step: int) -> str:
    return run_url(run_id, "fork") + f"?step={step}"


def finished_echo(run_id: str) -> dict[str, Any]:
    echo.start("where is order 7?", run_id=run_id)
    assert Run.objects.get(run_id=run_id).status == "finished"
    return journal(run_id)


# -- fork from here -----------------------------------------------------------------------


def test_fork_in_the_admin_with_a_replaced_tool_result():
    before = finished_echo("fk-src")
    alice = make_user("alice", VIEW, FORK)
    client = client_for(alice)

    page = text_of(client.get(run_url("fk-src")))
    assert f'href="{fork_url("fk-src", 1)}"' in page and "Fork from here" in page

    form = client.get(fork_url("fk-src", 1))
    assert form.status_code == 200
    shown = text_of(form)
    assert "call_1_1" in shown and "<strong>lookup</strong>" in shown
    assert '"status": "shipped"' in shown  # the recorded result, next to its field
    assert 'name="result_0"' in shown and 'name="error_0"' in shown

    response = client.post(
        fork_url("fk-src", 1),
        {"result_0": '{"order": "7", "status": "lost in transit"}', "new_run_id": "fk-lost"},
    )
    assert response.status_code == 302, text_of(response)
    assert response["Location"] == run_url("fk-lost")
    assert any("fk-lost" in m and "handed to a driver" in m for m in messages_of(response))

    fork = Run.objects.get(run_id="fk-lost")
    assert (fork.status, fork.forked_from, fork.forked_step) == ("finished", "fk-src", 1)
    assert fork.answer == "order 7 shipped"  # the script's next turn, driven inline
    record = journal("fk-lost")["tool:call_1_1"]
    assert record["result"] == {"order": "7", "status": "lost in transit"}
    assert record["patched"] is True and record["is_error"] is False
    assert journal("fk-src") == before  # the source is untouched
    log = ActionLog.objects.get(action="fork")
    assert (log.actor, log.run_id, log.target) == ("alice", "fk-src", "fk-lost")
    assert log.payload["step"] == 1

    # The source lists its fork; the fork names its source and links to the comparison.
    source_page = text_of(client.get(run_url("fk-src")))
    assert 'id="da-forks"' in source_page and run_url("fk-lost") in source_page
    fork_page = text_of(client.get(run_url("fk-lost")))
    assert 'id="da-source"' in fork_page and "at step 1" in fork_page
    compare = reverse("admin:durable_agents_run_compare") + "?a=fk-src&b=fk-lost"
    assert 'id="da-compare-source"' in fork_page and compare in fork_page
    assert "patched in a fork" in fork_page and "Forked from run 'fk-src' at step 1" in fork_page


def test_mark_as_error_without_a_result_records_the_recorded_one_as_an_error():
    finished_echo("fk-err")
    client = client_for(make_user("root", superuser=True))
    response = client.post(fork_url("fk-err", 1), {"error_0": "on", "append_user": "and now?"})
    assert response.status_code == 302, text_of(response)
    fork_id = Run.objects.get(forked_from="fk-err").run_id
    assert fork_id == "fk-err.fork-1"  # the engine's default id
    records = journal(fork_id)
    assert records["tool:call_1_1"]["is_error"] is True
    assert records["tool:call_1_1"]["result"] == {"order": "7", "status": "shipped"}
    assert records["user:1"]["text"] == "and now?"
    assert ActionLog.objects.get(action="fork").actor == "root"


def test_invalid_json_or_an_engine_refusal_is_a_form_error_and_writes_nothing():
    before = finished_echo("fk-bad")
    client = client_for(make_user("root", superuser=True))
    runs = set(Run.objects.values_list("run_id", flat=True))

    response = client.post(fork_url("fk-bad", 1), {"result_0": "{status: lost"})
    assert response.status_code == 200
    assert "The result of call_1_1 is not valid JSON" in text_of(response)
    response = client.post(fork_url("fk-bad", 1), {"result_0": "NaN"})
    assert response.status_code == 200 and "not valid JSON" in text_of(response)

    response = client.post(fork_url("fk-bad", 1), {"new_run_id": "fk-bad"})  # exists
    assert response.status_code == 200
    assert "history.fork_exists" in text_of(response) and "Nothing was written" in text_of(response)
    response = client.post(fork_url("fk-bad", 1), {"new_run_id": "not a valid id!"})
    assert response.status_code == 200 and "config.run_id" in text_of(response)

    response = client.get(fork_url("fk-bad", 9))  # no such step
    assert response.status_code == 302 and response["Location"] == run_url("fk-bad")
    assert any("has no step '9'" in m for m in messages_of(response))
    response = client.post(fork_url("fk-bad", 9), {})
    assert response.status_code == 302

    assert set(Run.objects.values_list("run_id", flat=True)) == runs
    assert not ActionLog.objects.exists()
    assert journal("fk-bad") == before


def test_forking_needs_the_fork_permission():
    finished_echo("fk-perm")
    viewer = client_for(make_user("viewer", VIEW))
    assert "Fork from here" not in text_of(viewer.get(run_url("fk-perm")))
    assert viewer.get(fork_url("fk-perm", 1)).status_code == 403
    response = viewer.post(fork_url("fk-perm", 1), {"result_0": '"forged"', "new_run_id": "x"})
    assert response.status_code == 403
    assert list(Run.objects.values_list("run_id", flat=True)) == ["fk-perm"]
    assert not ActionLog.objects.exists()
    # fork_run alone is enough to see runs (the fork's page is where the form leads).
    forker = client_for(make_user("forker", FORK))
    assert forker.get(run_url("fk-perm")).status_code == 200
    assert forker.get(fork_url("fk-perm", 1)).status_code == 200


def test_a_fork_of_a_run_awaiting_approval_asks_again():
    gated.start("refund order 7", run_id="fk-gated")
    client = client_for(make_user("root", superuser=True))
    page = text_of(client.get(fork_url("fk-gated", 1)))
    assert "No result recorded" in page
    response = client.post(fork_url("fk-gated", 1), {"new_run_id": "fk-gated-2"})
    assert response.status_code == 302, text_of(response)
    assert Run.objects.get(run_id="fk-gated-2").status == "awaiting_approval"
    assert ApprovalRequest.objects.filter(run_id="fk-gated-2", status="pending").exists()


# -- compare ------------------------------------------------------------------------------


def test_compare_marks_the_first_differing_step():
    parrot.start("where is order 7?", run_id="cmp-a")
    assert Run.objects.get(run_id="cmp-a").answer.startswith("heard: ")
    forker = make_user("forker", "durable_agents.fork_run")
    da.fork("cmp-a", 1, da.Patch(append_user="in French, please"), new_run_id="cmp-b", by=forker)
    da.resume("cmp-b")
    assert Run.objects.get(run_id="cmp-b").answer == "heard: in French, please"

    client = client_for(make_user("viewer", VIEW))
    url = reverse("admin:durable_agents_run_compare")
    response = client.get(url, {"a": "cmp-a", "b": "cmp-b"})
    assert response.status_code == 200
    page = text_of(response)
    assert response.context["diverged_at"] == 2
    assert '<tr id="step-2" class="da-differs da-diverged">' in page
    assert '<tr id="step-1" class="">' in page  # the same first step: not marked
    assert len(re.findall(r'<tr id="step-\d+" class="[^"]*da-diverged', page)) == 1
    assert "heard: in French, please" in page and '"order_id": "7"' in page
    assert "A 2, B 2" in page  # step count
    assert 'href="#step-2">step 2</a>' in page

    unknown = client.get(url, {"a": "cmp-a", "b": "no-such-run"})
    assert unknown.status_code == 404
    assert "No run 'no-such-run'" in text_of(unknown)
    assert client.get(url, {"a": "cmp-a"}).status_code == 400
    assert client.get(url).status_code == 200  # the empty form
    assert client_for(make_user("nobody")).get(url, {"a": "cmp-a", "b": "cmp-b"}).status_code == 403


# -- drift --------------------------------------------------------------------------------


def test_run_page_shows_the_fingerprint_and_drift_prominently():
    finished_echo("dr-1")
    client = client_for(make_user("viewer", VIEW))
    page = text_of(client.get(run_url("dr-1")))
    assert 'id="da-fingerprint"' in page and echo.fingerprint()["hash"] in page
    assert 'id="da-drift"' not in page and "(no drift recorded)" in page

    Journal(DjangoStore()).write(
        "dr-1",
        "@drift/abc123",
        {
            "kind": "drift",
            "changes": {"model": ["scripted", "gpt-x"], "tools_added": ["refund"]},
            "to": {"hash": "abc123"},
        },
    )
    page = text_of(client.get(run_url("dr-1")))
    assert 'id="da-drift"' in page and "Resumed under a changed agent" in page
    assert "model scripted → gpt-x" in page and "tools added: refund" in page
    assert page.index('id="da-drift"') < page.index('id="da-journal"')


# -- sessions -----------------------------------------------------------------------------


def test_sessions_list_and_a_session_page_with_its_transcript():
    chat = echo.session("chat-1")
    chat.send("hi")
    chat.send("and order 8?")
    gated.session("chat-2").send_once("d1", "Please refund order 7.", wait=True)
    client = client_for(make_user("viewer", VIEW))

    changelist = text_of(client.get(reverse("admin:durable_agents_run_changelist")))
    sessions_url = reverse("admin:durable_agents_run_sessions")
    assert f'href="{sessions_url}"' in changelist

    response = client.get(sessions_url)
    assert response.status_code == 200
    rows = {s["session_id"]: s for s in response.context["sessions"]}
    assert set(rows) == {"chat-1", "chat-2"}
    assert (rows["chat-1"]["turns"], rows["chat-1"]["open_turns"]) == (2, 0)
    assert (rows["chat-2"]["turns"], rows["chat-2"]["open_turns"]) == (1, 1)
    assert "chat-2" not in text_of(client.get(sessions_url, {"q": "chat-1"}))

    page = text_of(client.get(rows["chat-1"]["url"]))
    transcript = page[page.index('id="da-transcript"') : page.index('id="da-turns"')]
    order = [transcript.index(t) for t in ("hi", "order 7 shipped", "and order 8?")]
    assert order == sorted(order)
    assert transcript.count("order 7 shipped") == 2
    assert run_url("chat-1>turn/1") in page and run_url("chat-1>turn/2") in page

    page = text_of(client.get(rows["chat-2"]["url"]))
    assert "Please refund order 7." in page and "The turn is awaiting_approval." in page

    # A turn's run page links to its session.
    turn_page = text_of(client.get(run_url("chat-1>turn/1")))
    assert 'id="da-session-link"' in turn_page and rows["chat-1"]["url"] in turn_page

    missing = client.get(reverse("admin:durable_agents_run_session", args=["nope"]))
    assert missing.status_code == 302 and missing["Location"] == sessions_url
    assert client_for(make_user("nobody")).get(sessions_url).status_code == 403


def _sessions(start: int, stop: int) -> None:
    rows = []
    for i in range(start, stop):
        sid = f"qs-{i:03d}"
        rows.append(Run(run_id=f"{sid}>session", agent="echo", status="finished", session_id=sid))
        rows.append(Run(run_id=f"{sid}>turn/1", agent="echo", status="finished", session_id=sid))
        rows.append(Run(run_id=f"{sid}>turn/2", agent="echo", status="queued", session_id=sid))
    Run.objects.bulk_create(rows)


def test_sessions_list_costs_the_same_for_10_and_50_sessions():
    client = client_for(make_user("root", superuser=True))
    url = reverse("admin:durable_agents_run_sessions")
    _sessions(0, 10)
    client.get(url)  # warm caches (content types, permissions)
    with CaptureQueriesContext(connection) as small:
        response = client.get(url)
    assert len(response.context["sessions"]) == 10
    assert response.context["sessions"][0]["turns"] == 2
    _sessions(10, 50)
    with CaptureQueriesContext(connection) as large:
        response = client.get(url)
    assert len(response.context["sessions"]) == 50 and "qs-049" in text_of(response)
    assert len(small) == len(large), [q["sql"] for q in large]


def test_a_run_named_like_the_admin_pages_still_opens():
    for run_id in ("sessions", "compare"):
        finished_echo(run_id)
    client = client_for(make_user("viewer", VIEW))
    for run_id in ("sessions", "compare"):
        response = client.get(run_url(run_id))
        assert response.status_code == 200 and response.context["original"].run_id == run_id
    assert client.get(reverse("admin:durable_agents_run_sessions")).status_code == 200
    assert client.get(reverse("admin:durable_agents_run_compare")).status_code == 200
