"""Concurrent journal writers with nobody following: what notifying costs the server.

PostgreSQL serialises the commits of notifying transactions (a cluster-wide lock held until
the commit is flushed), so writers that notify cannot share a WAL flush. Migration 0010
notifies only the runs someone follows (docs/events.md). ``--connections`` threads, each on
its own autocommit psycopg connection and its own run, insert ~1 KB records for
``--seconds`` per phase; the phases alternate for ``--rounds`` rounds:
  (raw)      a plain INSERT of the same row into a table with the same unique index;
  (before)   the journal insert with 0009's chain trigger (it notifies every record);
  (after)    the journal insert with 0010's chain trigger, nobody following;
  (followed) (after) with every run followed (a registered follower; no one LISTENs);
  (silent)   0010's chain trigger without its probe and notification: what the probe costs.
The trigger function is switched between phases (CREATE OR REPLACE) and put back at the
end. Prints the median rows/s of each; the last lines are the results (target: after/raw
>= 0.5).

    .venv/bin/python bench/notify.py [--connections 8] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import threading
import time
import uuid

import psycopg
from _setup import BENCH_DB, PG, payload, raw_connection, setup_django


def rate(statement: str, runs: list[str], data: str, seconds: float) -> float:
    """Rows per second that one connection per run commits, all at once."""
    conns = [psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG) for _ in runs]
    counts = [0] * len(runs)
    start = threading.Barrier(len(runs) + 1)
    stop = threading.Event()

    def write(k: int) -> None:
        conn, run_id = conns[k], runs[k]
        conn.execute(statement, [run_id, f"warm:{uuid.uuid4().hex}", data])
        start.wait()
        while not stop.is_set():
            conn.execute(statement, [run_id, f"r:{uuid.uuid4().hex}", data])
            counts[k] += 1

    threads = [threading.Thread(target=write, args=(k,)) for k in range(len(runs))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    for conn in conns:
        conn.close()
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup_django()

    from django.db import connection

    from durable_agents.database.store import site_store
    from durable_agents.engine.ports import RUNNING, RunInfo
    from durable_agents.models import Follower, JournalEntry

    before = importlib.import_module(
        "durable_agents.migrations.0009_journal_notify_in_chain_trigger"
    )
    after = importlib.import_module("durable_agents.migrations.0010_notify_only_followed_runs")

    def chain(module_function: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_get_serial_sequence(%s, 'seq')", [JournalEntry._meta.db_table]
            )
            sequence = cursor.fetchone()[0]
            cursor.execute(module_function.replace("{sequence}", sequence))

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]
    runs = [f"bench-nf-{tag}-{k}" for k in range(args.connections)]
    raw_runs = [f"raw-{r}" for r in runs]
    for run_id in runs:
        store.create_run(RunInfo(run_id=run_id, agent="bench", status=RUNNING))
    journal_sql = (
        f"INSERT INTO {JournalEntry._meta.db_table} (run_id, name, data) VALUES (%s, %s, %s)"
    )
    raw_sql = "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)"

    probe = after.PG_CHAIN[
        after.PG_CHAIN.index("    IF EXISTS") : after.PG_CHAIN.index("    RETURN NEW")
    ]
    silent = after.PG_CHAIN.replace(probe, "")
    series: dict[str, list[float]] = {
        "raw": [],
        "before": [],
        "after": [],
        "followed": [],
        "silent": [],
    }
    try:
        for _ in range(args.rounds):
            series["raw"].append(rate(raw_sql, raw_runs, data, args.seconds))
            chain(before.PG_FUNCTION)
            series["before"].append(rate(journal_sql, runs, data, args.seconds))
            chain(after.PG_CHAIN)
            series["after"].append(rate(journal_sql, runs, data, args.seconds))
            followers = [
                Follower.objects.create(run_id=r, expires_at="2100-01-01T00:00:00Z") for r in runs
            ]
            series["followed"].append(rate(journal_sql, runs, data, args.seconds))
            Follower.objects.filter(pk__in=[f.pk for f in followers]).delete()
            chain(silent)
            series["silent"].append(rate(journal_sql, runs, data, args.seconds))
    finally:
        chain(after.PG_CHAIN)
        Follower.objects.filter(run_id__in=runs).delete()

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = ANY(%s)", [raw_runs])
    for run_id in runs:
        store.delete_run(run_id)

    med = {k: statistics.median(v) for k, v in series.items()}
    print(f"{args.connections} connections, {args.seconds:g} s x {args.rounds} rounds per phase")
    for name, value in med.items():
        each = ", ".join(f"{v:.0f}" for v in series[name])
        print(f"({name:8s}) {value:8.0f} rows/s median  ({value / med['raw']:.2f}x raw; {each})")
    print(f"RESULT notify before={med['before']:.0f}/s ratio={med['before'] / med['raw']:.2f}")
    print(
        f"RESULT notify after={med['after']:.0f}/s ratio={med['after'] / med['raw']:.2f} target=0.5"
    )
    print(
        f"RESULT notify followed={med['followed']:.0f}/s ratio={med['followed'] / med['raw']:.2f}"
    )


if __name__ == "__main__":
    main()
