"""A recovery pass costs the same with 0 and with 1,000,000 finished runs.

One pass (``durable_agents.celery.recovery.recover``) over 100 unfinished runs whose driver died
(status running, no lease), timed with 0 finished runs in the table, then again after
1,000,000 finished runs were added (one INSERT … SELECT generate_series, then VACUUM ANALYZE).
The pass hands each run to a collecting dispatcher, so what is measured is the database
side: listing unfinished, lease-free runs through the partial index. Prints medians and
the ratio (with / without); the last line is the result. Target: <= 1.2.

``--leased``: each unfinished run also holds an unexpired lease whose holder died (no
liveness lock held: PostgreSQL's instant takeover), so the pass finds them through the
``pg_locks`` probe instead of by expiry.

    .venv/bin/python bench/recovery.py [--finished 1000000] [--rounds 30] [--leased]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from _setup import raw_connection, setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--unfinished", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--leased", action="store_true", help="unexpired leases whose holders died")
    args = parser.parse_args()
    setup_django()

    from durable_agents.celery.recovery import recover
    from durable_agents.engine import runtime

    raw = raw_connection()
    tag = uuid.uuid4().hex[:8]
    raw.execute("DELETE FROM durable_agents_lease")
    raw.execute("DELETE FROM durable_agents_run WHERE run_id LIKE 'bench-rec-%%'")
    raw.execute(
        "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, turns, "
        "attempts, created_at, updated_at) "
        "SELECT 'bench-rec-open-' || %s || '-' || g, 'bench', 'running', '{}', '{}', 0, 0, "
        "now(), now() FROM generate_series(1, %s) g",
        [tag, args.unfinished],
    )
    if args.leased:
        raw.execute(
            "INSERT INTO durable_agents_lease (run_id, holder, token, expires_at, renewed_at) "
            "SELECT run_id, 'dead', md5(run_id), now() + interval '1 day', now() "
            "FROM durable_agents_run WHERE run_id LIKE 'bench-rec-open-%%'"
        )
    raw.execute("VACUUM ANALYZE durable_agents_run")
    sent: list[str] = []
    runtime.configure(dispatcher=sent.append)

    def one_pass() -> float:
        sent.clear()
        # Every pass finds the runs' drivers freshly dead: a run handed over several times
        # in a row backs off, and one handed over less than an interval ago waits, which is
        # not what this measures.
        raw.execute(
            "UPDATE durable_agents_run SET attempts = 0, last_error = NULL, dispatched_at = NULL "
            "WHERE run_id LIKE 'bench-rec-open-%%'"
        )
        start = time.perf_counter()
        recover()
        elapsed = time.perf_counter() - start
        assert len(sent) == args.unfinished, len(sent)
        return elapsed

    from durable_agents.database.store import DjangoStore
    from durable_agents.engine.commands.recovery import RECOVERABLE

    store = DjangoStore()

    def listing() -> float:
        # The pass's one query, alone: the part that could grow with finished runs (the
        # rest is one conditional update and one stamp per run handed over, commits whose
        # cost follows the disk, not the table).
        start = time.perf_counter()
        found = store.list_unfinished(limit=500, statuses=RECOVERABLE, lease_free=True)
        elapsed = time.perf_counter() - start
        assert len(found) == args.unfinished, len(found)
        return elapsed

    for _ in range(5):
        one_pass()
    empty = statistics.median(one_pass() for _ in range(args.rounds))
    empty_list = statistics.median(listing() for _ in range(args.rounds * 5))

    start = time.perf_counter()
    raw.execute(
        "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, turns, "
        "attempts, created_at, updated_at, finished_at) "
        "SELECT 'bench-rec-done-' || %s || '-' || g, 'bench', 'finished', '{}', '{}', 3, 0, "
        "now(), now(), now() FROM generate_series(1, %s) g",
        [tag, args.finished],
    )
    # VACUUM now, as autovacuum would soon: otherwise it runs during the measurement, on
    # the same two cores, and times the vacuum rather than the pass.
    raw.execute("VACUUM ANALYZE durable_agents_run")
    loaded = time.perf_counter() - start
    for _ in range(5):
        one_pass()
    full = statistics.median(one_pass() for _ in range(args.rounds))
    full_list = statistics.median(listing() for _ in range(args.rounds * 5))

    raw.execute("DELETE FROM durable_agents_lease")
    raw.execute("DELETE FROM durable_agents_run WHERE run_id LIKE 'bench-rec-%%'")
    ratio = full / empty
    leases = "unexpired lease, holder dead" if args.leased else "no lease"
    print(f"unfinished runs        {args.unfinished} (running, {leases})")
    print(f"pass, 0 finished       {empty * 1e3:8.2f} ms median of {args.rounds}")
    print(
        f"pass, {args.finished:,} finished {full * 1e3:8.2f} ms median  (loaded in {loaded:.1f} s)"
    )
    print(
        f"listing query          {empty_list * 1e3:8.3f} ms -> {full_list * 1e3:.3f} ms "
        f"(ratio {full_list / empty_list:.2f})"
    )
    print(f"RESULT recovery-listing ratio={full_list / empty_list:.2f} target=1.2")
    print(f"RESULT recovery ratio={ratio:.2f} target=1.2")


if __name__ == "__main__":
    main()
