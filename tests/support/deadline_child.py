"""A child process for tests/acceptance/test_deadlines_crash.py (issue 42); prints one JSON
line.

    python -m tests.support.deadline_child sweep
    python -m tests.support.deadline_child approve <run_id> <call_id> <username>

``sweep`` is one timer sweep (``wake_timers``: the approval deadlines' steps due);
``DURABLE_AGENTS_CRASH_AT`` names the point to die at (``after-deadline:<call>:<step>``,
``after-expiry-decision:<call>``, ``after-expiry:<call>``)."""

import json
import sys

import django

django.setup()

import durable_agents as da  # noqa: E402
from durable_agents.engine.commands.timers import wake_timers  # noqa: E402


def sweep() -> dict:
    return {"woken": wake_timers()}


def approve(run_id: str, call_id: str, by: str) -> dict:
    try:
        outcome = da.approve(run_id, call_id, True, by=by)
    except da.DurableAgentsError as exc:
        return {"status": "refused", "code": exc.code}
    return {"status": outcome.status}


def main() -> None:
    command, *args = sys.argv[1:]
    out = {"sweep": sweep, "approve": approve}[command](*args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
