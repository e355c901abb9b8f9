"""What a limit costs on PostgreSQL, against a raw psycopg autocommit INSERT measured side by
side in the same run (docs/benchmarks.md, "Limits").

(1) A slot: ``claim_slot`` then ``release_slot`` of a tool's slot (one short transaction
    serialised per key by an advisory lock, then one DELETE), per limited call, with
    ``--holders`` other live slots of the key held (the count it reads).
(2) A rate permit: ``take_permit`` on a rate that always grants (one transaction: the bucket
    row locked, read, moved on).
(3) A one-turn run of an agent with ``max_concurrent_runs`` against the same run without it:
    what the agent's slot adds to a whole run.

Each figure is the median of per-pair ratios (the operation / the raw INSERT right before it).
"""

from __future__ import annotations

import argparse
import uuid

from _setup import median_ratio, median_us, payload, raw_connection, setup_django, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--holders", type=int, default=10)
    args = parser.parse_args()
    setup_django()

    import durable_agents as da
    from durable_agents.database.store import site_store
    from durable_agents.engine.ports import RunInfo
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]

    def raw_insert() -> float:
        return timed(
            lambda: raw.execute(
                "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                [f"raw-{tag}", uuid.uuid4().hex, data],
            )
        )

    def leased(name: str) -> tuple[str, str]:
        run_id = f"bench-limits-{tag}-{name}"
        store.create_run(RunInfo(run_id, agent="bench"))
        token = f"tok-{uuid.uuid4().hex}"
        assert store.acquire_lease(run_id, "bench", token, 600) is not None
        return run_id, token

    key = f"tool/bench-{tag}"
    for i in range(args.holders):
        run_id, token = leased(f"holder-{i}")
        assert store.claim_slot(key, run_id, run_id, token, args.holders + 1)
    me, mine = leased("me")

    def slot() -> None:
        assert store.claim_slot(key, f"{me}#c", me, mine, args.holders + 1)
        store.release_slot(key, f"{me}#c", mine)

    def permit() -> None:
        assert store.take_permit(f"tool/rate-{tag}", 10**9, 1.0) == 0.0

    results = {}
    for name, op in (("slot", slot), ("permit", permit)):
        raws, ops = [], []
        for _ in range(args.n):
            raws.append(raw_insert())
            ops.append(timed(op))
        results[name] = (median_us(raws), median_us(ops), median_ratio(ops, raws))

    turn = [scripted.text("done")]
    plain = da.Agent(f"bench-plain-{tag}", ScriptedModel(turn * (args.n + 1)))
    limited = da.Agent(
        f"bench-limited-{tag}", ScriptedModel(turn * (args.n + 1)), max_concurrent_runs=1000
    )
    runs: dict[str, list[float]] = {"plain": [], "limited": []}
    raws = []
    for i in range(args.n // 2):
        raws.append(raw_insert())
        runs["plain"].append(timed(lambda i=i: plain.run(f"bp-{tag}-{i}", "go", store=store)))
        runs["limited"].append(timed(lambda i=i: limited.run(f"bl-{tag}-{i}", "go", store=store)))

    raw_us, slot_us, slot_ratio = results["slot"]
    _, permit_us, permit_ratio = results["permit"]
    print(f"(a) raw INSERT              {raw_us:8.1f} us median")
    print(f"(b) tool slot claim+release {slot_us:8.1f} us median ({slot_ratio:.2f}x raw per pair)")
    print(
        f"(c) rate permit             {permit_us:8.1f} us median ({permit_ratio:.2f}x raw per pair)"
    )
    plain_ratio = median_ratio(runs["plain"], raws)
    limited_ratio = median_ratio(runs["limited"], raws)
    print(
        f"(d) one-turn run            {median_us(runs['plain']):8.1f} us median "
        f"({plain_ratio:.2f}x raw); with max_concurrent_runs "
        f"{median_us(runs['limited']):8.1f} us ({limited_ratio:.2f}x raw)"
    )
    print(f"RESULT limits slot={slot_ratio:.2f} permit={permit_ratio:.2f}")
    print(f"RESULT limits one-turn plain={plain_ratio:.2f} limited={limited_ratio:.2f}")


if __name__ == "__main__":
    main()
