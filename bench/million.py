"""The hot pages and passes with 1,000,000 runs and 50,000,000 journal records, against the
same with 1,000 runs: an operator's pages (the admin's runs list, filtered by status and
by agent, its tenth page, the inbox, the waiting queue, a run's page; the API's runs list,
a deep cursor page, a run's journal) and beat's passes (recovery's listing, a steady timer
sweep).

Two databases, each migrated and loaded once: ``<DA_BENCH_DB>`` (default
``durable_agents_bench_million``: ``--runs`` finished runs) and ``<DA_BENCH_DB>_small``
(``--small`` finished runs). Both hold the same live set, made through the engine: 100
sleeping runs (the sweep's work), 20 calls awaiting approval and 20 questions (the
inbox), 100 running runs whose driver died (recovery's), and one finished run of the
template's records (the run page). The finished runs are written server-side (``INSERT …
SELECT generate_series``), each with a copy of the template run's journal (about 50
records), the chain trigger off for the load, then ``VACUUM ANALYZE``. ``--reuse`` keeps a
database loaded with the same sizes (a re-run skips the load).

Each round times every query on both databases (which one goes first alternates), each
sample right after a raw psycopg autocommit ``INSERT`` of a ~1 KB row into the same
database. Printed: medians per database, the big/small ratio (median of the per-round
ratios) and the big median in raw INSERTs; one ``RESULT`` line per query (target: flat,
big/small <= 1.2). ``old:`` lines time what the lists did before issue 33 (a full count,
``SELECT DISTINCT agent``), reported only.

    .venv/bin/python bench/million.py [--runs 1000000] [--small 1000] [--rounds 10] [--reuse]
"""

# No ``from __future__ import annotations``: the tools below are defined inside functions
# (after Django is set up), and a tool's parameter types are read when it is defined.
import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DA_BENCH_DB", "durable_agents_bench_million")

import psycopg
from _setup import BENCH_DB, PG, RAW_TABLE, payload, setup_django

SMALL_DB = f"{BENCH_DB}_small"
LIVE = {"sleeping": 100, "approvals": 20, "questions": 20, "dead": 100}
TEMPLATE = "tmpl-done"  # the finished run whose records every bulk run copies
CHUNK = 20_000  # bulk runs whose journals one INSERT writes (~1M rows)


def create_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True, **PG) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def use(name: str) -> None:
    """Point Django's default connection at database ``name``."""
    from django.db import connections

    from durable_agents.database import liveness

    liveness.close_all()
    connections.close_all()
    connections["default"].settings_dict["NAME"] = name


def loaded(conn: psycopg.Connection) -> tuple[int, int] | None:
    conn.execute("CREATE TABLE IF NOT EXISTS bench_million_meta (runs bigint, records bigint)")
    row = conn.execute("SELECT runs, records FROM bench_million_meta").fetchone()
    return (int(row[0]), int(row[1])) if row else None


def make_live_set() -> None:
    """The runs that wait on something, and the template run, through the engine."""
    import durable_agents as da
    from durable_agents.database.store import site_store
    from durable_agents.engine import runtime
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    @da.tool(read_only=True)
    def look(n: int) -> dict:
        """Look something up."""
        return {"n": n, "found": f"item {n}"}

    @da.tool(idempotent=True)
    def nap(ctx: da.ToolContext) -> str:
        """Sleep a day."""
        return ctx.sleep("later", 86_400).isoformat()

    @da.tool(idempotent=True)
    def ask(ctx: da.ToolContext) -> str:
        """Ask a person."""
        return str(ctx.interrupt("which", "Which warehouse ships it?"))

    @da.tool(requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount}"

    def agent(name: str, last: Any, turns: int = 3) -> da.Agent:
        script: list[Any] = [scripted.calls(scripted.call("look", {"n": i})) for i in range(turns)]
        script += [scripted.calls(last), scripted.text("done")] if last else [scripted.text("ok")]
        return da.Agent(
            name, ScriptedModel(script), "You help.", [look, nap, ask, refund], max_turns=40
        )

    store = site_store()
    runtime.configure(dispatcher=lambda run_id: None)
    agent("bench-template", None, turns=24).run(TEMPLATE, "Find the order.", store=store)
    kinds = {
        "sleeping": (scripted.call("nap", {}), da.TimerPending),
        "approvals": (scripted.call("refund", {"amount": 5}), da.ApprovalPending),
        "questions": (scripted.call("ask", {}), da.InterruptPending),
    }
    for kind, (call, pending) in kinds.items():
        each = agent(f"bench-{kind}", call)
        for i in range(LIVE[kind]):
            try:
                each.run(f"live-{kind}-{i}", "Go.", store=store)
            except pending:
                pass


def load(dbname: str, runs: int, reuse: bool) -> tuple[int, int]:
    """Migrate ``dbname``, and fill it unless it holds these sizes already."""
    from django.core.management import call_command

    create_database(dbname)
    use(dbname)
    call_command("migrate", verbosity=0, interactive=False)
    conn = psycopg.connect(dbname=dbname, autocommit=True, **PG)
    conn.execute(RAW_TABLE)
    have = loaded(conn)
    if reuse and have is not None and have[0] == runs:
        print(f"{dbname}: reused ({have[0]:,} runs, {have[1]:,} records)")
        return have
    start = time.perf_counter()
    for table in ("journalentry", "lease", "approvalrequest", "decision", "halt", "run"):
        conn.execute(f"TRUNCATE durable_agents_{table} CASCADE")
    conn.execute("TRUNCATE bench_million_meta")
    make_live_set()
    use(dbname)
    conn.execute(
        "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, turns, "
        "attempts, created_at, updated_at) "
        "SELECT 'live-dead-' || g, 'bench-dead', 'running', '{}', '{}', 1, 0, now(), now() "
        "FROM generate_series(1, %s) g",
        [LIVE["dead"]],
    )
    template = conn.execute(
        "SELECT count(*) FROM durable_agents_journalentry WHERE run_id = %s", [TEMPLATE]
    ).fetchone()
    per_run = int(template[0]) if template else 0
    # Finished runs, oldest first, a second apart; 20 agents. The live set is newer.
    conn.execute(
        "INSERT INTO durable_agents_run (run_id, agent, status, input, answer, usage, spend, "
        "turns, attempts, created_at, updated_at, finished_at) "
        "SELECT 'done-' || lpad(g::text, 8, '0'), 'bench-agent-' || (g %% 20), 'finished', "
        "'\"Find the order.\"', 'done', '{}', '{}', 25, 0, "
        "now() - make_interval(secs => %s::int - g + 60), "
        "now() - make_interval(secs => %s::int - g + 60), "
        "now() - make_interval(secs => %s::int - g + 60) "
        "FROM generate_series(1, %s::int) g",
        [runs, runs, runs, runs],
    )
    for lo in range(1, runs + 1, CHUNK):
        hi = min(runs, lo + CHUNK - 1)
        with conn.transaction():
            # Journals written as an import writes them, without the chain trigger (a
            # superuser's setting): the template's hashes are copied, not recomputed.
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute("SET LOCAL synchronous_commit = off")
            conn.execute(
                "INSERT INTO durable_agents_journalentry (run_id, name, data, created_at, hash) "
                "SELECT 'done-' || lpad(g::text, 8, '0'), t.name, t.data, "
                "now() - make_interval(secs => %s::int - g + 60), t.hash "
                "FROM generate_series(%s::int, %s::int) g, "
                "(SELECT name, data, hash FROM durable_agents_journalentry WHERE run_id = %s) t "
                "ORDER BY g",
                [runs, lo, hi, TEMPLATE],
            )
        if (hi // CHUNK) % 10 == 0 or hi == runs:
            print(
                f"  {dbname}: {hi:,} runs' journals written ({time.perf_counter() - start:.0f} s)"
            )
    conn.execute("VACUUM ANALYZE durable_agents_run")
    conn.execute("VACUUM ANALYZE durable_agents_journalentry")
    records = int(
        conn.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'durable_agents_journalentry'"
        ).fetchone()[0]  # type: ignore[index]
    )
    conn.execute("INSERT INTO bench_million_meta VALUES (%s, %s)", [runs, records])
    print(
        f"{dbname}: loaded {runs:,} finished runs ({per_run} records each), ~{records:,} "
        f"records in {time.perf_counter() - start:.0f} s"
    )
    return runs, records


class Site:
    """One database, with what the measurements need there."""

    def __init__(self, dbname: str) -> None:
        from django.contrib.auth import get_user_model
        from django.test import Client

        from durable_agents.database.store import DjangoStore

        self.dbname = dbname
        use(dbname)
        user, _ = get_user_model().objects.get_or_create(
            username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
        )
        self.client = Client()
        self.client.force_login(user)
        self.store = DjangoStore()  # its own: the sweep remembers runs per store
        self.raw = psycopg.connect(dbname=dbname, autocommit=True, **PG)
        self.data = payload()
        total = self.raw.execute("SELECT count(*) FROM durable_agents_run").fetchone()
        # A cursor 90% of the way down the runs list: a deep page.
        deep = self.raw.execute(
            "SELECT created_at, run_id FROM durable_agents_run "
            "ORDER BY created_at DESC, run_id DESC OFFSET %s LIMIT 1",
            [int(int(total[0]) * 0.9) if total else 0],
        ).fetchone()
        import base64
        import json

        text = json.dumps(["runs", deep[0].isoformat(), deep[1]], separators=(",", ":"))  # type: ignore[index]
        self.deep_cursor = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    def raw_insert(self) -> float:
        start = time.perf_counter()
        self.raw.execute(
            "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
            ["raw", uuid.uuid4().hex, self.data],
        )
        return time.perf_counter() - start


def queries(site: Site) -> dict[str, Callable[[], Any]]:
    from django.db.models import Count

    from durable_agents.engine import tree
    from durable_agents.engine.commands.recovery import RECOVERABLE
    from durable_agents.engine.commands.timers import wake_timers
    from durable_agents.models import Run

    def get(url: str, status: int = 200) -> Callable[[], Any]:
        def fetch() -> Any:
            response = site.client.get(url)
            assert response.status_code == status, (url, response.status_code)
            return response

        return fetch

    def recovery_listing() -> Any:
        found = site.store.list_unfinished(limit=500, statuses=RECOVERABLE, lease_free=True)
        assert len(found) >= LIVE["dead"], len(found)

    def sweep() -> Any:
        return wake_timers(store=site.store)

    def paused_listing() -> Any:
        return site.store.list_unfinished(limit=500, statuses=tree.PARENT_PAUSE_STATUSES)

    admin = "/admin/durable_agents/"
    api = "/api/agents/"
    return {
        "admin-runs-list": get(f"{admin}run/"),
        "admin-runs-by-status": get(f"{admin}run/?status__exact=running"),
        "admin-runs-by-agent": get(f"{admin}run/?agent=bench-sleeping"),
        "admin-runs-page-10": get(f"{admin}run/?p=10"),
        "admin-inbox": get(f"{admin}inbox/"),
        "admin-waiting": get(f"{admin}run/waiting/"),
        "admin-run-page": get(f"{admin}run/{TEMPLATE}/change/"),
        "api-runs-list-nocount": get(f"{api}runs?limit=50&count=false"),
        "api-runs-deep-cursor": get(f"{api}runs?limit=50&cursor={site.deep_cursor}"),
        "api-run-journal": get(f"{api}runs/{TEMPLATE}/journal"),
        "recovery-listing": recovery_listing,
        "sweep-listing": paused_listing,
        "sweep-steady": sweep,
        # What the lists did before, reported only: not flat by construction.
        "old:full-count": lambda: Run.objects.count(),
        "old:distinct-agents": lambda: list(
            Run.objects.order_by("agent").values_list("agent", flat=True).distinct()
        ),
        "old:api-runs-list-count": get(f"{api}runs?limit=50"),
        "old:count-by-status": lambda: list(
            Run.objects.values("status").annotate(n=Count("pk")).order_by()
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=3, help="per query per round")
    parser.add_argument("--reuse", action="store_true", help="keep loaded databases")
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    sizes = {
        "small": load(SMALL_DB, args.small, args.reuse),
        "big": load(BENCH_DB, args.runs, args.reuse),
    }
    sites = {"small": Site(SMALL_DB), "big": Site(BENCH_DB)}
    calls = {name: queries(site) for name, site in sites.items()}
    names = list(calls["big"])
    times: dict[str, dict[str, list[float]]] = {k: {n: [] for n in names} for k in sites}
    raws: dict[str, list[float]] = {k: [] for k in sites}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for which in sites:  # warm each database's caches and the sweep's memory
        use(sites[which].dbname)
        for fn in calls[which].values():
            fn()
    for round_ in range(args.rounds):
        order = ["small", "big"] if round_ % 2 == 0 else ["big", "small"]
        medians: dict[str, dict[str, float]] = {}
        for which in order:
            site = sites[which]
            use(site.dbname)
            calls[which]["admin-runs-list"]()  # the new connection's first statements
            medians[which] = {}
            for name in names:
                samples = []
                for _ in range(args.samples):
                    raws[which].append(site.raw_insert())
                    start = time.perf_counter()
                    calls[which][name]()
                    samples.append(time.perf_counter() - start)
                times[which][name] += samples
                medians[which][name] = statistics.median(samples)
        for name in names:
            ratios[name].append(medians["big"][name] / medians["small"][name])
    raw_big = statistics.median(raws["big"])
    raw_small = statistics.median(raws["small"])
    (small_runs, small_records), (big_runs, big_records) = sizes["small"], sizes["big"]
    print(
        f"small: {small_runs:,} finished runs, ~{small_records:,} records; "
        f"big: {big_runs:,} finished runs, ~{big_records:,} records; live set {LIVE}"
    )
    print(
        f"raw INSERT median: small {raw_small * 1e3:.3f} ms, big {raw_big * 1e3:.3f} ms; "
        f"{args.rounds} rounds x {args.samples} samples"
    )
    print(f"{'query':28} {'small ms':>9} {'big ms':>9} {'big/small':>9} {'big/raw':>8}")
    results = []
    for name in names:
        small_ms = statistics.median(times["small"][name]) * 1e3
        big_ms = statistics.median(times["big"][name]) * 1e3
        ratio = statistics.median(ratios[name])
        print(
            f"{name:28} {small_ms:9.2f} {big_ms:9.2f} {ratio:9.2f} {big_ms / (raw_big * 1e3):8.1f}"
        )
        if not name.startswith("old:"):
            results.append(f"RESULT million-{name} ratio={ratio:.2f} target=1.2")
    for line in results:
        print(line)


if __name__ == "__main__":
    main()
