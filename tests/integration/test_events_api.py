"""``GET /api/agents/runs/{id}/events``: the journal as Server-Sent Events, through the
test client (WSGI and ASGI) and over real HTTP to the live server, on PostgreSQL."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import connections
from django.test import AsyncClient
from django.test.utils import override_settings

from durable_agents.api.auth import issue_api_key
from durable_agents.database.events import APPLICATION_NAME, frames
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo
from durable_agents.models import Follower
from tests.support.agents import echo
from tests.support.api import API, Caller, error, staff_with
from tests.support.people import make_user
from tests.support.sse import Stream, parse, records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def journal(run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.name) for e in DjangoStore().load(run_id)]


def read(response) -> list[dict]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    return parse(b"".join(response.streaming_content).decode())


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_finished_runs_stream_is_its_journal_then_its_status_then_end():
    echo.run("sse-1", "where is order 7?")
    caller = staff_with()
    events = read(caller.get("/runs/sse-1/events"))
    assert events[0] == {"retry": 3000}
    assert records(events) == journal("sse-1")
    assert events[-2:] == [
        {"event": "status", "data": {"status": "finished"}},
        {"event": "end", "data": {"status": "finished"}},
    ]
    first = next(e for e in events if e.get("event") == "record")["data"]
    assert first["kind"] == "header" or first["name"] == "@journal"
    start = [e["data"] for e in events if e.get("event") == "record"][1]
    assert start["kind"] == "start" and start["data"]["input"] == "where is order 7?"


def test_a_stream_lets_go_of_the_requests_kept_connection():
    """A stream reads on a connection of its own: the request's Django connection is closed
    when the stream starts, even one ``CONN_MAX_AGE`` would keep (the example site keeps
    them), instead of sitting idle for as long as the page stays open."""
    echo.run("sse-kept", "where is order 7?")
    conn = connections["default"]
    saved = conn.settings_dict["CONN_MAX_AGE"]
    conn.settings_dict["CONN_MAX_AGE"] = 600
    try:
        conn.close()
        conn.ensure_connection()  # what the view's own queries opened, kept by the setting
        assert conn.connection is not None
        stream = frames("sse-kept")
        assert next(stream) == "retry: 3000\n\n"
        assert conn.connection is None
        assert parse("".join(stream))[-1] == {"event": "end", "data": {"status": "finished"}}
    finally:
        conn.close()
        conn.settings_dict["CONN_MAX_AGE"] = saved


def test_resume_from_last_event_id_or_after_and_bad_requests():
    echo.run("sse-2", "where is order 7?")
    whole = journal("sse-2")
    caller = staff_with()
    headers = {**caller.headers, "Last-Event-ID": str(whole[2][0])}
    resumed = Caller(caller.client, headers)
    assert records(read(resumed.get("/runs/sse-2/events"))) == whole[3:]
    # The header (a reconnecting client) wins over the query it reconnects to.
    assert records(read(resumed.get("/runs/sse-2/events", after=whole[0][0]))) == whole[3:]
    assert records(read(caller.get("/runs/sse-2/events", after=whole[4][0]))) == whole[5:]
    bad = Caller(caller.client, {**caller.headers, "Last-Event-ID": "yesterday"})
    error(bad.get("/runs/sse-2/events"), 422, "request.invalid")
    error(caller.get("/runs/sse-2/events", after=-1), 422, "request.invalid")
    error(caller.get("/runs/nope/events"), 404, "run.not_found")


def test_only_staff_who_may_read_runs_get_the_stream(client):
    echo.run("sse-3", "where is order 7?")
    error(client.get(API + "/runs/sse-3/events"), 401, "auth.required")
    _, raw = issue_api_key(make_user("nobody"), "tests")
    error(client.get(API + "/runs/sse-3/events", headers={"X-API-Key": raw}), 403, "auth.forbidden")


def test_keep_alive_comments_while_nothing_happens():
    store = DjangoStore()
    store.create_run(RunInfo(run_id="sse-4", agent="echo", status=RUNNING))
    stream = frames("sse-4", idle=0.2)
    assert next(stream) == "retry: 3000\n\n"
    assert parse(next(stream)) == [{"event": "status", "data": {"status": "running"}}]
    assert next(stream) == ": keep-alive\n\n"
    store.update_run("sse-4", {"status": FINISHED})
    tail = parse("".join(stream))
    assert tail[-1] == {"event": "end", "data": {"status": "finished"}}


def test_under_asgi_the_stream_is_an_async_iterator():
    echo.run("sse-5", "where is order 7?")
    caller = staff_with()
    connections.close_all()

    async def fetch() -> tuple[int, str, str]:
        response = await AsyncClient().get(API + "/runs/sse-5/events", headers=caller.headers)
        assert response.is_async
        chunks = [c async for c in response.streaming_content]
        return response.status_code, response["Content-Type"], b"".join(chunks).decode()

    # async_to_sync, not asyncio.run: the view's sync parts then run on this thread, whose
    # database connection the test closes (asyncio.run would leave one open in an executor).
    status, content_type, text = async_to_sync(fetch)()
    assert (status, content_type) == (200, "text/event-stream")
    events = parse(text)
    assert records(events) == journal("sse-5")
    assert events[-1] == {"event": "end", "data": {"status": "finished"}}


def listeners() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [APPLICATION_NAME],
        )
        return int(cursor.fetchone()[0])


@pytest.fixture
def quick_keepalive():
    """Keep-alives every 0.3 s, so a server notices a client that left at once."""
    config = {**django_settings.DURABLE_AGENTS, "EVENTS_KEEPALIVE": 0.3}
    with override_settings(DURABLE_AGENTS=config):
        yield


def test_a_live_stream_over_http_reconnects_with_last_event_id_losing_and_repeating_nothing(
    live_server, quick_keepalive
):
    store = DjangoStore()
    store.create_run(RunInfo(run_id="sse-live", agent="echo", status=RUNNING))
    for i in range(3):
        store.insert("sse-live", f"step:{i}", '{"kind":"step"}')
    headers = staff_with().headers
    url = f"{live_server.url}{API}/runs/sse-live/events"
    first = Stream(url, headers)
    first.start()
    wait_until(lambda: len(records(first.events)) == 3)
    assert (first.status, first.content_type) == (200, "text/event-stream")
    store.insert("sse-live", "step:3", '{"kind":"step"}')
    wait_until(lambda: len(records(first.events)) == 4)  # live, no reload
    assert listeners() == 1  # the stream's own connection, registered as the run's follower
    assert list(Follower.objects.values_list("run_id", flat=True)) == ["sse-live"]
    first.drop()
    first.join(10)
    assert not first.is_alive()
    for i in range(4, 7):  # written while the client is away
        store.insert("sse-live", f"step:{i}", '{"kind":"step"}')
    last_id = records(first.events)[-1][0]
    second = Stream(url, {**headers, "Last-Event-ID": str(last_id)})
    second.start()
    wait_until(lambda: len(records(second.events)) == 3)
    store.insert("sse-live", "step:7", '{"kind":"step"}')
    store.update_run("sse-live", {"status": FINISHED})
    second.join(10)
    assert not second.is_alive() and second.error is None
    got = records(first.events) + records(second.events)
    assert got == journal("sse-live") and len(got) == 8
    assert second.events[-1] == {"event": "end", "data": {"status": "finished"}}
    # The server noticed the dropped client at its next keep-alive and let go of its
    # connection; the finished stream closed its own.
    wait_until(lambda: listeners() == 0)
    assert not Follower.objects.exists()  # each stream deleted its registration
