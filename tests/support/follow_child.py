"""Follow one run in this process, printing each item as a line, until killed.

    python -m tests.support.follow_child <run_id> <keep-alive seconds>

A record prints as its seq, a status as itself, a keep-alive as ``-``. It follows through
pauses, until the run ends.
"""

import sys

import django

django.setup()

from durable_agents.database.events import ticks_of  # noqa: E402
from durable_agents.engine.follow import ends  # noqa: E402
from durable_agents.engine.records import Record  # noqa: E402


def main() -> None:
    for item in ticks_of(sys.argv[1], idle=float(sys.argv[2]), stop=ends):
        line = str(item.seq) if isinstance(item, Record) else "-" if item is None else item
        print(line, flush=True)


if __name__ == "__main__":
    main()
