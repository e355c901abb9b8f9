"""A child process holding a run's lease, for the liveness tests: its process is the holder.

    python -m tests.support.lease_holder <run_id> <token>

Leases the run, prints "leased", then obeys one command a line on stdin, answering each:
``close`` closes this process's Django connections (a library calling
``close_old_connections()``; prints "closed"), ``renew`` renews the lease (prints "True" or
"False"), ``locks`` prints whether this process still holds the token's liveness lock and
``backend`` the server pid of its liveness connection.
"""

import sys

import django

django.setup()

from django.db import connections  # noqa: E402

from durable_agents.storage import DjangoStore  # noqa: E402


def main() -> None:
    run_id, token = sys.argv[1:3]
    store = DjangoStore()
    assert store.acquire_lease(run_id, "child", token, 30)
    print("leased", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "close":
            connections.close_all()
            print("closed", flush=True)
        elif command == "renew":
            print(store.renew_lease(run_id, token, 30), flush=True)
        elif command == "locks":
            live = store._liveness()
            print(live is not None and live.holds(token), flush=True)
        elif command == "backend":
            conn = store._liveness()._conn  # type: ignore[union-attr]
            print(conn.info.backend_pid if conn is not None else None, flush=True)


if __name__ == "__main__":
    main()
