"""Issue 14, see what happened: the runs list shows input and answer excerpts, searches run
ids, inputs and answers, filters by date, and reads only the start of each input and answer
in its one query."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo
from durable_agents.models import Run
from tests.support.agents import echo
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/durable_agents/run/"


def _viewer() -> Client:
    client = Client()
    client.force_login(make_user("viewer", "durable_agents.view_run"))
    return client


def _ids(client: Client, query: str = "") -> list[str]:
    return sorted(r.run_id for r in client.get(LIST + query).context["cl"].result_list)


def test_input_and_answer_excerpts_are_columns():
    echo.start("where is my order 7?", run_id="ex-echo")
    long_input = "please " + "really " * 40 + "hurry"
    DjangoStore().create_run(RunInfo("ex-long", agent="echo", input=long_input))
    DjangoStore().create_run(RunInfo("ex-dict", agent="echo", input={"order": 7}))
    assert reverse("admin:durable_agents_run_changelist") == LIST
    page = html.unescape(_viewer().get(LIST).content.decode())
    assert "Input excerpt" in page and "Answer excerpt" in page
    assert ">where is my order 7?<" in page  # a string input as itself, not its JSON
    assert ">order 7 shipped<" in page
    assert '{"order": 7}' in page
    assert "please really really" in page and "hurry" not in page and "…" in page


def test_search_by_id_input_and_answer():
    echo.start("where is my order 7?", run_id="s-one")
    DjangoStore().create_run(RunInfo("s-two", agent="echo", input="cancel my booking"))
    client = _viewer()
    assert _ids(client, "?q=s-tw") == ["s-two"]
    assert _ids(client, "?q=booking") == ["s-two"]
    assert _ids(client, "?q=ORDER+7") == ["s-one"]
    assert _ids(client, "?q=shipped") == ["s-one"]  # its answer
    assert _ids(client, "?q=nothing-like-it") == []


def test_date_filter():
    DjangoStore().create_run(RunInfo("d-new", agent="echo", input="x"))
    DjangoStore().create_run(RunInfo("d-old", agent="echo", input="x"))
    Run.objects.filter(run_id="d-old").update(created_at=timezone.now() - timedelta(days=40))
    client = _viewer()
    page = html.unescape(client.get(LIST).content.decode())
    assert "By created at" in page
    past_week = re.search(r'<a href="(\?created_at__gte=[^"]+)">Past 7 days</a>', page)
    assert past_week is not None, page
    assert _ids(client, past_week.group(1)) == ["d-new"]
    assert _ids(client) == ["d-new", "d-old"]


def test_the_list_reads_excerpts_not_whole_inputs():
    big = "x" * 100_000
    DjangoStore().create_run(RunInfo("big-1", agent="echo", input=big, answer=big))
    client = _viewer()
    client.get(LIST)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(LIST)
    assert response.status_code == 200
    listing = [q["sql"] for q in queries if "LEFT(" in q["sql"].upper()]
    assert listing, [q["sql"] for q in queries]
    # The whole input column is never selected on its own: only its start.
    select = listing[-1].split(" FROM ")[0]
    assert '"durable_agents_run"."input",' not in select
    assert '"durable_agents_run"."answer",' not in select
    assert len(response.content) < 50_000


def _waiting_run(run_id: str) -> None:
    from tests.support.agents import waiting

    with pytest.raises(da.InterruptPending):
        waiting.run(run_id, "ship o-7")


def test_a_run_waiting_on_the_world_says_what_for_in_one_query():
    """Issue 15: the runs list shows what each paused run waits for, read for the whole page
    in one query (the same count with one waiting run or three)."""
    _waiting_run("wf-1")
    echo.start("hello", run_id="wf-done")
    client = _viewer()
    page = html.unescape(client.get(LIST).content.decode())
    assert "Waits for" in page and "an answer to 'warehouse'" in page
    cl = client.get(LIST).context["cl"]
    assert {r.run_id: getattr(r, "waiting_for", "") for r in cl.result_list}["wf-done"] == ""
    with CaptureQueriesContext(connection) as one:
        client.get(LIST)
    _waiting_run("wf-2")
    _waiting_run("wf-3")
    with CaptureQueriesContext(connection) as three:
        page = html.unescape(client.get(LIST).content.decode())
    assert page.count("an answer to 'warehouse'") == 3
    assert len(three.captured_queries) == len(one.captured_queries)
