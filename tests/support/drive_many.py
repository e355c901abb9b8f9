"""Drive many runs in this process, in threads, through database outages, and print how each
ended as one JSON line.

    python -m tests.support.drive_many <agent> <threads> <deadline seconds> <run id>...

A thread takes a run and drives it (``agent.run``) until it finishes or halts: a lease
another driver holds, or an error while the database is down, is tried again (after closing
the thread's connections) until the deadline. Used by the PostgreSQL crash test.
"""

import json
import queue
import sys
import threading
import time

import django

django.setup()

from django.db import connections  # noqa: E402

import durable_agents as da  # noqa: E402
from durable_agents.engine.agent import get_agent  # noqa: E402

_print = threading.Lock()


def drive(agent: da.Agent, run_id: str, deadline: float) -> dict:
    errors = 0
    last = ""
    while time.monotonic() < deadline:
        try:
            result = agent.run(run_id, "go")
            return {"run": run_id, "status": "finished", "answer": result.answer, "errors": errors}
        except da.OutcomeUnknown as exc:
            return {"run": run_id, "status": "halted", "halts": exc.details.get("halts")}
        except da.RunBusy:
            time.sleep(0.05)
        except Exception as exc:  # the database is down or just came back: try again
            errors += 1
            last = f"{type(exc).__name__}: {exc}"[:300]
            connections.close_all()
            time.sleep(0.2)
    return {"run": run_id, "status": "timeout", "errors": errors, "last": last}


def main() -> None:
    agent_name, threads, seconds, *run_ids = sys.argv[1:]
    agent = get_agent(agent_name)
    deadline = time.monotonic() + float(seconds)
    todo: queue.Queue[str] = queue.Queue()
    for run_id in run_ids:
        todo.put(run_id)

    def work() -> None:
        try:
            while True:
                try:
                    run_id = todo.get_nowait()
                except queue.Empty:
                    return
                out = drive(agent, run_id, deadline)
                with _print:
                    print(json.dumps(out), flush=True)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=work) for _ in range(int(threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


if __name__ == "__main__":
    main()
