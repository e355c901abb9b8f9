"""Journal write cost against a raw PostgreSQL insert, measured side by side.

Per step, interleaved in one run on the local PostgreSQL:
  (a) raw psycopg autocommit INSERT of the same row (run_id, name, ~1 KB JSON) into a table
      with the same unique index;
  (b) DjangoStore fenced insert-if-absent (the journal's hot path);
  (c) a memo hit: Journal.do on a recorded step (one read, fn not called).
Prints medians and the ratio (b)/(a); the last line is the result. Target: <= 1.3.

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

    from durable_agents.engine.journal import Journal
    from durable_agents.engine.ports import RunInfo
    from durable_agents.storage import site_store

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

    def memo_hit(i: int) -> None:
        journal.do(run_id, f"step:{i}", lambda: {"kind": "never-called"})

    for i in range(200):  # warm-up: connections, plans, caches
        raw_insert(-1 - i)
        fenced_insert(-1 - i)
        memo_hit(-1 - i)

    a: list[float] = []
    b: list[float] = []
    c: list[float] = []
    for i in range(args.steps):
        a.append(timed(lambda i=i: raw_insert(i)))
        b.append(timed(lambda i=i: fenced_insert(i)))
        c.append(timed(lambda i=i: memo_hit(i)))

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [raw_run])
    store.release_lease(run_id, token)
    store.delete_run(run_id)

    ra, rb, rc = median_us(a), median_us(b), median_us(c)
    print(f"steps per series       {args.steps} (interleaved), record {len(data)} bytes")
    print(f"(a) raw INSERT         {ra:8.1f} us median")
    print(f"(b) fenced journal     {rb:8.1f} us median  ({rb / ra:.2f}x raw)")
    print(f"(c) memo hit (read)    {rc:8.1f} us median  ({rc / ra:.2f}x raw insert)")
    print(f"RESULT journal ratio={rb / ra:.2f} target=1.3")


if __name__ == "__main__":
    main()
