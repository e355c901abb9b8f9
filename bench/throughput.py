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

Many workers (issue 33): the rate is also set against ``--raw-connections`` connections
(default: workers x concurrency, as many as drive runs) each doing the same raw INSERTs in
parallel, measured right before and after each mode as the one-connection rate is. Runs per
second are printed beside records per second, and where the time went: the CPU the worker
processes and this database's server backends used (in cores), the machine's CPU busy share,
WAL flushes per second and records per flush (``pg_stat_wal``, server-wide), and what the
database's workers' backends were doing, sampled every 20 ms (``pg_stat_activity``: idle
between statements, the worker's turn; ``CPU`` when running; else the wait event:
``IO:WALSync`` a commit's flush, ``LWLock:WALWrite`` waiting for another's flush,
``Lock:*`` a row or advisory lock, ``Client:ClientRead`` in a transaction while the
worker computes).

    .venv/bin/python bench/throughput.py [--runs 500] [--workers 2] [--pool threads]
        [--concurrency 4] [--modes sync,async] [--raw-connections N]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from _setup import BENCH_DB, PG, ROOT, payload, raw_connection, setup_django

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


def parallel_raw_rate(connections: int, seconds: float = 3.0) -> float:
    """``connections`` connections, each doing autocommit INSERTs of the ~1 KB row on its
    own run id, at once: rows per second over all of them."""
    raw_connection().close()  # the table exists
    data, tag = payload(), uuid.uuid4().hex[:8]
    counts = [0] * connections
    start_line = threading.Barrier(connections + 1)

    def insert(i: int) -> None:
        with psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG) as conn:
            start_line.wait()
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                counts[i] += 1
                conn.execute(
                    "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                    [f"raw-par-{tag}-{i}", f"step:{counts[i]}", data],
                )

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    start_line.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    with psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG) as conn:
        conn.execute("DELETE FROM bench_raw_journal WHERE run_id LIKE %s", [f"raw-par-{tag}-%"])
    return sum(counts) / elapsed


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class Watch:
    """Where a phase's time went: CPU of the workers and of the database's backends, the
    machine's busy share, WAL flushes, and what the active backends waited on."""

    worker_pids: list[int]
    exclude: list[int]  # this process's own connections (its polling, this watch)
    waits: collections.Counter = field(default_factory=collections.Counter)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self.conn = psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG)
        self.exclude = [*self.exclude, self.conn.info.backend_pid]
        self.backends = self._backends()
        self.cpu0 = {p: _cpu_seconds(p) for p in self.worker_pids + self.backends}
        self.busy0 = _machine_busy()
        self.wal0 = self._wal()
        self.t0 = time.perf_counter()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        return self

    def _backends(self) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND NOT pid = ANY(%s)",
            [BENCH_DB, self.exclude],
        ).fetchall()
        return [int(r[0]) for r in rows]

    def _wal(self) -> int:
        row = self.conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
        return int(row[0]) if row else 0

    def _sample(self) -> None:
        with psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG) as conn:
            while not self._stop.wait(0.02):
                for state, kind, event in conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend' "
                    "AND NOT pid = ANY(%s)",
                    [BENCH_DB, [*self.exclude, conn.info.backend_pid]],
                ).fetchall():
                    if state == "idle":  # between statements: the worker's turn
                        self.waits["idle (worker's turn)"] += 1
                    else:
                        self.waits[f"{kind}:{event}" if kind else "CPU"] += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.sampler.join()
        self.elapsed = time.perf_counter() - self.t0
        busy1 = _machine_busy()
        self.machine = (busy1[0] - self.busy0[0]) / max(1, busy1[1] - self.busy0[1])
        self.wal_syncs = self._wal() - self.wal0
        # Backends that connected during the phase are counted from zero.
        backends = set(self.backends) | set(self._backends())
        used = {p: _cpu_seconds(p) - self.cpu0.get(p, 0.0) for p in self.worker_pids}
        self.worker_cpu = sum(used.values()) / self.elapsed
        self.server_cpu = (
            sum(_cpu_seconds(p) - self.cpu0.get(p, 0.0) for p in backends) / self.elapsed
        )
        self.conn.close()

    def report(self, records: int) -> str:
        total = sum(self.waits.values()) or 1
        top = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in self.waits.most_common(6))
        per_flush = records / self.wal_syncs if self.wal_syncs else float("nan")
        return (
            f"       CPU: workers {self.worker_cpu:.2f} cores, this database's backends "
            f"{self.server_cpu:.2f} cores, machine {100 * self.machine:.0f}% busy of "
            f"{os.cpu_count()} CPUs\n"
            f"       WAL flushes {self.wal_syncs / self.elapsed:.0f}/s server-wide, "
            f"{per_flush:.1f} records per flush\n"
            f"       the workers' backends: {top}"
        )


def own_backend() -> int:
    """The server pid of this process's Django connection (it polls for finished runs)."""
    from django.db import connection

    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


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
    parser.add_argument(
        "--raw-connections",
        type=int,
        default=0,
        help="connections of the parallel raw INSERT rate (default: workers x concurrency)",
    )
    args = parser.parse_args()
    parallel = args.raw_connections or args.workers * args.concurrency
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
    watched: list[tuple[str, int, float, float, float, Watch]] = []
    try:
        time.sleep(3)  # workers connect
        drive_batch(AGENTS[modes[0]], max(10, args.runs // 20))  # warm up: imports, plans
        before = raw_rate()
        before_par = parallel_raw_rate(parallel)
        for mode in modes:
            with Watch([w.pid for w in workers], [own_backend()]) as watch:
                records, elapsed = drive_batch(AGENTS[mode], args.runs)
            after = raw_rate()
            after_par = parallel_raw_rate(parallel)
            results.append((mode, records, elapsed, before, after))
            watched.append((mode, records, elapsed, before_par, after_par, watch))
            before, before_par = after, after_par
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
    for mode, records, elapsed, before_par, after_par, watch in watched:
        par = (before_par + after_par) / 2
        print(
            f"{mode:5}  {args.runs / elapsed:.1f} runs/s, {records / elapsed:.0f} records/s; "
            f"{parallel} connections' raw INSERT rate {par:.0f} /s "
            f"({before_par:.0f} before, {after_par:.0f} after)\n{watch.report(records)}"
        )
    for mode, records, elapsed, before, after in results:
        rate = records / elapsed
        raw = (before + after) / 2
        print(
            f"RESULT throughput durability={mode} records_per_s={rate:.0f} "
            f"raw_per_s={raw:.0f} raw_ratio={rate / raw:.2f}"
        )
    for mode, records, elapsed, before_par, after_par, _ in watched:
        rate, par = records / elapsed, (before_par + after_par) / 2
        print(
            f"RESULT workers={args.workers}x{args.concurrency} durability={mode} "
            f"runs_per_s={args.runs / elapsed:.1f} records_per_s={rate:.0f} "
            f"raw{parallel}_per_s={par:.0f} raw{parallel}_ratio={rate / par:.2f}"
        )


if __name__ == "__main__":
    main()
