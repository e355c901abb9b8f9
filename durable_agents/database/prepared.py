"""The store's hot statements as server-side prepared statements sent through libpq itself.

A psycopg cursor's ``execute`` spends 60 to 130 µs of Python per statement on this machine
(query conversion, its prepared-statement cache, the wait generator); a journal record is
one statement, so that is a third of what a record costs the driver. Here the statement is
prepared once per connection with ``PGconn.prepare`` and run with ``PGconn.exec_prepared``
(libpq's blocking call, which releases the GIL), its parameters dumped and its rows loaded
by psycopg's own C ``Transformer`` with the cursor's adapters: the same types both ways.

Only in autocommit: inside a transaction psycopg must see every statement (it begins the
transaction on the first one), so the caller uses the cursor there. Errors are psycopg's
own classes, built from the result as psycopg builds them.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, cast

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

_PLACEHOLDER = re.compile(r"%s|%%")
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_COUNT = itertools.count()


def _numbered(sql: str) -> bytes:
    """``%s`` placeholders as ``$1``, ``$2``…, ``%%`` as ``%``."""
    n = 0

    def number(match: re.Match[str]) -> str:
        nonlocal n
        if match.group() == "%%":
            return "%"
        n += 1
        return f"${n}"

    return _PLACEHOLDER.sub(number, sql).encode()


class Prepared:
    """The statements prepared on one psycopg connection (made again after a reconnect)."""

    def __init__(self, raw: psycopg.Connection[Any], context: Any) -> None:
        self.pgconn = raw.pgconn
        self._encoding = raw.info.encoding
        self._tx = Transformer(context)
        self._names: dict[tuple[str, tuple[int, ...]], bytes] = {}

    def execute(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        tx = self._tx
        values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
        types = tuple(tx.types or ())
        formats = tx.formats
        key = (sql, types)
        try:
            result = self._run(key, values, formats)
        except errors.InvalidSqlStatementName:
            # psycopg sends DEALLOCATE ALL after a schema change it ran (its own cache is
            # then stale too): nothing ran; prepare again and run it once more.
            self._names.clear()
            result = self._run(key, values, formats)
        if result.status != pq.ExecStatus.TUPLES_OK or not result.ntuples:
            return []
        tx.set_pgresult(result)
        rows: list[tuple[Any, ...]] = tx.load_rows(0, result.ntuples, tuple)
        return rows

    def _run(self, key: tuple[str, tuple[int, ...]], values: Any, formats: Any) -> Any:
        name = self._names.get(key)
        if name is None:
            # Never a name used before in this process: a pooled connection may come back
            # to another thread's wrapper with statements an earlier one prepared on it.
            name = f"_durable_agents_{next(_COUNT)}".encode()
            self._check(self.pgconn.prepare(name, _numbered(key[0]), key[1] or None))
            self._names[key] = name
        # (None is SQL NULL here, as psycopg itself sends it; the stub says bytes only.)
        result = self.pgconn.exec_prepared(name, cast(Any, values), formats, 0)
        self._check(result)
        return result

    def _check(self, result: pq.abc.PGresult) -> None:
        if result.status not in _OK:
            if self.pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(
                    self.pgconn.error_message.decode(errors="replace") or "connection lost"
                )
            raise _error(result, self._encoding)


def _error(result: Any, encoding: str) -> psycopg.Error:
    """The exception psycopg raises for a failed result: its class for the SQLSTATE, with
    the server's diagnostics (psycopg's own builder where this version has it)."""
    build = getattr(errors, "error_from_result", None)
    if build is not None:
        error: psycopg.Error = build(result, encoding=encoding)
        return error
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    message = result.error_message.decode(encoding, errors="replace").strip()
    try:
        cls = errors.lookup(state.decode()) if state else psycopg.DatabaseError
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message)
