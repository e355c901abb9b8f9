"""A child process for tests/acceptance/test_stops_crash.py (issue 29); prints one JSON line.

    python -m tests.support.tree_child cancel <run_id> [compensate]
    python -m tests.support.tree_child approve <run_id> <call_id> [<edit as JSON>]
    python -m tests.support.tree_child answer <run_id> <name> <value> <prompt shown>

Each acts as the user ``ann``; ``DURABLE_AGENTS_CRASH_AT`` names the point to die at
(``after-cancel:<run>``, ``after-answer:<name>``, ``after-result:<call>``…)."""

import json
import sys

import django

django.setup()

import durable_agents as da  # noqa: E402


def cancel(run_id: str, how: str = "") -> dict:
    da.cancel(run_id, by="ann", reason="called off", compensate=how == "compensate")
    return {"status": "cancelled"}


def approve(run_id: str, call_id: str, edit: str = "null") -> dict:
    try:
        outcome = da.approve(run_id, call_id, True, by="ann", edit=json.loads(edit))
    except da.DurableAgentsError as exc:
        return {"status": "refused", "code": exc.code}
    return {"status": outcome.status}


def answer(run_id: str, name: str, value: str, prompt: str) -> dict:
    try:
        outcome = da.answer_interrupt(run_id, name, value, by="ann", prompt=prompt)
    except da.DurableAgentsError as exc:
        return {"status": "refused", "code": exc.code}
    return {"status": "recorded" if outcome.recorded else "same"}


def main() -> None:
    command, *args = sys.argv[1:]
    out = {"cancel": cancel, "approve": approve, "answer": answer}[command](*args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
