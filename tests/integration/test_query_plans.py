"""Issue 33, a million runs: every statement the hot pages and passes send reads the runs
and journal tables through an index, sorts no large part of them and counts no more than a
capped number of their rows, so its cost does not grow with finished runs.

The pages (the admin's runs list with its default order and each filter, a deep page, the
inbox, the waiting queue, a run's page; the API's lists and a run's journal) and passes
(recovery's listing, the timer sweep) run for real with their SQL captured; then each
captured SELECT is explained (``EXPLAIN (FORMAT JSON)``, not run) with sequential scans
disabled, so a ``Seq Scan`` left in a plan means no index can serve the statement. The
table holds enough finished runs for the estimates to tell a whole-table sort or count
from one over the few runs that wait. Plans, not timings: bench/million.py times them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import durable_agents as da
from durable_agents.celery.recovery import recover
from durable_agents.database.store import DjangoStore
from durable_agents.engine import tree
from durable_agents.engine.commands.recovery import RECOVERABLE
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.models import Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import echo, gated, gated_tree, halting, waiting
from tests.support.people import make_user
from tests.support.wiring import wired

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans"),
]

BIG = ("durable_agents_run", "durable_agents_journalentry")
FINISHED = 20_000  # finished runs, 10 records each
LARGE = 1_000  # rows: a sort or count over more than this reads a large part of a table
ADMIN = "/admin/durable_agents/"
API = "/api/agents/"


@da.tool(idempotent=True)
def doze(ctx: da.ToolContext) -> str:
    """Sleep a day."""
    return ctx.sleep("later", 86_400).isoformat()


sleeper = da.Agent(
    "plans-sleeper",
    ScriptedModel([scripted.calls(scripted.call("doze", {})), scripted.text("rested")]),
    "Rest.",
    [doze],
)


@pytest.fixture
def site(settings) -> Iterator[Client]:
    """Runs that wait on each thing (an approval, a halt, a question, a timer, a tree of
    sub-runs), a finished one, and ``FINISHED`` finished runs written in one statement each
    for the rows and their journals; then ANALYZE, as autovacuum would. The store's own
    statements go through Django's cursors (not prepared), so they are captured too."""
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "PREPARED_STATEMENTS": False}
    echo.start("where is my order 7?", run_id="plan-done")
    gated.start("refund", run_id="plan-gated")
    halting.start("charge", run_id="plan-halt")
    waiting.start("ship", run_id="plan-waiting")
    gated_tree[0].start("plan", run_id="plan-tree")
    try:
        sleeper.run("plan-sleeping", "nap", store=DjangoStore())
    except da.TimerPending:
        pass
    # Recovery's and the sweep's hand-overs go nowhere: only their reads are looked at.
    with wired(dispatcher=lambda run_id: None):
        client = _fill()
        yield client


def _fill() -> Client:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, turns, "
            "attempts, created_at, updated_at, finished_at) "
            "SELECT 'old-' || g, 'agent-' || (g %% 20), 'finished', '{}', '{}', 1, 0, "
            "now() - make_interval(days => 1, secs => g), now() - make_interval(days => 1), "
            "now() - make_interval(days => 1) FROM generate_series(1, %s) g",
            [FINISHED],
        )
        # Without the chain trigger, which takes a lock per run for its transaction: the
        # shared lock table holds far fewer than 20,000 (a superuser's setting).
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "INSERT INTO durable_agents_journalentry (run_id, name, data) "
            "SELECT 'old-' || g, 'step:' || s, '{}' "
            "FROM generate_series(1, %s) g, generate_series(1, 10) s",
            [FINISHED],
        )
        cursor.execute("RESET session_replication_role")
        cursor.execute(
            "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, "
            "turns, attempts) VALUES ('plan-dead', 'echo', 'running', '{}', '{}', 0, 0)"
        )
        cursor.execute("ANALYZE durable_agents_run")
        cursor.execute("ANALYZE durable_agents_journalentry")
    client = Client()
    client.force_login(make_user("plans-admin", superuser=True))
    return client


def _selects(action: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        action()
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
    ]


def _plan(sql: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql.replace("%", "%%"))
            found = cursor.fetchone()[0]
        finally:
            cursor.execute("RESET enable_seqscan")
    plans = json.loads(found) if isinstance(found, str) else found
    return plans[0]["Plan"]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _reads_big(node: dict[str, Any]) -> bool:
    return any(n.get("Relation Name") in BIG for n in _nodes(node))


def _limited(node: dict[str, Any]) -> bool:
    """Whether a LIMIT under ``node`` bounds what it aggregates (a capped count)."""
    return any(n["Node Type"] == "Limit" for n in _nodes(node) if n is not node)


def problems(sql: str) -> list[str]:
    """What in ``sql``'s plan reads a large part of the runs or journal tables."""
    out = []
    for node in _nodes(_plan(sql)):
        kind = node["Node Type"]
        if kind == "Seq Scan" and node.get("Relation Name") in BIG:
            out.append(f"Seq Scan on {node['Relation Name']}")
        elif kind == "Sort" and node["Plan Rows"] > LARGE and _reads_big(node):
            out.append(f"Sort of ~{node['Plan Rows']} rows")
        elif (
            kind == "Aggregate"
            and _reads_big(node)
            and not _limited(node)
            and max((c["Plan Rows"] for c in node.get("Plans", ())), default=0) > LARGE
        ):
            out.append(f"Aggregate over ~{node['Plans'][0]['Plan Rows']} rows")
    return out


def assert_flat(action: Callable[[], Any]) -> int:
    statements = _selects(action)
    assert statements, "nothing captured"
    bad = {sql: found for sql in statements if (found := problems(sql))}
    assert not bad, json.dumps(bad, indent=1)
    return len(statements)


def _get(client: Client, url: str) -> Callable[[], Any]:
    def fetch() -> None:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)

    return fetch


def test_journal_run_ids_are_planned_as_many(site):
    """Migration 0016 fixes the journal's distinct run ids (ANALYZE's sample saw a few)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attoptions FROM pg_attribute WHERE attrelid = "
            "'durable_agents_journalentry'::regclass AND attname = 'run_id'"
        )
        assert "n_distinct=-0.05" in cursor.fetchone()[0]


def test_the_check_sees_what_it_forbids(site):
    """The check itself: a full count, a whole-table sort and an unindexed filter fail it."""
    assert problems("SELECT count(*) FROM durable_agents_run")
    assert problems("SELECT * FROM durable_agents_run ORDER BY updated_at LIMIT 10")
    assert problems("SELECT * FROM durable_agents_journalentry WHERE data = 'x'")
    assert not problems(
        "SELECT count(*) FROM (SELECT 1 FROM durable_agents_run "
        "ORDER BY created_at DESC, run_id DESC LIMIT 10001) t"
    )


@pytest.mark.parametrize(
    "query",
    [
        "",  # the default: agent runs, newest first
        "?kind=all",
        "?status__exact=running",
        "?status__exact=finished",
        "?agent=agent-3",
        "?tree=roots",
        "?tree=children",
        "?p=50",  # a deep page: counted up to the cap, read off the index
    ],
)
def test_admin_runs_list(site, query):
    # Not here: sorting by a column header, a sort of every run (docs/admin.md).
    assert_flat(_get(site, f"{ADMIN}run/{query}"))


def test_a_deep_page_computes_its_rows_counts_only(site):
    """The rows an OFFSET skips are bare keys: a statement with an offset and a correlated
    subquery computes the subquery for every row it skips."""
    statements = _selects(_get(site, f"{ADMIN}run/?p=50"))
    skipping = [sql for sql in statements if " OFFSET " in sql]
    assert skipping and all(sql.count("SELECT") == 1 for sql in skipping), skipping


def test_admin_runs_list_says_more_than_the_cap(site, monkeypatch):
    from durable_agents.admin import paging

    monkeypatch.setattr(paging, "CAP", 1000)
    page = site.get(f"{ADMIN}run/?kind=all").content.decode()
    assert "more than 1000 runs" in page
    assert "total)" not in page  # no whole-table count either


def test_inbox_waiting_and_run_pages(site):
    waiting_on = {r.status for r in Run.objects.filter(run_id__startswith="plan-")}
    assert {"awaiting_approval", "halted", "awaiting_input", "sleeping"} <= waiting_on
    assert Run.objects.filter(root_run_id="plan-tree").exists()
    for url in (
        f"{ADMIN}inbox/",
        f"{ADMIN}run/waiting/",
        f"{ADMIN}run/plan-done/change/",
        f"{ADMIN}run/plan-tree/change/",
        f"{ADMIN}run/{quote('plan-tree/call_1_1')}/change/",  # a sub-run
        f"{ADMIN}run/old-7/change/",
    ):
        assert_flat(_get(site, url))


def test_api_lists_and_journal(site):
    first = site.get(f"{API}runs?limit=2&count=false").json()
    assert first["count"] is None and first["next_cursor"]
    for url in (
        f"{API}runs?limit=50&count=false",
        f"{API}runs?limit=50&status=finished&count=false",
        f"{API}runs?limit=50&agent=agent-3&count=false",
        f"{API}runs?limit=50&cursor={first['next_cursor']}",
        f"{API}approvals?count=false",
        f"{API}halts?count=false",
        f"{API}runs/plan-done/journal",
        f"{API}runs/plan-done/journal?after=2&limit=10",
    ):
        assert_flat(_get(site, url))


def test_recovery_and_timer_sweep(site):
    store = DjangoStore(prepared=False)
    assert_flat(lambda: store.list_unfinished(limit=500, statuses=RECOVERABLE, lease_free=True))
    assert_flat(lambda: store.list_unfinished(limit=500, statuses=tree.PARENT_PAUSE_STATUSES))
    assert_flat(lambda: store.journal_heads(["plan-sleeping", "plan-waiting"]))
    assert_flat(lambda: wake_timers(store=store))
    assert_flat(lambda: wake_timers(store=store))  # a steady sweep
    assert_flat(recover)


def test_the_deadline_sweep_reads_only_the_requests_due(site):
    """Issue 42: the timer sweep's read of the approval requests whose deadline step is due
    goes through the partial index ``da_approval_due`` (pending rows with a step left),
    whatever the number of requests ever decided."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_agents_approvalrequest (run_id, call_id, tool_name, "
            "arguments, policy, start_seq, status, created_at, decided_at) "
            "SELECT 'old-' || g, 'c1', 'pay', '{}', '{}', 1, 'approved', "
            "now() - interval '2 days', now() - interval '1 day' "
            "FROM generate_series(1, %s) g",
            [FINISHED],
        )
        cursor.execute("ANALYZE durable_agents_approvalrequest")
    [sql] = _selects(lambda: DjangoStore().list_due_approval_requests(limit=500))
    nodes = list(_nodes(_plan(sql)))
    assert "da_approval_due" in {n.get("Index Name") for n in nodes}, sql
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")]
