"""Limits in the API and the admin: each declared limit with its slots in use and the runs
waiting on it, read in a constant number of queries; the throttled runs list; the
``MODEL_RATES`` setting checked at startup."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RUNNING, THROTTLED, RunInfo, ThrottleInfo
from tests.support.admin_pages import client_for, text_of
from tests.support.api import error, staff_with, with_key
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("site_urls")]


def _throttled(store: DjangoStore, n: int, key: str = "agent/limit-runs") -> list[str]:
    now = store.now()
    ids = []
    for i in range(n):
        run_id = f"lv-{key.replace('/', '-')}-{i}"
        store.create_run(RunInfo(run_id, agent="limit-runs", status=THROTTLED))
        store.throttle(
            ThrottleInfo(
                run_id,
                "limit-runs",
                key,
                "slots",
                "2 at once",
                now + timedelta(seconds=5 + i),
                now - timedelta(seconds=60 - i),
            )
        )
        ids.append(run_id)
    return ids


def _holding(store: DjangoStore, key: str, n: int) -> None:
    for i in range(n):
        run_id = f"lv-hold-{i}"
        store.create_run(RunInfo(run_id, agent="limit-runs", status=RUNNING))
        assert store.acquire_lease(run_id, "w", f"tok-lv-{i}", 30)
        assert store.claim_slot(key, run_id, run_id, f"tok-lv-{i}", 2)


def test_the_api_shows_each_limit_its_slots_and_its_queue():
    store = DjangoStore()
    _throttled(store, 3)
    _holding(store, "agent/limit-runs", 2)
    caller = staff_with()
    with CaptureQueriesContext(connection) as few:
        body = caller.get("/limits").json()
    by_key = {item["key"]: item for item in body["items"]}
    runs = by_key["agent/limit-runs"]
    assert (runs["kind"], runs["name"], runs["limit"]) == ("agent", "limit-runs", "2 at once")
    assert (runs["in_use"], runs["waiting"]) == (2, 3)
    assert runs["oldest_since"] < runs["next_retry_at"]
    assert by_key["tool/one_at_a_time"]["limit"] == "1 at once"
    assert by_key["tool/one_at_a_time"]["in_use"] == 0
    # A few queries, whatever the number waiting: two more runs cost none.
    _throttled(store, 2, key="agent/limit-runs-2")
    with CaptureQueriesContext(connection) as more:
        caller.get("/limits")
    assert len(more) == len(few)


def test_an_mcp_servers_limits_are_listed_without_starting_it(settings):
    """The limits an MCP server's tools have are the site's (``ToolOptions``): the page and
    the API list them from there, never starting the server in the web process, and a
    server that is down leaves the page whole."""
    from tests.support.mcp_down_agents import down

    agents = [*settings.DURABLE_AGENTS["AGENTS"], "tests.support.mcp_down_agents"]
    with override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "AGENTS": agents}):
        body = staff_with().get("/limits").json()
        by_key = {item["key"]: item for item in body["items"]}
        assert by_key["tool/crm-down__refund"]["limit"] == "2 at once, 5/m"
        assert by_key["tool/send_mail"]["limit"] == "1 at once"
        assert "tool/crm-down__lookup" not in by_key
        assert by_key["tool/one_at_a_time"]["limit"] == "1 at once"  # the others still there
        viewer = make_user("lv-mcp-viewer", "durable_agents.view_run")
        page = client_for(viewer).get(reverse("admin:durable_agents_throttle_changelist"))
        assert page.status_code == 200
        assert "crm-down__refund" in text_of(page) and "2 at once, 5/m" in text_of(page)
    assert down._connection is None  # nothing tried to start it


def test_the_api_asks_for_the_right_to_read_runs():
    outsider = with_key(make_user("lv-outsider"))
    error(outsider.get("/limits"), 403, "auth.forbidden")


def test_the_admin_lists_throttled_runs_under_the_limits():
    store = DjangoStore()
    waiting = _throttled(store, 2)
    store.create_run(RunInfo("lv-old", agent="limit-runs", status=RUNNING))
    store.throttle(
        ThrottleInfo(
            "lv-old",
            "limit-runs",
            "agent/limit-runs",
            "slots",
            "2 at once",
            store.now(),
            store.now(),
        )
    )  # an old wait: the run goes on now
    viewer = make_user("lv-viewer", "durable_agents.view_run")
    page = client_for(viewer).get(reverse("admin:durable_agents_throttle_changelist"))
    assert page.status_code == 200
    text = text_of(page)
    assert "Limits" in text and "limit-runs" in text and "2 at once" in text
    assert all(run_id in text for run_id in waiting)
    assert "lv-old" not in text


@pytest.mark.parametrize(
    ("rates", "says"),
    [
        ("500/m", "must be a dict"),
        ({"openai": "fast"}, "not a rate"),
        ({"": "1/s"}, "use a provider or a model id"),
    ],
)
def test_a_bad_model_rate_stops_the_site_with_a_hint(settings, rates, says):
    with override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "MODEL_RATES": rates}):
        errors = [m for m in run_checks() if m.id == "durable_agents.E001"]
    assert errors and says in errors[0].msg


def test_the_runs_list_says_what_a_throttled_run_waits_for_and_till_when():
    store = DjangoStore()
    [run_id] = _throttled(store, 1)
    viewer = make_user("lv-runs", "durable_agents.view_run")
    page = client_for(viewer).get(reverse("admin:durable_agents_run_changelist"))
    text = text_of(page)
    assert run_id in text and "throttled" in text
    assert "agent/limit-runs (2 at once), tries again at" in text


def test_a_throttled_runs_waits_say_what_it_waits_for():
    store = DjangoStore()
    [run_id] = _throttled(store, 1)
    body = staff_with().get(f"/runs/{run_id}/waits").json()
    assert body["status"] == "throttled"
    [wait] = body["waits"]
    assert (wait["kind"], wait["name"], wait["prompt"]) == (
        "throttle",
        "agent/limit-runs",
        "2 at once",
    )
    assert wait["deadline"] is not None
