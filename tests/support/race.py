"""A racing driver: drive runs that other processes are driving at the same moment.

    python -m tests.support.race <agent> <run_id>[,<run_id>...]

Prints "ready" once Django, the database connection and the agent are loaded, then waits
for a line on stdin (the start barrier, so every racer starts together). For each run id in
turn it calls ``agent.run(run_id, "go")``; on ``RunBusy`` it sleeps 5-30 ms and tries again
until the run is finished (by this process or another). It ends with one JSON line: per run,
how often it found the run busy, whether its own ``run()`` returned, how many model turns it
generated and how many side effects it fired; a hard deadline keeps it from ever hanging.

The module also defines the slow agent ``race-slow`` (its tool is not retry-safe and takes
20-50 ms), so a drive takes long enough for the racers to collide. When run as a script it
imports itself by its module name first, so the agent and its fire counter exist once.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import fire

SLOW_AGENT = "race-slow"
SLOW_TURNS = 4
SLOW_ANSWER = "raced to the end"
# Four turns of two calls each, then the answer.
SLOW_SCRIPT = [
    *(
        scripted.calls(
            scripted.call("slow_act", {"item": f"{t}a"}),
            scripted.call("slow_act", {"item": f"{t}b"}),
        )
        for t in range(1, SLOW_TURNS + 1)
    ),
    scripted.text(SLOW_ANSWER),
]

DEADLINE = float(os.environ.get("DA_RACE_DEADLINE", "60"))
FIRED = {"n": 0}  # slow_act fires in this process


@da.tool
def slow_act(item: str, ctx: da.ToolContext) -> dict:
    """Do something slow to an item; not safe to repeat."""
    time.sleep(random.uniform(0.02, 0.05))
    fire(ctx, "slow")
    FIRED["n"] += 1
    return {"done": item}


slow_agent = da.Agent(SLOW_AGENT, ScriptedModel(SLOW_SCRIPT), "Act on every item.", [slow_act])


def race(agent_name: str, run_ids: list[str]) -> dict[str, Any]:
    from django.db import connections

    from durable_agents.database.store import DjangoStore
    from durable_agents.engine.agent import get_agent

    agent = get_agent(agent_name)
    store = DjangoStore()
    connections["default"].ensure_connection()
    rng = random.Random()
    print("ready", flush=True)
    sys.stdin.readline()

    began = time.monotonic()
    deadline = began + DEADLINE
    runs: dict[str, dict[str, Any]] = {}
    for run_id in run_ids:
        rec: dict[str, Any] = {
            "busy": 0,  # run() raised RunBusy: another process held the lease
            "returned": 0,  # run() returned a result in this process
            "model_calls": 0,  # turns this process generated for the run
            "fired": 0,  # slow_act fires in this process for the run
            "finished": False,
            "answer": None,
            "error": None,
        }
        runs[run_id] = rec
        while True:
            if time.monotonic() > deadline:
                rec["error"] = "deadline"
                break
            model_before, fired_before = agent.model.requests, FIRED["n"]
            try:
                result = agent.run(run_id, "go")
            except da.RunBusy:
                rec["busy"] += 1
                time.sleep(rng.uniform(0.005, 0.03))
                run = store.get_run(run_id)
                if run is not None and run.status == "finished":
                    rec["finished"] = True
                    break
                if run is not None and run.finished:
                    rec["error"] = f"run ended {run.status}: {run.last_error}"
                    break
                continue
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"
                break
            finally:
                rec["model_calls"] += agent.model.requests - model_before
                rec["fired"] += FIRED["n"] - fired_before
            rec["returned"] += 1
            rec["finished"] = True
            rec["answer"] = result.answer
            break
    return {"pid": os.getpid(), "seconds": round(time.monotonic() - began, 3), "runs": runs}


def main() -> None:
    agent_name, ids = sys.argv[1:3]
    summary = race(agent_name, [i for i in ids.split(",") if i])
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    import django

    django.setup()
    # Run as the importable module, so the agent the registry finds and FIRED are one.
    from tests.support import race as this

    this.main()
