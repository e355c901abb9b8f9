"""Liveness locks for instant takeover (PostgreSQL): one connection per process that the
library owns, holding a session-level advisory lock for every lease a driver in this
process holds.

Why a connection of its own: the driver's Django connection belongs to the site's code too.
A tool that calls ``close_old_connections()`` or ``connection.close()``, a ``CONN_MAX_AGE``
expiry, a server-side idle timeout — any of them drops that connection while the driver is
alive, and a lock held there would vanish with it: the run would look abandoned. Nothing but
this module uses this connection, so it closes only when the process dies, when it has been
idle (below), or when the server drops it (then ``keep``, from the lease heartbeat,
reconnects and locks every held key again).

The lock is requested here before the lease is written and confirmed after it (the two
round trips overlap; a fresh token's key is free, so taking it never waits). Until then the
lease statement's own lock on the driver's connection covers it (``storage.py``), so a live
lease never lacks its lock. Letting go is deferred: a finished or paused run's token is
unlocked by the next statement this connection sends anyway (the next lease taken, or a
heartbeat's check), so finishing a run costs no round trip. A token kept locked after its
lease row is gone protects nothing and blocks nobody. The connection closes once it has held
nothing for ``LINGER`` to twice that (closing lets every lock go; the closer thread looks
every ``LINGER`` rather than being woken per run), so runs driven back to back share one
connection and an idle process keeps none.

A forked child (a Celery prefork pool process) never uses its parent's connection: the
registry is per process id, and psycopg does not close a connection from a process that did
not open it, so the parent's locks survive the child.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

import psycopg
from django.db import connections

log = logging.getLogger("durable_agents.liveness")
# The advisory lock key of a lease token: its md5's first 64 bits (``LOCK_HELD`` probes the
# same two halves in pg_locks).
KEY = "('x' || substr(md5({}), 1, 16))::bit(64)::bigint"
# SQL: the liveness lock of the lease token in column ``{0}`` is held by some session (the
# store's and the limits' queries judge a lease live by it under instant takeover).
LOCK_HELD = (
    "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
    "AND classid = ('x' || substr(md5({0}), 1, 8))::bit(32)::bigint::oid "
    "AND objid = ('x' || substr(md5({0}), 9, 8))::bit(32)::bigint::oid "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)
# How often a heartbeat checks that the connection (and so every lock) is still there.
_CHECK_EVERY = 1.0
# How long the connection stays open holding nothing: runs driven back to back reuse it; an
# idle process keeps no connection (a test database can be dropped: DROP DATABASE waits up to
# 5 s for other sessions to leave).
LINGER = 1.0


class Liveness:
    """The liveness locks of one process on one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._mutex = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = os.getpid()
        self._held: set[str] = set()
        self._deferred: set[str] = set()  # leased, locked on the driver's connection only
        self._unlock: set[str] = set()
        self._checked = 0.0
        self._wake = threading.Condition(self._mutex)
        self._empty_since: float | None = None
        self._closer: threading.Thread | None = None
        self._pending = False  # a statement sent whose answer is not read yet

    def defer(self, token: str) -> None:
        """A lease whose lock is, for now, only on the driver's connection (a run started in
        one write, ``storage.start_run``): locked here by the driver's next fenced write
        (``hold``) or by the heartbeat (``keep``), whichever comes first; a run that ends
        with its next write never costs this connection a statement."""
        with self._mutex:
            self._deferred.add(token)

    def deferred(self, token: str) -> bool:
        return token in self._deferred

    def hold(self, token: str) -> None:
        """Lock ``token``'s key; held until ``release``. The request is only sent here: the
        caller writes its lease meanwhile (on its own connection, which locks the key too)
        and then reads the answer with ``confirm``, so the two round trips overlap."""
        with self._mutex:
            self._deferred.discard(token)
            if token in self._held:
                return
            self._held.add(token)
            self._empty_since = None
            if token in self._unlock:  # released but not unlocked yet: still locked
                self._unlock.discard(token)
                return
            try:
                self._drain()
                self._submit([token])
            except psycopg.Error:
                self._recover_or_warn()

    def lock_now(self, token: str) -> None:
        """Lock ``token``'s key and wait until it is held; raise ``psycopg.Error`` if it
        cannot be. Behind a transaction pooler (``TRANSACTION_POOLING``) no lease statement
        locks on the driver's connection, so the lock must be held before the lease is
        written: a lease without it would look abandoned at once."""
        with self._mutex:
            self._deferred.discard(token)
            if token in self._held:
                return
            self._held.add(token)
            self._empty_since = None
            if token in self._unlock:
                self._unlock.discard(token)
                return
            try:
                self._drain()
                self._submit([token])
                self._drain()
            except psycopg.Error:
                try:
                    self._recover()
                except psycopg.Error:
                    self._held.discard(token)
                    self._close_conn()
                    self._emptied()
                    raise

    def confirm(self) -> None:
        """Wait for the answer ``hold`` asked for (a dropped connection is replaced and every
        held key locked again)."""
        with self._mutex:
            try:
                self._drain()
            except psycopg.Error:
                self._recover_or_warn()

    def _recover_or_warn(self) -> None:
        # Never fails the drive: the lease statement's own lock (on the driver's connection)
        # still holds, as before this connection existed, and the heartbeat's ``keep``
        # tries again. Meanwhile a closed driver connection would make the run look dead.
        try:
            self._recover()
        except psycopg.Error:
            self._close_conn()
            log.warning("the liveness connection failed; retrying", exc_info=True)

    def release(self, token: str) -> None:
        """Let ``token``'s lock go with the next statement (its lease is gone or never was)."""
        with self._mutex:
            self._deferred.discard(token)  # never locked here: nothing to let go
            if token in self._held:
                self._held.discard(token)
                self._unlock.add(token)
                self._emptied()

    def _emptied(self) -> None:
        # The closer thread looks at least every LINGER: no wake-up (a thread switch) here.
        if not self._held and self._conn is not None:
            self._empty_since = time.monotonic()

    def keep(self) -> None:
        """From a lease heartbeat: at most once a second, check the connection is alive
        (reconnecting and re-locking every held token if the server dropped it) and let go
        of deferred unlocks."""
        if time.monotonic() - self._checked < _CHECK_EVERY:
            return
        with self._mutex:
            if not (self._held or self._unlock or self._deferred):
                return
            lock = sorted(self._deferred)  # a drive still in its first model call
            self._held.update(lock)
            self._deferred.clear()
            if lock:
                self._empty_since = None
            try:
                self._drain()
                self._submit(lock)
                self._drain()
            except psycopg.Error:
                # Until it is back, a run whose driver's connection closed looks abandoned
                # and may be taken over (this driver is then fenced). Try again next beat.
                self._checked = time.monotonic()
                self._recover_or_warn()

    @property
    def held(self) -> frozenset[str]:
        """The tokens locked for leases this process holds."""
        with self._mutex:
            return frozenset(self._held)

    @property
    def backend_pid(self) -> int | None:
        """The server process holding the locks (tests wait for it to exit)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def close(self) -> None:
        """Close the connection: every lock goes, as when the process dies (tests)."""
        with self._mutex:
            self._held.clear()
            self._close()

    def _close(self) -> None:
        self._close_conn()
        self._empty_since = None
        self._wake.notify_all()

    def _close_conn(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None
        self._pending = False
        self._unlock.clear()  # closing let every lock go

    def _close_when_idle(self) -> None:
        """The closer thread: closes the connection once it has held nothing for LINGER."""
        with self._mutex:
            while self._conn is not None:
                since = self._empty_since
                if self._held or since is None:
                    self._wake.wait(LINGER)
                    continue
                left = since + LINGER - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                self._close()
            self._closer = None

    def _submit(self, lock: list[str]) -> None:
        """Send one statement (not waiting for it): lock ``lock``, unlock the deferred ones."""
        conn = self._conn
        if conn is None or conn.closed:
            raise psycopg.OperationalError("the liveness connection is closed")
        unlock = sorted(self._unlock)
        params = [*lock, *unlock]
        parts = [
            f"pg_try_advisory_lock_shared({KEY.format(f'${i}')})" for i in range(1, len(lock) + 1)
        ]
        parts += [
            f"pg_advisory_unlock_shared({KEY.format(f'${i}')})"
            for i in range(len(lock) + 1, len(params) + 1)
        ]
        sql = f"SELECT {', '.join(parts) or '1'}"
        conn.pgconn.send_query_params(sql.encode(), [p.encode() for p in params])
        self._pending = True
        self._unlock.clear()

    def _drain(self) -> None:
        """Read the answer of the statement ``_submit`` sent, if any."""
        if not self._pending:
            return
        self._pending = False
        conn = self._conn
        if conn is None:
            raise psycopg.OperationalError("the liveness connection is closed")
        failed = None
        while (result := conn.pgconn.get_result()) is not None:
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                failed = result.error_message.decode(errors="replace") or "failed"
        if failed is not None:
            raise psycopg.OperationalError(f"liveness lock statement: {failed}")
        self._checked = time.monotonic()

    def _recover(self) -> None:
        """Replace the connection (its locks are gone or going) and lock every held key."""
        self._close_conn()
        self._connect()
        self._submit(sorted(self._held))
        self._drain()

    def _connect(self) -> psycopg.Connection[Any]:
        params = dict(connections[self.using].get_connection_params())
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = psycopg.connect(**params, autocommit=True)
        if conn.info.server_version >= 140000:
            # A server-side idle timeout must not end a session that only holds locks.
            conn.execute("SET idle_session_timeout = 0")
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        self._conn = conn
        if self._closer is None:
            self._closer = threading.Thread(
                target=self._close_when_idle, name="durable_agents-liveness", daemon=True
            )
            self._closer.start()
        return conn


_registry: dict[tuple[Any, ...], Liveness] = {}
_registry_pid = os.getpid()
_registry_mutex = threading.Lock()


def liveness_for(using: str, settings: dict[str, Any] | None = None) -> Liveness:
    """This process's liveness locks on database alias ``using`` (as its settings are now;
    ``settings``: the alias's settings when the caller holds its connection already)."""
    db = connections[using].settings_dict if settings is None else settings
    key = (using, db.get("NAME"), db.get("HOST"), db.get("PORT"))
    if _registry_pid == os.getpid():  # the common case, on every fenced write: no lock
        found = _registry.get(key)
        if found is not None:
            return found
    with _registry_mutex:
        if _registry_pid != os.getpid():  # forked without the hook: not the parent's
            _forget_after_fork()
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = Liveness(using)
        return found


def close_all() -> None:
    """Close this process's liveness connections now (every lock goes, as at exit)."""
    with _registry_mutex:
        found = list(_registry.values())
    for liveness in found:
        liveness.close()


atexit.register(close_all)


def _forget_after_fork() -> None:
    # The parent's connections stay open for the parent (psycopg closes a connection only
    # in the process that opened it); a lock another parent thread held at fork is replaced.
    global _registry_pid, _registry_mutex
    _registry.clear()
    _registry_pid = os.getpid()
    _registry_mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
