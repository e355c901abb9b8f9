"""The glue that talks to the site's database (PostgreSQL first, SQLite too).

* ``store`` — ``DjangoStore``, the engine's Store port on Django's connection: the fenced
  journal insert, leases, runs and their projections.
* ``prepared`` — the hot statements as server-side prepared statements (PostgreSQL).
* ``liveness`` — session advisory locks for instant takeover, on a connection of their own.
* ``events`` and ``followers`` — ``LISTEN``/``NOTIFY`` for live events, only while followed.
* ``audit`` — verifying the hash chains the database computes; signed heads.
* ``retention`` — ``prune``: export, delete in batches, leave signed tombstones.
* ``tombstones`` — what vouches for a tombstone: its signature and its prune row.

The engine never imports this package; ``apps.py`` plugs it into the engine's ports.
"""
