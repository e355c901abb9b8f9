"""Answer a run's question in this process and print what happened, as one JSON line.

    python -m tests.support.answer <run_id> <name> <json value> <username>

Crash points come from the environment (DURABLE_AGENTS_CRASH_AT, DA_CRASH_AFTER_ANSWER).
"""

import json
import sys

import django

django.setup()

import durable_agents as da  # noqa: E402


def main() -> None:
    run_id, name, value, by = sys.argv[1:5]
    outcome = da.answer_interrupt(run_id, name, json.loads(value), by=by)
    print(json.dumps({"recorded": outcome.recorded, "value": outcome.value}), flush=True)


if __name__ == "__main__":
    main()
