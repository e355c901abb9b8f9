"""A run's journal records as they are committed: ``events(run_id, after=0)``.

On PostgreSQL every journal insert and every change of a run's status notifies the run's
channel (triggers installed by migration 0006); a follower ``LISTEN``s on a dedicated
autocommit connection of its own, *then* reads the backlog, then reads again whenever a
notification arrives, so no record committed in between is missed and none is repeated (each
read starts after the last ``seq`` seen). The dedicated connection is closed when the
iterator ends or is closed. On SQLite (or any other database) it polls every
``POLL_SECONDS``.

It ends when the run ends or pauses (see ``engine.events``). ``agent.events(run_id)`` is
the same iterator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
from django.db import connections

from .engine.events import POLL_SECONDS, Wait, polling, ticks
from .engine.records import Record
from .storage import DjangoStore, site_store

IDLE_SECONDS = 15.0


def channel(run_id: str) -> str:
    """The ``NOTIFY`` channel of a run (a channel name is at most 63 bytes; run ids are
    longer): ``da_run_`` and the MD5 of the id, as the trigger computes it."""
    return "da_run_" + hashlib.md5(run_id.encode()).hexdigest()


def listen_connection(using: str) -> psycopg.Connection[Any]:
    """A new autocommit connection to the database ``using`` names, with its settings."""
    params = dict(connections[using].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


def _notified(conn: psycopg.Connection[Any]) -> Wait:
    def wait(timeout: float) -> bool:
        heard = False
        for _ in conn.notifies(timeout=timeout, stop_after=1):
            heard = True
        if heard:  # several commits may have notified: one read covers them all
            for _ in conn.notifies(timeout=0.0):
                pass
        return heard

    return wait


def ticks_of(
    run_id: str,
    after: int = 0,
    *,
    store: DjangoStore | None = None,
    idle: float = IDLE_SECONDS,
    poll: float = POLL_SECONDS,
) -> Iterator[Record | None]:
    """``events``, with ``None`` after every ``idle`` seconds without a record (a stream
    sends a keep-alive then; writing it is also how a server learns the client left)."""
    store = store or site_store()
    if not store.dialect.postgres:
        yield from ticks(store, run_id, after, wait=polling(poll), idle=idle)
        return
    conn = listen_connection(store.using)
    try:
        conn.execute(f'LISTEN "{channel(run_id)}"')
        yield from ticks(store, run_id, after, wait=_notified(conn), idle=idle)
    finally:
        conn.close()


def events(run_id: str, after: int = 0, *, store: DjangoStore | None = None) -> Iterator[Record]:
    """The journal records of ``run_id`` with ``seq > after``, each as it is committed, in
    ``seq`` order; the iterator ends when the run ends or pauses (read the backlog and
    return at once for a run that already has). Resume a broken stream with ``after=`` the
    last ``seq`` you got. Raises ``NotFound`` (``run.not_found``) for an unknown run.
    Close the iterator (or leave its ``for`` loop) to free its connection early."""
    for record in ticks_of(run_id, after, store=store):
        if record is not None:
            yield record
