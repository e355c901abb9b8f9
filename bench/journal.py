"""Journal write cost against a raw PostgreSQL insert, measured side by side.

Per step, interleaved in one run on the local PostgreSQL:
  (a) raw psycopg autocommit INSERT of the same row (run_id, name, ~1 KB JSON) into a table
      with the same unique index;
  (b) DjangoStore fenced insert-if-absent (the journal's hot path);
  (c) a memo hit: Journal.do on a recorded step (one read, fn not called);
  (d) the fenced insert of (b) with the audit chain's trigger disabled (docs/audit.md): the
      same statement, probing for followers and notifying a followed run itself as the
      trigger does for (b) (nobody follows the bench's run).
(b) and (d) alternate in blocks of 20 steps (the trigger is switched with ALTER TABLE
between blocks, and the first step after a switch is not timed). Prints medians, the ratio
(b)/(a) and the chain's overhead (b)/(d) - 1; the last lines are the results. Targets:
(b)/(a) <= 1.3, chain overhead <= 5%.

    .venv/bin/python bench/journal.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import uuid

from _setup import median_us, payload, raw_connection, setup_django, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    setup_django()

    from django.db import connection

    from durable_agents.engine.journal import Journal
    from durable_agents.engine.ports import RunInfo
    from durable_agents.models import JournalEntry
    from durable_agents.storage import site_store

    def chain(on: bool) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {JournalEntry._meta.db_table} "
                f"{'ENABLE' if on else 'DISABLE'} TRIGGER durable_agents_journal_chain"
            )

    store = site_store()
    journal = Journal(store)
    raw = raw_connection()
    data = payload()
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    raw_run = f"raw-{run_id}"
    store.create_run(RunInfo(run_id=run_id, agent="bench"))
    token = uuid.uuid4().hex
    assert store.acquire_lease(run_id, "bench", token, 600)
    journal.write(run_id, "warm", {"kind": "value"}, fence=token)

    def raw_insert(i: int) -> None:
        raw.execute(
            "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
            [raw_run, f"step:{i}", data],
        )

    def fenced_insert(i: int) -> None:
        store.insert(run_id, f"step:{i}", data, fence=token)

    # (d)'s statement: DjangoStore's fenced insert, notifying a followed run in its
    # RETURNING clause (the trigger that is off for (d) both chains and notifies).
    unchained_sql = (
        f"INSERT INTO {JournalEntry._meta.db_table} (run_id, name, data, created_at) "
        "SELECT %s, %s, %s, now() WHERE EXISTS (SELECT 1 FROM durable_agents_lease "
        "WHERE run_id = %s AND token = %s AND expires_at > now() FOR SHARE) "
        "ON CONFLICT (run_id, name) DO NOTHING "
        "RETURNING seq, created_at, CASE WHEN EXISTS (SELECT 1 FROM durable_agents_follower f "
        f"WHERE f.run_id = {JournalEntry._meta.db_table}.run_id AND f.expires_at > now()) "
        "THEN pg_notify('da_run_' || md5(run_id), seq || ' ' || run_id) END"
    )

    def unchained_insert(i: int) -> None:
        row = store._execute(unchained_sql, [run_id, f"step:{i}", data, run_id, token], "one")
        assert row is not None

    def memo_hit(i: int) -> None:
        journal.do(run_id, f"step:{i}", lambda: {"kind": "never-called"})

    for i in range(200):  # warm-up: connections, plans, caches
        raw_insert(-1 - i)
        fenced_insert(-1 - i)
        memo_hit(-1 - i)

    a: list[float] = []
    b: list[float] = []
    c: list[float] = []
    d: list[float] = []
    block = 20
    try:
        for start in range(0, args.steps, block):
            for on, series in ((True, b), (False, d)):
                chain(on)
                insert = fenced_insert if on else unchained_insert
                insert(-10_000 - start * 2 - on)  # re-plans after the switch: untimed
                for i in range(start, min(start + block, args.steps)):
                    step = i if on else args.steps + i
                    a.append(timed(lambda step=step: raw_insert(step)))
                    series.append(timed(lambda step=step, insert=insert: insert(step)))
                    hit = timed(lambda step=step: memo_hit(step))  # in both: the same rhythm
                    if on:
                        c.append(hit)
    finally:
        chain(True)

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [raw_run])
    store.release_lease(run_id, token)
    store.delete_run(run_id)

    ra, rb, rc, rd = median_us(a), median_us(b), median_us(c), median_us(d)
    print(f"steps per series       {args.steps} (interleaved), record {len(data)} bytes")
    print(f"(a) raw INSERT         {ra:8.1f} us median")
    print(f"(b) fenced journal     {rb:8.1f} us median  ({rb / ra:.2f}x raw)")
    print(f"(c) memo hit (read)    {rc:8.1f} us median  ({rc / ra:.2f}x raw insert)")
    print(f"(d) (b), chain off     {rd:8.1f} us median  ({rd / ra:.2f}x raw)")
    print(f"RESULT journal ratio={rb / ra:.2f} target=1.3")
    print(f"RESULT chain overhead={(rb / rd - 1) * 100:.1f}% target=5%")


if __name__ == "__main__":
    main()
