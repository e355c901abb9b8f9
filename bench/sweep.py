"""The timer sweep over many paused runs: what a sweep costs once it has read them.

``--paused`` runs (500 by default) each pause sleeping for a day, after a few turns (about
ten records each), through ``DjangoStore``. Then ``wake_timers`` sweeps them over and over,
as Celery beat does every ``TIMER_SWEEP_INTERVAL``: the first sweep of a process reads every
journal; the later ones read only the seq of each run's last record (``journal_heads``) and
no journal, as nothing was written to the runs. Each sweep is timed against the median raw
psycopg autocommit INSERT (a ~1 KB row) measured beside it in the same run, and a full read
of every paused journal (what each sweep did before) is timed too.

Prints medians and ratios; the last line is the result (a steady sweep over the paused
runs, in raw INSERTs). Reported, no target.

    .venv/bin/python bench/sweep.py [--paused 500] [--sweeps 20]
"""

# No ``from __future__ import annotations``: the tools below are defined inside ``main``
# (after Django is set up), and a tool's parameter types are read when it is defined.
import argparse
import uuid
from typing import Any

from _setup import median_us, payload, raw_connection, setup_django, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paused", type=int, default=500)
    parser.add_argument("--sweeps", type=int, default=20)
    args = parser.parse_args()
    setup_django()

    import durable_agents as da
    from durable_agents.database.store import site_store
    from durable_agents.engine import runtime
    from durable_agents.engine.commands.timers import _QUIET, wake_timers
    from durable_agents.engine.journal import Journal
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    @da.tool(idempotent=True)
    def nap(ctx: da.ToolContext) -> str:
        """Sleep a day."""
        return ctx.sleep("later", 86_400).isoformat()

    @da.tool(read_only=True)
    def look(n: int) -> dict:
        """Look something up."""
        return {"n": n}

    def agent(name: str) -> da.Agent:
        script: list[Any] = [scripted.calls(scripted.call("look", {"n": i})) for i in range(3)]
        script += [scripted.calls(scripted.call("nap", {})), scripted.text("rested")]
        return da.Agent(name, ScriptedModel(script), "You help.", [look, nap])

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]
    raw.execute("UPDATE durable_agents_run SET status = 'cancelled' WHERE status = 'sleeping'")
    runtime.configure(dispatcher=lambda run_id: None)  # the sweep's hand-overs go nowhere
    run_ids = []
    for i in range(args.paused):
        run_id = f"bench-sweep-{tag}-{i}"
        try:
            agent(f"bench-sweep-{tag}-{i}").run(run_id, "Go.", store=store)
        except da.TimerPending:
            run_ids.append(run_id)
    records = sum(len(store.load(r)) for r in run_ids)
    journal = Journal(store)

    def raw_insert() -> float:
        return timed(
            lambda: raw.execute(
                "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                [f"raw-{tag}", uuid.uuid4().hex, data],
            )
        )

    def read_all() -> None:  # what every sweep did before: each paused run's journal
        for run_id in run_ids:
            journal.records(run_id)

    raws: list[float] = []
    for _ in range(50):
        raws.append(raw_insert())
    _QUIET.pop(store, None)
    first = timed(lambda: wake_timers(store=store))
    steady, full = [], []
    for _ in range(args.sweeps):
        raws.append(raw_insert())
        steady.append(timed(lambda: wake_timers(store=store)))
        raws.append(raw_insert())
        full.append(timed(read_all))
    raw_us = median_us(raws)
    steady_us, full_us = median_us(steady), median_us(full)
    print(f"paused runs            {len(run_ids)} sleeping, {records} records")
    print(f"(a) raw INSERT         {raw_us:10.1f} us median")
    print(f"(b) first sweep        {first * 1e6:10.1f} us ({first * 1e6 / raw_us:.0f}x raw)")
    print(f"(c) steady sweep       {steady_us:10.1f} us median ({steady_us / raw_us:.1f}x raw)")
    print(f"(d) every journal read {full_us:10.1f} us median ({full_us / raw_us:.1f}x raw)")
    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [f"raw-{tag}"])
    print(
        f"RESULT sweep steady ratio={steady_us / raw_us:.1f} "
        f"full_read_ratio={full_us / raw_us:.1f} runs={len(run_ids)}"
    )


if __name__ == "__main__":
    main()
