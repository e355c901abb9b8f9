"""Journal write cost against a raw PostgreSQL insert, measured side by side.

Per step, interleaved one for one in one run on the local PostgreSQL:
  (a) raw psycopg autocommit INSERT of the same row (run_id, name, ~1 KB JSON) into a table
      with the same unique index;
  (b) DjangoStore fenced insert-if-absent (the journal's hot path), chained as a driver's
      records are: hashed by the store after the lease's last record, with its
      predecessor's seq (the trigger hashed only the lease's first; docs/audit.md);
  (c) a memo hit: Journal.do on a recorded step (one read, fn not called), on a third
      connection (a read on (b)'s connection would slow (b)'s next insert, not (d)'s);
  (d) the fenced insert of (b) without the audit chain: sent by the same store code, the
      statement without hash, ``prev_seq`` and journal lock, probing for followers and
      notifying a followed run as (b) does (nobody follows the bench's run); on a second
      connection that sets ``session_replication_role = replica`` (the chain's trigger,
      which a row without a hash fires, does not fire in that session; the schema and
      every other session are unchanged).
Each step times a, then b and d (taking turns going first), then c, back to back. The
ratios are medians of per-step ratios (b/a, b/d: the two sides of a ratio ran microseconds
apart, so a load spike moves one step's ratio, not the figure); the medians of each series
and their ratios are printed too.
Targets: (b)/(a) <= 1.3, chain overhead (b)/(d) - 1 <= 5%.

    .venv/bin/python bench/journal.py [--steps 2000] [--repeat N] [--aa]

With ``--repeat N`` the whole measurement runs N times in a row; each series prints its
figures and the RESULT lines give the median over the N series. ``--aa`` checks the method
itself: (b) is then (d) too, on the store's own connection, so the chain overhead should
read about 0.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from typing import Any

from _setup import (
    add_repeat_argument,
    median_ratio,
    median_us,
    payload,
    raw_connection,
    setup_django,
    timed,
)

CHAIN_ON = "bench_chain_on"
CHAIN_OFF = "bench_chain_off"
MEMO = "bench_memo"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--aa",
        action="store_true",
        help="A/A check of the method: (d)'s statement on both sides of (b)/(d); "
        "the chain overhead should then read about 0",
    )
    add_repeat_argument(parser)
    args = parser.parse_args()
    setup_django()

    from django.db import connections

    from durable_agents.database.store import DjangoStore, site_store
    from durable_agents.engine.journal import Journal
    from durable_agents.engine.ports import RunInfo
    from durable_agents.models import JournalEntry

    j = JournalEntry._meta.db_table
    # (d)'s statement: (b)'s without the chain (no hash, no prev_seq, no journal lock),
    # notifying a followed run in its RETURNING clause as (b)'s does.
    unchained_sql = (
        f"INSERT INTO {j} (run_id, name, data, created_at) "
        "SELECT %s, %s, %s, now() WHERE EXISTS (SELECT 1 FROM durable_agents_lease "
        "WHERE run_id = %s AND token = %s AND expires_at > now() FOR SHARE) "
        "ON CONFLICT (run_id, name) DO NOTHING "
        "RETURNING seq, created_at, CASE WHEN EXISTS (SELECT 1 FROM "
        f"durable_agents_follower f WHERE f.run_id = {j}.run_id AND f.expires_at > now()) "
        f"THEN pg_notify('da_run_' || md5({j}.run_id), {j}.seq || ' ' || {j}.run_id) END"
    )

    class ChainOff(DjangoStore):
        """The store with the chain's work taken out: every fenced insert is (d)'s statement,
        sent by the same code as (b)'s (no tail kept, nothing hashed)."""

        def _tail(self, run_id: str, fence: str | None, conn: Any = None) -> Any:
            return (0, None) if fence is not None else None

        def _hashed_insert(self, run_id, name, data, fence, tail) -> Any:
            return unchained_sql, [run_id, name, data, run_id, fence], ""

        def _remember_tail(self, *args: Any) -> None:
            pass

    default = site_store().using
    # (b)'s and (d)'s connections: the default database's settings under aliases of their
    # own, so each has a fresh session (and prepared statements) of its own — not the one
    # that ran the migrations — and (d)'s turns the chain's trigger off.
    for alias in (CHAIN_ON, CHAIN_OFF, MEMO):
        connections.settings[alias] = dict(connections.settings[default])
    store = ChainOff(using=CHAIN_ON) if args.aa else DjangoStore(using=CHAIN_ON)
    off_store = ChainOff(using=CHAIN_OFF)
    for alias in [CHAIN_OFF, CHAIN_ON] if args.aa else [CHAIN_OFF]:
        with connections[alias].cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")

    # (c) reads on a connection of its own: a read on (b)'s connection between steps made
    # (b)'s next insert slower than (d)'s (an A/A check read 4-6% with it there, 0 without).
    journal = Journal(DjangoStore(using=MEMO))
    raw = raw_connection()
    data = payload()
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    raw_run = f"raw-{run_id}"
    store.create_run(RunInfo(run_id=run_id, agent="bench"))
    token = uuid.uuid4().hex
    assert store.acquire_lease(run_id, "bench", token, 600)
    Journal(store).write(run_id, "warm", {"kind": "value"}, fence=token)

    def raw_insert(name: str) -> None:
        raw.execute(
            "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
            [raw_run, name, data],
        )

    def fenced_insert(name: str) -> None:
        assert store.insert(run_id, name, data, fence=token)[1]

    def unchained_insert(name: str) -> None:
        assert off_store.insert(run_id, name, data, fence=token)[1]

    def memo_hit(name: str) -> None:
        journal.do(run_id, name, lambda: {"kind": "never-called"})

    for i in range(200):  # warm-up: connections, plans, caches
        raw_insert(f"warm:a:{i}")
        fenced_insert(f"warm:b:{i}")
        unchained_insert(f"warm:d:{i}")
        memo_hit(f"warm:b:{i}")

    journal_ratios: list[float] = []
    overheads: list[float] = []
    for series in range(args.repeat):
        a: list[float] = []
        b: list[float] = []
        c: list[float] = []
        d: list[float] = []
        for i in range(args.steps):
            step = f"{series}:{i}"
            a.append(timed(lambda step=step: raw_insert(step)))
            # (b) and (d) take turns going first: a statement right after another commit
            # may wait on that commit's flush, and neither side should always be second.
            if i % 2:
                d.append(timed(lambda step=step: unchained_insert(f"d:{step}")))
            b.append(timed(lambda step=step: fenced_insert(f"b:{step}")))
            if not i % 2:
                d.append(timed(lambda step=step: unchained_insert(f"d:{step}")))
            c.append(timed(lambda step=step: memo_hit(f"b:{step}")))
        ra, rb, rc, rd = median_us(a), median_us(b), median_us(c), median_us(d)
        journal_ratio, chain_ratio = median_ratio(b, a), median_ratio(b, d)
        journal_ratios.append(journal_ratio)
        overheads.append((chain_ratio - 1) * 100)
        print(f"series {series + 1}/{args.repeat}: {args.steps} steps, record {len(data)} bytes")
        print(f"(a) raw INSERT         {ra:8.1f} us median")
        print(f"(b) fenced journal     {rb:8.1f} us median  ({rb / ra:.2f}x raw by medians)")
        print(f"(c) memo hit (read)    {rc:8.1f} us median  ({rc / ra:.2f}x raw insert)")
        print(f"(d) (b), chain off     {rd:8.1f} us median  ({rd / ra:.2f}x raw by medians)")
        print(
            f"    per-step ratios: b/a {journal_ratio:.2f}, b/d {chain_ratio:.3f} "
            f"(by medians {rb / rd:.3f})"
        )

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [raw_run])
    store.release_lease(run_id, token)
    store.delete_run(run_id)
    connections[CHAIN_OFF].close()
    connections[CHAIN_ON].close()
    connections[MEMO].close()

    if args.repeat > 1:
        print("series journal ratios  " + " ".join(f"{r:.2f}" for r in journal_ratios))
        print("series chain overheads " + " ".join(f"{o:.1f}%" for o in overheads))
    print(f"RESULT journal ratio={statistics.median(journal_ratios):.2f} target=1.3")
    print(f"RESULT chain overhead={statistics.median(overheads):.1f}% target=5%")


if __name__ == "__main__":
    main()
