"""durable_agents beside two peers, DBOS and LangGraph's PostgresSaver, on the same work.

One process, one PostgreSQL server, one interleaved run. Every round measures, in an order
that rotates from round to round, each system's three figures below, and right before each
of them a batch of raw psycopg autocommit INSERTs of a ~1 KB row (``bench_raw_journal``, the
baseline of every benchmark in bench/). A ratio is a system's median in a round over the
median raw INSERT of that round; the table shows the median ratio over the rounds.

Each unit of work (a tool call, a DBOS step, a LangGraph node) returns the same ~1 KB value,
so every system stores rows of the size the raw INSERT writes.

durable_agents (the public API, on ``DjangoStore`` over PostgreSQL, as bench/journal.py and
bench/loop.py use it):
  step     ``DjangoStore.insert`` fenced by a lease token: the journal's hot path;
  run/100  an Agent (ScriptedModel, one read-only tool) whose run writes 100 journal records
           (49 turns, 48 of them calling the tool): ``agent.run`` wall time / records;
  run/1    a one-turn run (the model answers at once: 4 records), per run.
DBOS (``dbos``, system database on PostgreSQL):
  step     one ``@DBOS.step`` call inside a workflow of 100 steps, each timed on its own;
  run/100  that 100-step workflow, wall time / 100;
  run/1    an empty ``@DBOS.workflow``, per workflow.
LangGraph (``langgraph`` with ``PostgresSaver``, ``durability="sync"``: each step's
checkpoint is written before the next step starts, the guarantee the two others give):
  step     one node of a graph looping 100 times on one node: time between entries;
  run/100  that graph's ``invoke`` wall time / 100;
  run/1    a one-node graph, per ``invoke``;
and, for information, the 100-node graph with ``durability="async"`` (the default of
``invoke``: a checkpoint is written while the next step runs).

The script creates its own databases (``<prefix>_da``, ``<prefix>_dbos``,
``<prefix>_langgraph``; prefix ``DA_PEERS_DB``, default ``da_peers``) and drops them at the
end. Needs the packages of bench/peers/requirements.txt. Prints a table, then one
``RESULT`` line per figure.

    .venv/bin/python bench/peers/peers.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

PREFIX = os.environ.get("DA_PEERS_DB", "da_peers")
DA_DB, DBOS_DB, LG_DB = f"{PREFIX}_da", f"{PREFIX}_dbos", f"{PREFIX}_langgraph"
os.environ["DA_BENCH_DB"] = DA_DB  # read by bench/_setup.py when it is imported
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = 100  # records of the long durable_agents run, steps of the DBOS workflow and graph

Measure = Callable[[], list[float]]  # one block of a round: seconds per step or per run


def pg_url(db: str) -> str:
    from _setup import PG

    return f"postgresql://{PG['user']}@{PG['host']}:{PG['port']}/{db}"


def admin(sql: str) -> None:
    import psycopg
    from _setup import PG

    with psycopg.connect(dbname="postgres", autocommit=True, **PG) as conn:
        conn.execute(sql)


def drop_databases() -> None:
    for db in (DA_DB, DBOS_DB, LG_DB):
        admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


# -- durable_agents ---------------------------------------------------------------------


def durable_agents_blocks(data: str, per_round: int) -> tuple[dict[str, Measure], Callable]:
    import durable_agents as da
    from durable_agents.database.store import site_store
    from durable_agents.engine.journal import Journal
    from durable_agents.engine.ports import RunInfo
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    store = site_store()
    journal = Journal(store)
    tag = uuid.uuid4().hex[:8]

    @da.tool(read_only=True)
    def lookup(n: int) -> str:
        """Look something up."""
        return data

    # 2 records to start (@journal, run:start), one per model turn, one per tool result,
    # one to finish: 49 turns of which 48 call the tool make 100 records.
    turns = (STEPS - 2) // 2
    long_script = [scripted.calls(scripted.call("lookup", {"n": i})) for i in range(turns - 1)]
    long_agent = da.Agent(
        f"peers-long-{tag}",
        ScriptedModel([*long_script, scripted.text("Done.")]),
        "You help.",
        [lookup],
        max_turns=turns + 1,
    )
    short_agent = da.Agent(
        f"peers-short-{tag}",
        ScriptedModel([scripted.text("Done.")]),
        "You help.",
        [lookup],
        max_turns=2,
    )

    step_run = f"peers-step-{tag}"
    store.create_run(RunInfo(run_id=step_run, agent="bench"))
    token = uuid.uuid4().hex
    assert store.acquire_lease(step_run, "bench", token, 3600)
    counter = iter(range(10**9))
    created: list[str] = [step_run]

    def step() -> list[float]:
        samples = []
        for _ in range(STEPS):
            name = f"step:{next(counter)}"
            start = time.perf_counter()
            store.insert(step_run, name, data, fence=token)
            samples.append(time.perf_counter() - start)
        return samples

    def long_run() -> list[float]:
        run_id = f"peers-long-{tag}-{next(counter)}"
        created.append(run_id)
        start = time.perf_counter()
        long_agent.run(run_id, "Go.")
        elapsed = time.perf_counter() - start
        records = len(journal.records(run_id))
        assert records == STEPS, records
        return [elapsed / records]

    def short_run() -> list[float]:
        samples = []
        for _ in range(per_round):
            run_id = f"peers-short-{tag}-{next(counter)}"
            created.append(run_id)
            start = time.perf_counter()
            short_agent.run(run_id, "Go.")
            samples.append(time.perf_counter() - start)
        assert len(journal.records(created[-1])) == 4
        return samples

    def close() -> None:
        store.release_lease(step_run, token)
        from django.db import connections

        connections.close_all()

    return {"step": step, "run/100": long_run, "run/1": short_run}, close


# -- DBOS --------------------------------------------------------------------------------


def dbos_blocks(data: str, per_round: int) -> tuple[dict[str, Measure], Callable]:
    from dbos import DBOS, DBOSConfig

    logging.getLogger("dbos").setLevel(logging.WARNING)

    @DBOS.step()
    def work(n: int) -> str:
        return data

    @DBOS.workflow()
    def steps(n: int) -> list[float]:
        samples = []
        for i in range(n):
            start = time.perf_counter()
            work(i)
            samples.append(time.perf_counter() - start)
        return samples

    @DBOS.workflow()
    def empty() -> None:
        return None

    config: DBOSConfig = {
        "name": "da-peers-bench",
        "system_database_url": pg_url(DBOS_DB),
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()

    last: dict[str, list[float]] = {}

    def step() -> list[float]:
        start = time.perf_counter()
        last["steps"] = steps(STEPS)
        last["wall"] = [(time.perf_counter() - start) / STEPS]
        return last["steps"]

    def long_run() -> list[float]:
        return last["wall"]  # the workflow the step block just ran, wall time per step

    def short_run() -> list[float]:
        samples = []
        for _ in range(per_round):
            start = time.perf_counter()
            empty()
            samples.append(time.perf_counter() - start)
        return samples

    def close() -> None:
        DBOS.destroy(destroy_registry=True)

    return {"step": step, "run/100": long_run, "run/1": short_run}, close


# -- LangGraph ---------------------------------------------------------------------------


class LoopState(TypedDict):
    i: int
    n: int
    data: str


def langgraph_blocks(data: str, per_round: int) -> tuple[dict[str, Measure], Callable]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    saver_cm = PostgresSaver.from_conn_string(pg_url(LG_DB))
    saver = saver_cm.__enter__()
    saver.setup()
    entries: list[float] = []

    def node(state: LoopState) -> dict[str, Any]:
        entries.append(time.perf_counter())
        return {"i": state["i"] + 1, "data": data}

    def route(state: LoopState) -> str:
        return "node" if state["i"] < state["n"] else END

    builder = StateGraph(LoopState)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_conditional_edges("node", route, ["node", END])
    graph = builder.compile(checkpointer=saver)

    def invoke(n: int, durability: str) -> float:
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": n + 10}
        entries.clear()
        start = time.perf_counter()
        out = graph.invoke({"i": 0, "n": n, "data": ""}, config, durability=durability)
        elapsed = time.perf_counter() - start
        assert out["i"] == n and len(entries) == n
        return elapsed

    last: dict[str, list[float]] = {}

    def step() -> list[float]:
        last["wall"] = [invoke(STEPS, "sync") / STEPS]
        return [b - a for a, b in itertools.pairwise(entries)]

    def long_run() -> list[float]:
        return last["wall"]  # the graph the step block just ran, wall time per node

    def short_run() -> list[float]:
        return [invoke(1, "sync") for _ in range(per_round)]

    def long_async() -> list[float]:
        return [invoke(STEPS, "async") / STEPS]

    def close() -> None:
        saver_cm.__exit__(None, None, None)

    blocks = {"step": step, "run/100": long_run, "run/1": short_run, "run/100 async": long_async}
    return blocks, close


# -- the run -----------------------------------------------------------------------------

ROWS = [  # (system, block, label in the table, unit)
    ("durable_agents", "step", "durable_agents journal insert (`DjangoStore.insert`)", "step"),
    ("durable_agents", "run/100", "durable_agents run of 100 records", "record"),
    ("durable_agents", "run/1", "durable_agents one-turn run (4 records)", "run"),
    ("dbos", "step", "DBOS step", "step"),
    ("dbos", "run/100", "DBOS workflow of 100 steps", "step"),
    ("dbos", "run/1", "DBOS empty workflow", "workflow"),
    ("langgraph", "step", "LangGraph node, PostgresSaver sync", "node"),
    ("langgraph", "run/100", "LangGraph graph of 100 nodes (sync)", "node"),
    ("langgraph", "run/1", "LangGraph one-node graph (sync)", "invoke"),
    ("langgraph", "run/100 async", "LangGraph graph of 100 nodes (async)", "node"),
]


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--raw", type=int, default=50, help="raw INSERTs before each block")
    parser.add_argument("--runs", type=int, default=20, help="one-step runs per round")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    args = parser.parse_args()

    drop_databases()
    admin(f'CREATE DATABASE "{LG_DB}"')
    from _setup import payload, raw_connection, setup_django

    setup_django()  # creates and migrates DA_DB; the raw table lives there too
    raw = raw_connection()
    data = payload()
    raw_run = f"raw-peers-{uuid.uuid4().hex[:8]}"
    raw_counter = iter(range(10**9))

    def raw_batch(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            raw.execute(
                "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                [raw_run, f"step:{next(raw_counter)}", data],
            )
            samples.append(time.perf_counter() - start)
        return samples

    systems: dict[str, dict[str, Measure]] = {}
    closers = []
    try:
        for name, make in (
            ("durable_agents", durable_agents_blocks),
            ("dbos", dbos_blocks),
            ("langgraph", langgraph_blocks),
        ):
            systems[name], close = make(data, args.runs)
            closers.append(close)

        # Warm-up: connections, prepared plans, caches, imports on first use.
        raw_batch(200)
        for blocks in systems.values():
            for measure in blocks.values():
                measure()

        order = list(systems)
        ratios: dict[tuple[str, str], list[float]] = {(s, b): [] for s, b, _, _ in ROWS}
        absolute: dict[tuple[str, str], list[float]] = {(s, b): [] for s, b, _, _ in ROWS}
        raw_medians: list[float] = []
        for r in range(args.rounds):
            rotated = order[r % len(order) :] + order[: r % len(order)]
            round_raw: list[float] = []
            round_values: dict[tuple[str, str], float] = {}
            for system in rotated:
                for block, measure in systems[system].items():
                    round_raw.extend(raw_batch(args.raw))
                    round_values[(system, block)] = statistics.median(measure())
            raw_median = statistics.median(round_raw)
            raw_medians.append(raw_median)
            for key, value in round_values.items():
                ratios[key].append(value / raw_median)
                absolute[key].append(value)
            print(f"round {r + 1}/{args.rounds}: raw INSERT {raw_median * 1e6:.0f} us", flush=True)
    finally:
        for close in closers:
            try:
                close()
            except Exception as exc:  # cleanup must go on
                print(f"closing: {exc!r}", file=sys.stderr)
        raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [raw_run])
        raw.close()
        if not args.keep:
            drop_databases()

    import psycopg

    print()
    print(
        f"durable_agents {version('durable-agents')} · dbos {version('dbos')} · "
        f"langgraph {version('langgraph')} · langgraph-checkpoint-postgres "
        f"{version('langgraph-checkpoint-postgres')} · psycopg {psycopg.__version__} · "
        f"Python {sys.version.split()[0]}"
    )
    print(
        f"{args.rounds} rounds; raw INSERT median {statistics.median(raw_medians) * 1e6:.0f} us "
        f"(rounds {min(raw_medians) * 1e6:.0f}-{max(raw_medians) * 1e6:.0f} us)"
    )
    print()
    print("| measurement | per | median | ratio to raw INSERT (rounds min-max) |")
    print("|---|---|---|---|")
    for system, block, label, unit in ROWS:
        values = ratios[(system, block)]
        us = statistics.median(absolute[(system, block)]) * 1e6
        print(
            f"| {label} | {unit} | {us:,.0f} us | **{statistics.median(values):.2f}** "
            f"({min(values):.2f}-{max(values):.2f}) |"
        )
    print()
    for system, block, _, unit in ROWS:
        name = f"{system}-{block.replace('/', '').replace(' ', '-')}"
        ratio = statistics.median(ratios[(system, block)])
        print(f"RESULT peers {name} per={unit} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
