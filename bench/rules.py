"""What an approval rule that lets a call through costs (issue 42; docs/benchmarks.md,
"Approval rules"): a run whose one tool call is under ``da.Rules`` allowing it, against the
same run with the tool ungated, against a raw psycopg autocommit INSERT.

Method (the project's one method): interleaved rounds; in each round the raw INSERT is timed
in a tight loop of its own (never right after agent work), then a batch of ungated runs and
a batch of rule-allowed runs, their order swapped every round; each figure is the round's
median per run divided by the round's median raw INSERT; printed as the median and range
over the rounds. "What the rule adds" is the difference per run, in raw INSERTs and in fenced
journal records timed in the same round: the target is one record (the automatic decision;
nothing else is written or read).
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from _setup import payload, raw_connection, setup_django, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=60, help="runs of each kind per round")
    parser.add_argument("--inserts", type=int, default=300, help="raw INSERTs per round")
    args = parser.parse_args()
    setup_django()

    import durable_agents as da
    from durable_agents.database.store import site_store
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]

    @da.tool(name="lookup_plain", idempotent=True)
    def plain_tool(order_id: str) -> str:
        """Look an order up."""
        return "ok"

    @da.tool(name="lookup_ruled", idempotent=True, approval=da.Rules([], default=da.allow))
    def ruled_tool(order_id: str) -> str:
        """Look an order up."""
        return "ok"

    def agent(name: str, tool: da.Tool) -> da.Agent:
        script = [scripted.calls(scripted.call(tool.name, {"order_id": "7"})), scripted.text("ok")]
        return da.Agent(f"bench-{name}-{tag}", ScriptedModel(script), "", [tool])

    plain, ruled = agent("plain", plain_tool), agent("ruled", ruled_tool)

    # One journal record, fenced, as a driver writes it: what the rule is meant to add.
    from durable_agents.engine.ports import RunInfo

    leased = f"bench-rules-{tag}-records"
    store.create_run(RunInfo(leased, agent="bench"))
    token = f"tok-{uuid.uuid4().hex}"
    store.acquire_lease(leased, "bench", token, 3600)

    def records_round() -> float:
        samples = [
            timed(lambda: store.insert(leased, f"step:{uuid.uuid4().hex}", data, fence=token))
            for _ in range(args.inserts // 3)
        ]
        return statistics.median(samples)

    def raw_round() -> float:
        samples = [
            timed(
                lambda: raw.execute(
                    "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                    [f"raw-{tag}", uuid.uuid4().hex, data],
                )
            )
            for _ in range(args.inserts)
        ]
        return statistics.median(samples)

    def runs_round(a: da.Agent, kind: str, r: int) -> float:
        samples = [
            timed(lambda i=i: a.run(f"bench-rules-{tag}-{kind}-{r}-{i}", "go", store=store))
            for i in range(args.runs)
        ]
        return statistics.median(samples)

    # Warm up: prepared statements, the agents' fingerprints, the connection.
    raw_round()
    runs_round(plain, "warm-plain", -1)
    runs_round(ruled, "warm-ruled", -1)

    ratios: dict[str, list[float]] = {
        "ungated": [],
        "allowed": [],
        "extra": [],
        "record": [],
        "extra_records": [],
    }
    for r in range(args.rounds):
        base = raw_round()
        record = records_round()
        order = [("plain", plain), ("ruled", ruled)]
        if r % 2:
            order.reverse()
        took = {kind: runs_round(a, kind, r) for kind, a in order}
        ratios["ungated"].append(took["plain"] / base)
        ratios["allowed"].append(took["ruled"] / base)
        ratios["extra"].append((took["ruled"] - took["plain"]) / base)
        ratios["record"].append(record / base)
        ratios["extra_records"].append((took["ruled"] - took["plain"]) / record)

    def show(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

    print(f"approval rules, {args.rounds} rounds x {args.runs} runs, vs a raw INSERT")
    print(f"  run, tool ungated:        {show(ratios['ungated'])}")
    print(f"  run, tool allowed by rule: {show(ratios['allowed'])}")
    print(f"  what the rule adds:       {show(ratios['extra'])} raw INSERTs")
    print(f"  one journal record:       {show(ratios['record'])}")
    print(f"  what the rule adds:       {show(ratios['extra_records'])} journal records")
    print(f"RESULT rules_extra_records={statistics.median(ratios['extra_records']):.2f}")


if __name__ == "__main__":
    main()
