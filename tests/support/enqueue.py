"""Enqueue a message for a run in this process and print what happened, as one JSON line.

    python -m tests.support.enqueue <run_id> <channel> <key> <json payload>

Crash points come from the environment (DURABLE_AGENTS_CRASH_AT, DA_CRASH_BEFORE_ACK, ...).
"""

import json
import sys

import django

django.setup()

import durable_agents as da  # noqa: E402


def main() -> None:
    run_id, channel, key, payload = sys.argv[1:5]
    outcome = da.enqueue(run_id, channel, key, json.loads(payload))
    print(json.dumps({"recorded": outcome.recorded, "value": outcome.value}), flush=True)


if __name__ == "__main__":
    main()
