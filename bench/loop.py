"""The agent loop on PostgreSQL against raw psycopg, measured side by side in one run.

(1) Live steps. A 100-turn run (99 turns that each call one no-op read-only tool, then a
    text answer; ScriptedModel, so no model latency) through ``DjangoStore``. Its cost per
    journaled record (wall time of ``agent.run`` / records the run wrote) is compared with
    the median raw psycopg autocommit INSERT of a ~1 KB row into a table with the same
    unique index. The two are interleaved turn by turn: the model's request hook does two
    timed raw inserts per turn (topped up after the run to as many as the run wrote
    records), and their time is taken off the run's wall time. The loop's cost includes
    everything a step costs: the run-row projection (one fenced UPDATE per model turn), the
    lease, transcript rebuilding. A run's ratio is its cost per record over the median of
    its own interleaved raw inserts; the figure is the median over the runs. Also printed:
    this process's CPU time per record (engine and driver work, without database waits).
    Target: <= 1.5 (issue 17).

(2) Resume of a finished run (replay only). A run with ~1,000 recorded steps is built once;
    then ``agent.run(run_id, input)`` on it must read the journal in one query (since issue
    33 the start attempt that finds the run brings it back) and return
    the recorded answer without calling the model (both asserted). Its time is compared
    with a raw psycopg ``SELECT seq, name, data, created_at ... ORDER BY seq`` (fetchall) of
    the same rows, alternating one for one; the figure is the median of the per-pair
    ratios. Target: <= 1.5.

(3) One-turn runs. A new run whose model answers at once (4 records: header, ``run:start``,
    ``model:1``, ``run:complete``), ``agent.run`` of a fresh run id each time, against the
    raw psycopg autocommit INSERT, one raw insert right before each run; the figure is the
    median of the per-pair ratios (run / the raw insert before it). Target: <= 4.0 per run
    (issue 17: half a DBOS empty workflow).

Prints medians (and the ratios of medians the figures were before per-pair ratios); the
last three lines are the results: one-turn run, loop, resume. With ``--repeat N`` the three
measurements run N times in a row (the runs built once) and the RESULT lines give the
median over the N series.

    .venv/bin/python bench/loop.py [--turns 100] [--rounds 5] [--resume-turns 500]
                                   [--resume-rounds 20] [--one-turn-runs 200] [--repeat N]
                                   [--durability sync|async]   (the live run's dial)
"""

from __future__ import annotations

import argparse
import statistics
import time
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100, help="model turns of a live run")
    parser.add_argument(
        "--durability",
        choices=("sync", "async"),
        default="sync",
        help="the live run's durability dial (docs/durability.md)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="live runs measured")
    parser.add_argument("--resume-turns", type=int, default=500, help="turns of the resumed run")
    parser.add_argument("--resume-rounds", type=int, default=20)
    parser.add_argument("--one-turn-runs", type=int, default=200, help="one-turn runs measured")
    add_repeat_argument(parser)
    args = parser.parse_args()
    setup_django()

    import durable_agents as da
    from durable_agents.database.store import DjangoStore, site_store
    from durable_agents.engine.journal import Journal
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    class CountingStore(DjangoStore):
        """Counts the journal reads (a full load, one name, or a start attempt that read
        the run it found) a resume makes."""

        def __init__(self) -> None:
            super().__init__()
            self.loads = 0
            self.gets = 0

        def start_or_load(self, run: Any, **kwargs: Any) -> Any:
            entries, existing = super().start_or_load(run, **kwargs)
            self.loads += existing is not None
            return entries, existing

        def load(self, run_id: str, after: int = 0) -> Any:
            self.loads += 1
            return super().load(run_id, after)

        def get(self, run_id: str, name: str) -> Any:
            self.gets += 1
            return super().get(run_id, name)

    @da.tool(read_only=True)
    def noop(n: int) -> dict:
        """Do nothing."""
        return {"n": n}

    def make_agent(
        name: str, turns: int, on_request: Any = None, durability: str = "sync"
    ) -> da.Agent:
        script = [scripted.calls(scripted.call("noop", {"n": i})) for i in range(turns - 1)]
        script.append(scripted.text("Done."))
        model = ScriptedModel(script, on_request=on_request)
        return da.Agent(
            name, model, "You help.", [noop], max_turns=turns + 1, durability=durability
        )

    store = site_store()
    journal = Journal(store)
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]
    raw_run = f"raw-bench-loop-{tag}"
    created: list[str] = []

    # -- (1) live steps -----------------------------------------------------------------
    raw_n = 0
    samples: list[float] = []  # raw inserts of the current run
    inside = [0.0, 0.0]  # wall and CPU time of raw inserts made inside the current run

    def raw_insert() -> None:
        nonlocal raw_n
        raw_n += 1
        wall, cpu = time.perf_counter(), time.process_time()
        raw.execute(
            "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
            [raw_run, f"step:{raw_n}", data],
        )
        samples.append(time.perf_counter() - wall)
        inside[0] += samples[-1]
        inside[1] += time.process_time() - cpu

    def two_raw_inserts(request: Any) -> None:  # the model's request hook: one per turn
        raw_insert()
        raw_insert()

    live = make_agent(f"bench-loop-{tag}", args.turns, two_raw_inserts, args.durability)

    def live_run(i: int) -> tuple[float, float, int]:
        """One run: its wall and CPU time without the raw inserts, and its records."""
        run_id = f"bench-loop-{tag}-{i}"
        created.append(run_id)
        samples.clear()
        inside[:] = [0.0, 0.0]
        wall, cpu = time.perf_counter(), time.process_time()
        live.run(run_id, "Go.")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        records = len(journal.records(run_id))
        while len(samples) < records:
            raw_insert()
        return wall - inside[0], cpu - inside[1], records

    for _ in range(200):  # warm-up: connections, plans, caches
        raw_insert()
    live_run(-1)

    # -- (2)'s finished run, built once --------------------------------------------------
    replay = make_agent(f"bench-resume-{tag}", args.resume_turns)
    resume_id = f"bench-resume-{tag}"
    created.append(resume_id)
    first = replay.run(resume_id, "Go.")
    steps = len(journal.records(resume_id))
    requests = replay.model.requests

    counting = CountingStore()
    again = replay.run(resume_id, "Go.", store=counting)
    assert again.answer == first.answer and again.turns == first.turns
    assert (counting.loads, counting.gets) == (1, 0), (counting.loads, counting.gets)

    select = (
        "SELECT seq, name, data, created_at FROM durable_agents_journalentry "
        "WHERE run_id = %s ORDER BY seq"
    )

    def raw_select() -> None:
        rows = raw.execute(select, [resume_id]).fetchall()
        assert len(rows) == steps

    def resume() -> None:
        assert replay.run(resume_id, "Go.").answer == first.answer

    for _ in range(5):  # warm-up
        raw_select()
        resume()

    # -- (3)'s agent -------------------------------------------------------------------------
    one = da.Agent(f"bench-one-{tag}", ScriptedModel([scripted.text("Hi.")]), "Say hi.")
    one_n = 0

    def one_turn() -> None:
        nonlocal one_n
        one_n += 1
        run_id = f"bench-one-{tag}-{one_n}"
        created.append(run_id)
        assert one.run(run_id, "Hello.").answer == "Hi."

    for _ in range(20):  # warm-up
        raw_insert()
        one_turn()

    results: dict[str, list[float]] = {"one-turn": [], "loop": [], "resume": []}
    for series in range(args.repeat):
        # (1) live steps
        loop_per_record: list[float] = []
        loop_ratios: list[float] = []
        cpu_per_record: list[float] = []
        loop_total: list[float] = []
        raw_inserts: list[float] = []
        for i in range(args.rounds):
            elapsed, cpu, records = live_run(series * args.rounds + i)
            loop_total.append(elapsed)
            loop_per_record.append(elapsed / records)
            loop_ratios.append(elapsed / records / statistics.median(samples))
            cpu_per_record.append(cpu / records)
            raw_inserts.extend(samples)
        rl, ri, rc = median_us(loop_per_record), median_us(raw_inserts), median_us(cpu_per_record)

        # (2) resume of a finished run
        ra_: list[float] = []
        rs_: list[float] = []
        for _ in range(args.resume_rounds):
            ra_.append(timed(raw_select))
            rs_.append(timed(resume))
        assert replay.model.requests == requests, "a finished run called the model again"
        sa, sr = median_us(ra_), median_us(rs_)

        # (3) one-turn runs
        samples.clear()
        one_runs: list[float] = []
        for _ in range(args.one_turn_runs):
            raw_insert()
            one_runs.append(timed(one_turn))
        so, ro = median_us(one_runs), median_us(samples)

        loop_ratio = statistics.median(loop_ratios)
        resume_ratio = median_ratio(rs_, ra_)
        one_ratio = median_ratio(one_runs, samples)
        results["loop"].append(loop_ratio)
        results["resume"].append(resume_ratio)
        results["one-turn"].append(one_ratio)
        print(f"series {series + 1}/{args.repeat}")
        print(f"live run               {args.turns} turns, {records} records, {args.rounds} rounds")
        print(f"(a) raw INSERT         {ri:8.1f} us median ({len(raw_inserts)} interleaved)")
        print(
            f"(b) loop per record    {rl:8.1f} us median  ({loop_ratio:.2f}x raw per run; "
            f"{rl / ri:.2f}x by medians); run {statistics.median(loop_total) * 1e3:.1f} ms median"
        )
        print(f"    of which CPU here  {rc:8.1f} us median  (engine + driver, no DB waits)")
        print(f"resume                 finished run of {steps} records, {args.resume_rounds} pairs")
        print(f"(c) raw SELECT         {sa:8.1f} us median")
        print(
            f"(d) resume (replay)    {sr:8.1f} us median  ({resume_ratio:.2f}x raw per pair; "
            f"{sr / sa:.2f}x by medians); 1 journal read"
        )
        print(f"one-turn runs          {args.one_turn_runs} runs of 4 records")
        print(f"(e) raw INSERT         {ro:8.1f} us median ({len(samples)} interleaved)")
        print(
            f"(f) one-turn run       {so:8.1f} us median  ({one_ratio:.2f}x raw per pair; "
            f"{so / ro:.2f}x by medians) per run"
        )

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [raw_run])
    for run_id in created:
        store.delete_run(run_id)

    if args.repeat > 1:
        for name, values in results.items():
            print(f"series {name:9s} " + " ".join(f"{v:.2f}" for v in values))
    print(f"RESULT one-turn ratio={statistics.median(results['one-turn']):.2f} target=4.0")
    print(
        f"RESULT loop durability={args.durability} "
        f"ratio={statistics.median(results['loop']):.2f} target=1.5"
    )
    print(f"RESULT resume ratio={statistics.median(results['resume']):.2f} target=1.5")


if __name__ == "__main__":
    main()
