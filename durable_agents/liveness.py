"""The process's liveness connection: where its leases' liveness locks live (PostgreSQL).

Instant takeover needs a lock that dies with the process and with nothing else. A Django
connection is the wrong place for it: a tool, a library or a request cycle may close it
(``close_old_connections()`` with ``CONN_MAX_AGE = 0``, ``connection.close()``), and a live
driver would look dead. So each process opens one connection of its own per database, with
psycopg directly, and takes every lease's lock on it; nothing but this module uses or closes
it. One connection per process, not per lease: the leases of all threads share it, behind a
lock (each statement is one short round trip).

A SIGKILLed process's socket closes with it, and the server releases every lock at once; a
SIGSTOPped one keeps its socket and its locks. If the connection itself drops (a server-side
timeout, a restart), the next renewal reconnects and takes the locks again before it renews
the lease; a lease someone took meanwhile is then refused by the renewal, as before.

The lock is taken *before* the lease is granted and let go *after* the lease is deleted, so a
lease is never live without its lock while its driver is alive. Taking it costs one round
trip on acquire; letting it go costs none of its own: the unlock rides on the process's next
lock or renewal (a lock keyed by a deleted lease's token vouches for nothing).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

import psycopg

# A lock per lease token; the key is the token's md5, first 64 bits (the probe in
# storage.py reads it back from pg_locks).
_LOCK_KEY = "('x' || substr(md5({}), 1, 16))::bit(64)::bigint"
_UNLOCK_SPENT = (
    f"(SELECT count(pg_advisory_unlock({_LOCK_KEY.format('t')})) FROM unnest(%s::text[]) AS s(t))"
)
_SPENT_MAX = 32
APPLICATION_NAME = "durable_agents liveness"
# Settings psycopg.connect does not take, or that this connection must not inherit.
_NOT_FOR_US = ("cursor_factory", "context", "prepare_threshold", "pool", "server_side_binding")


class Liveness:
    """The liveness locks this process holds on one database."""

    def __init__(self, params: dict[str, Any]) -> None:
        self._params = params
        self._conn: psycopg.Connection[Any] | None = None
        self._tokens: set[str] = set()
        # Tokens let go whose server-side lock is still to be unlocked: with the next
        # statement on the connection (a lock or a renewal), not in a round trip of its own.
        # A lock keyed by a deleted lease's token vouches for nothing: nobody probes it.
        self._spent: list[str] = []
        self._lock = threading.Lock()

    def hold(self, token: str, *, check: bool = False) -> bool:
        """Hold ``token``'s lock (again, if the connection dropped); False if another session
        holds it. ``check``: also make sure the connection still answers (a renewal)."""
        with self._lock:
            try:
                return self._hold(token, check=check)
            except psycopg.OperationalError:
                # It dropped since it last answered: once more, on a new one.
                self._drop()
                return self._hold(token, check=False)

    def _hold(self, token: str, *, check: bool) -> bool:
        conn = self._connected(check=check)
        if token in self._tokens:
            return True
        if token in self._spent:  # let go, but still locked on the server: keep it
            self._spent.remove(token)
            self._tokens.add(token)
            return True
        if not self._try(conn, token):
            return False
        self._tokens.add(token)
        return True

    def let_go(self, token: str) -> None:
        """Let ``token``'s lock go (nothing if this process does not hold it). Call it after
        the lease is deleted, or known lost: the server-side unlock rides on the next
        statement (``_SPENT_MAX`` at most wait)."""
        with self._lock:
            if token not in self._tokens:
                return
            self._tokens.discard(token)
            conn = self._conn
            if conn is None or conn.closed:
                return  # the server let it go with the connection
            self._spent.append(token)
            if len(self._spent) >= _SPENT_MAX:
                try:
                    self._unlock_spent(conn)
                except psycopg.Error:
                    # The connection broke: its locks are gone; the others are taken again
                    # on the next renewal.
                    self._drop()

    def holds(self, token: str) -> bool:
        with self._lock:
            return token in self._tokens

    def held(self) -> int:
        """How many leases' locks this process holds on this database."""
        with self._lock:
            return len(self._tokens)

    def close_if_idle(self) -> bool:
        """Close the connection if it holds no lock (a test database about to be dropped)."""
        with self._lock:
            if self._tokens:
                return False
            self._drop()
            return True

    def close(self) -> None:
        with self._lock:
            self._tokens = set()
            self._drop()

    def _unlock_spent(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SELECT {_UNLOCK_SPENT}", [self._spent])
        self._spent = []

    def _connected(self, *, check: bool) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed and check:
            try:
                self._unlock_spent(conn)  # one statement: does it still answer?
            except psycopg.Error:
                self._drop()
                conn = None
        if conn is None or conn.closed:
            conn = self._conn = psycopg.connect(**self._params, autocommit=True)
            self._spent = []
            # The locks the old connection held went with it: take them again. The caller
            # then checks the leases (a renewal), which refuses any taken meanwhile.
            for token in list(self._tokens):
                if not self._try(conn, token):
                    self._tokens.discard(token)
        return conn

    def _try(self, conn: psycopg.Connection[Any], token: str) -> bool:
        row = conn.execute(
            f"SELECT pg_try_advisory_lock({_LOCK_KEY.format('%s')}), {_UNLOCK_SPENT}",
            [token, self._spent],
        ).fetchone()
        self._spent = []
        return bool(row and row[0])

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._spent = []  # their locks go with the connection
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _forget_after_fork(self) -> None:
        # The parent's connection is the parent's: closing it here would end the parent's
        # session (and its locks). Keep it out of reach of the garbage collector instead.
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._tokens = set()
        self._spent = []
        self._lock = threading.Lock()


_registry: dict[tuple[tuple[str, str], ...], Liveness] = {}
_registry_lock = threading.Lock()
_INHERITED: list[Any] = []


def for_database(connection_params: dict[str, Any]) -> Liveness:
    """The process's liveness connection to the database ``connection_params`` name (the
    Django backend's ``get_connection_params()``)."""
    params = {k: v for k, v in connection_params.items() if k not in _NOT_FOR_US}
    params["application_name"] = APPLICATION_NAME
    key = tuple(sorted((k, str(v)) for k, v in params.items()))
    with _registry_lock:
        liveness = _registry.get(key)
        if liveness is None:
            liveness = _registry[key] = Liveness(params)
        return liveness


def close_idle() -> None:
    """Close every liveness connection that holds no lock."""
    with _registry_lock:
        for liveness in _registry.values():
            liveness.close_if_idle()


def close_all() -> None:
    """Close every liveness connection, locks or not (at exit; a test database about to be
    dropped): a lease this process still holds may then be taken over at once."""
    with _registry_lock:
        for liveness in _registry.values():
            liveness.close()


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for liveness in _registry.values():
        liveness._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(close_all)
