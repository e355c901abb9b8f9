"""Throughput: runs driven by real Celery worker processes, in journaled records per second,
in both durability modes in the same run.

500 runs of 10 model turns (9 of them calling a no-op read-only tool; ScriptedModel) are
started at once and driven by 2 `celery worker` processes over Redis and PostgreSQL — first
with ``durability="sync"``, then the same with ``durability="async"`` (docs/durability.md).
Records per second = journal records written / time from the first start to the last run
finished. The raw rate is one connection doing autocommit INSERTs of the same ~1 KB row,
measured right before and after each mode (their mean is that mode's yardstick: the
machine's fsync rate moves with its load). Prints the figures; one RESULT line per mode.

Each worker runs a pool of threads (``--pool threads --concurrency 4`` by default): a thread
waiting on a commit's WAL flush lets another one work, and PostgreSQL flushes the commits
that wait together at once (group commit). ``--pool solo --concurrency 1`` is one run at a
time per worker.

    .venv/bin/python bench/throughput.py [--runs 500] [--workers 2] [--pool threads]
        [--concurrency 4] [--modes sync,async]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from _setup import BENCH_DB, ROOT, payload, raw_connection, setup_django

BROKER = os.environ.get("DA_BENCH_BROKER", "redis://127.0.0.1:6379/8")
AGENTS = {"sync": "bench-steps", "async": "bench-steps-async"}


def raw_rate(seconds: float = 3.0) -> float:
    raw = raw_connection()
    data, run, n = payload(), f"raw-tp-{uuid.uuid4().hex[:8]}", 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        n += 1
        raw.execute(
            "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
            [run, f"step:{n}", data],
        )
    elapsed = time.perf_counter() - start
    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [run])
    raw.close()
    return n / elapsed


def drive_batch(agent_name: str, runs: int) -> tuple[int, float]:
    """Start ``runs`` runs at once; (journal records, seconds until the last finished)."""
    from django.db import connection

    from durable_agents.engine.agent import get_agent

    agent = get_agent(agent_name)
    tag = uuid.uuid4().hex[:8]
    ids = [f"tp-{tag}-{i}" for i in range(runs)]
    start = time.perf_counter()
    for run_id in ids:
        agent.start("go", run_id=run_id)
    deadline = time.monotonic() + 600
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FROM durable_agents_run WHERE run_id LIKE %s "
                "AND status = 'finished'",
                [f"tp-{tag}-%"],
            )
            if cursor.fetchone()[0] == runs:
                break
            if time.monotonic() > deadline:
                raise SystemExit("runs did not finish in 10 minutes")
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        cursor.execute(
            "SELECT count(*) FROM durable_agents_journalentry WHERE run_id LIKE %s",
            [f"tp-{tag}-%"],
        )
        records = cursor.fetchone()[0]
        cursor.execute("DELETE FROM durable_agents_run WHERE run_id LIKE %s", [f"tp-{tag}-%"])
    return records, elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--modes", default="sync,async")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    queue = f"da-bench-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DA_PG_NAME": BENCH_DB,
        "DA_DISPATCH": "celery",
        "DA_CELERY_QUEUE": queue,
        "DA_BROKER_URL": BROKER,
        "DA_EXTRA_AGENTS": "bench_agents.steps",
        "DA_CONN_MAX_AGE": "600",  # persistent connections, as a production worker has
        # ... which Celery's Django fixup closes around every task unless told (celery.md)
        "DA_CELERY_DB_REUSE_MAX": os.environ.get("DA_CELERY_DB_REUSE_MAX", "1000"),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'bench'}",
    }
    os.environ.update(
        {k: env[k] for k in ("DA_DISPATCH", "DA_CELERY_QUEUE", "DA_BROKER_URL", "DA_EXTRA_AGENTS")}
    )
    setup_django()

    from tests.celery_app import app

    app.conf.broker_url = BROKER

    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    workers = []
    for i in range(args.workers):
        log = (logs / f"{queue}-w{i}.log").open("wb")
        workers.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker"),
                    *("-Q", queue, "--pool", args.pool, "-c", str(args.concurrency)),
                    *("-n", f"bench{i}-{queue}@%h", "-l", "warning"),
                    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    results = []
    try:
        time.sleep(3)  # workers connect
        drive_batch(AGENTS[modes[0]], max(10, args.runs // 20))  # warm up: imports, plans
        before = raw_rate()
        for mode in modes:
            records, elapsed = drive_batch(AGENTS[mode], args.runs)
            after = raw_rate()
            results.append((mode, records, elapsed, before, after))
            before = after
    finally:
        for w in workers:
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
    load = os.getloadavg()
    print(
        f"runs                   {args.runs} x 10 turns through {args.workers} workers "
        f"({args.pool} pool, concurrency {args.concurrency}); load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"
    )
    for mode, records, elapsed, before, after in results:
        raw = (before + after) / 2
        rate = records / elapsed
        print(
            f"{mode:5}  journal records {records} in {elapsed:.1f} s; raw INSERT rate "
            f"{raw:.0f} /s (one connection; {before:.0f} before, {after:.0f} after)"
        )
    for mode, records, elapsed, before, after in results:
        rate = records / elapsed
        raw = (before + after) / 2
        print(
            f"RESULT throughput durability={mode} records_per_s={rate:.0f} "
            f"raw_per_s={raw:.0f} raw_ratio={rate / raw:.2f}"
        )


if __name__ == "__main__":
    main()
