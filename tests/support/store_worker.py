"""A child process for the conformance suite: insert one name in a DjangoStore on a signal.

Usage: python -m tests.support.store_worker <alias> <run_id> <name> <data>
Prints "ready", waits for a line on stdin, inserts, prints "<inserted> <seq> <data>".
"""

import sys

import django

django.setup()

from django.db import connections  # noqa: E402

from durable_agents.database.store import DjangoStore  # noqa: E402


def main() -> None:
    alias, run_id, name, data = sys.argv[1:5]
    store = DjangoStore(using=alias)
    connections[alias].ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()
    entry, inserted = store.insert(run_id, name, data)
    print(f"{int(inserted)} {entry.seq} {entry.data}", flush=True)


if __name__ == "__main__":
    main()
