"""A child process for tests/acceptance/test_unknown_outcomes.py; prints one JSON line.

    python -m tests.support.holes_child send_once <agent> <session> <key> <text>
    python -m tests.support.holes_child step <alias> <run_id> <name>

    python -m tests.support.holes_child fork <run_id> <step>
    python -m tests.support.holes_child approve <run_id> <call_id> <yes|no> [<edit as JSON>]
    python -m tests.support.holes_child resolve <run_id> <call_id> <result as JSON>

``step`` runs ``Journal.step(run_id, name, fn)`` where ``fn`` fires one counted effect
(``DA_CRASH_INSIDE=step:<name>`` kills the process right after it fired). ``fork``,
``approve`` and ``resolve`` act as the user ``ann`` (``DURABLE_AGENTS_CRASH_AT`` names the
point to die at: ``after-fork-row``, ``after-decision:<call>``, ``after-resolution:<call>``).
"""

import json
import sys

import django

django.setup()

import durable_agents as da  # noqa: E402
from durable_agents.database.store import DjangoStore  # noqa: E402
from durable_agents.engine.agent import get_agent  # noqa: E402
from tests.support.agents import fire  # noqa: E402


def send_once(agent: str, session: str, key: str, text: str) -> dict:
    sent = get_agent(agent).session(session).send_once(key, text)
    return {"status": sent.status, "run_id": sent.run_id}


def step(alias: str, run_id: str, name: str) -> dict:
    def effect() -> dict:
        ctx = da.ToolContext(run_id, f"step:{name}", "step", "")
        fire(ctx, "step")
        return {"charged": True}

    try:
        value = da.Journal(DjangoStore(using=alias)).step(run_id, name, effect)
    except da.OutcomeUnknown as exc:
        return {"status": "halted", "op": exc.details["halts"][0]}
    return {"status": "ok", "value": value}


def fork(run_id: str, step: str) -> dict:
    return {"fork": da.fork(run_id, int(step), by="ann")}


def approve(run_id: str, call_id: str, verdict: str, edit: str = "null") -> dict:
    outcome = da.approve(run_id, call_id, verdict == "yes", by="ann", edit=json.loads(edit))
    return {"status": outcome.status}


def resolve(run_id: str, call_id: str, result: str) -> dict:
    record = da.resolve_halt(run_id, call_id, json.loads(result), by="ann")
    return {"result": record.get("result")}


def main() -> None:
    command, *args = sys.argv[1:]
    commands = {
        "send_once": send_once,
        "step": step,
        "fork": fork,
        "approve": approve,
        "resolve": resolve,
    }
    out = commands[command](*args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
