"""The simulator's PostgreSQL lane: the same actors and invariants over ``DjangoStore`` on the
test database, with a real session per simulated process.

- **The virtual clock inside the server.** Schema ``sim`` holds ``now()``,
  ``statement_timestamp()`` (Django's ``Now()``), ``transaction_timestamp()`` and
  ``clock_timestamp()``, each returning the session's ``sim.now`` setting (the virtual time)
  and the built-in when it is unset. Lane sessions run with ``search_path = sim, public,
  pg_catalog`` (``pg_catalog`` last, so ``sim`` overrides it), which the journal's plpgsql
  triggers see too. Column defaults (``db_default=Now()``) were bound to the built-in when
  the migration ran, so ``install`` rebinds them to ``sim`` for the lane and ``uninstall``
  back (other sessions, with no ``sim.now``, still get the real time). Before each store
  call a session whose ``sim.now`` is behind the virtual clock is set to it: one round trip
  per clock move a session sees. (Measured on this machine's server: ``set_config`` 54 µs
  and ``now()`` 52 µs, against a one-row clock table the scheduler updates at 66 µs unlogged,
  139 µs logged, and ``now()`` reading it at 61 µs; the setting is cheaper, and leaves every
  other session on the real clock.)
- **One session per process.** Django's connections are thread-local and every greenlet
  shares the thread, so each ``Proc`` has a storage of its own, swapped in around its
  greenlet (``World.resume``) and around each store call made for it. A crash closes its
  connections at the psycopg level and waits until the server has let go of their locks
  (``pg_locks``), so a successor's takeover never races the server's cleanup; a process that
  ends closes them the same way.
- **Instant takeover** (``store="postgres"``). Each process's store has a ``Liveness`` of
  its own, so its advisory locks die with it and a successor takes its live lease at once;
  the lane checks as it happens that a lease taken before it expired was a gone process's
  (``takeovers_true``). The liveness closer thread and its once-a-second ``keep`` run by the
  real clock, but they only decide when a connection holding nothing closes and whether a
  lock is held on one of a process's two connections or on both; both close together here,
  so no outcome depends on them. ``store="postgres-expiry"`` turns instant takeover off:
  leases are then taken over on expiry only, as in memory, and a seed runs the memory lane's
  schedule step for step unless the two stores answer a call differently.
- **Seeds are isolated**: every seed starts from empty tables (``TRUNCATE … RESTART
  IDENTITY``), so seqs and ids replay.

The lane exposes exactly the ``InMemoryStore``'s methods (the port the simulator knows): the
Django store's extras (``announce``, ``check_can_drive``) are left to the engine's
``getattr`` defaults, so a seed's schedule has the same scheduling points on both lanes.
"""

from __future__ import annotations

import contextlib
import copy
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from durable_agents.engine.memstore import InMemoryStore

if TYPE_CHECKING:
    from .world import Proc, World

ALIAS = "default"
SEARCH_PATH = "sim,public,pg_catalog"
# The database clock's functions the code calls (``now()`` in raw SQL and triggers,
# ``STATEMENT_TIMESTAMP()`` from Django's ``Now()``) and their siblings.
CLOCKS = ("now", "statement_timestamp", "transaction_timestamp", "clock_timestamp")
# The Store port as the simulator knows it: InMemoryStore's public methods.
PORT = frozenset(
    name
    for name in vars(InMemoryStore)
    if not name.startswith("_") and callable(getattr(InMemoryStore, name))
)
_DEFAULTS = (
    "SELECT c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d "
    "JOIN pg_class c ON c.oid = d.adrelid "
    "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
    "WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY(%s)"
)
_CLOCK_CALL = re.compile(r"\b(?:pg_catalog\.|sim\.)?(" + "|".join(CLOCKS) + r")\(\)")


def _tables() -> list[str]:
    from django.apps import apps

    return sorted(
        m._meta.db_table
        for m in apps.get_app_config("durable_agents").get_models()
        if m._meta.managed and not m._meta.proxy
    )


class Database:
    """The lane's hold on the test database for a test session: the ``sim`` schema and one
    connection of the scheduler's own (its reads, the truncates, the lock polls)."""

    def __init__(self) -> None:
        from django.db import connections

        # The test database's settings, as pytest-django set them up.
        self.settings = copy.deepcopy(connections[ALIAS].settings_dict)
        self.tables = _tables()
        self.main = Session(self, "scheduler")
        self.installed = False

    def raw(self) -> Any:
        return self.main.raw()

    def install(self) -> None:
        """Create schema ``sim`` and bind the app's clock defaults to it."""
        raw = self.raw()
        with raw.transaction():
            raw.execute("CREATE SCHEMA IF NOT EXISTS sim")
            for fn in CLOCKS:
                volatility = "VOLATILE" if fn == "clock_timestamp" else "STABLE"
                raw.execute(
                    f"CREATE OR REPLACE FUNCTION sim.{fn}() RETURNS timestamptz "
                    f"LANGUAGE sql {volatility} PARALLEL SAFE AS $$ SELECT coalesce("
                    "nullif(pg_catalog.current_setting('sim.now', true), '')::timestamptz, "
                    f"pg_catalog.{fn}()) $$"
                )
            self._rebind(raw, "sim")
        self.installed = True

    def uninstall(self) -> None:
        """Bind the defaults back to the built-ins, drop ``sim``, empty the tables."""
        raw = self.raw()
        with raw.transaction():
            self._rebind(raw, "pg_catalog")
            raw.execute("DROP SCHEMA IF EXISTS sim CASCADE")
            self.truncate()
        self.installed = False

    def _rebind(self, raw: Any, schema: str) -> None:
        for table, column, expr in raw.execute(_DEFAULTS, [self.tables]).fetchall():
            bound = _CLOCK_CALL.sub(rf"{schema}.\1()", expr)
            if bound != expr:
                raw.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" SET DEFAULT {bound}')

    def truncate(self) -> None:
        self.raw().execute(f"TRUNCATE {', '.join(self.tables)} RESTART IDENTITY")

    def wait_gone(self, pids: list[int]) -> None:
        """Until the server has let go of every lock of these (closed) sessions."""
        deadline = time.monotonic() + 10.0
        raw = self.raw()
        while raw.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = ANY(%s))", [pids], prepare=True
        ).fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sessions {pids} still hold locks 10 s after closing")
            time.sleep(0.0002)

    def close(self) -> None:
        self.main.close(wait=False)


class Session:
    """One simulated process's side of the database: its Django connections (a storage of
    its own for ``connections``), its ``DjangoStore`` and its liveness locks."""

    def __init__(self, db: Database, name: str, *, instant: bool = True) -> None:
        from django.db.utils import load_backend

        from durable_agents.database.liveness import Liveness
        from durable_agents.database.store import DjangoStore

        self.db = db
        self.name = name
        settings = copy.deepcopy(db.settings)
        options = dict(settings.get("OPTIONS") or {})
        options["options"] = f"{options.get('options', '')} -c search_path={SEARCH_PATH}".strip()
        settings["OPTIONS"] = options
        self.wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, ALIAS)
        self.storage = threading.local()
        setattr(self.storage, ALIAS, self.wrapper)
        self.liveness = Liveness(ALIAS)
        self.store = DjangoStore(ALIAS, liveness=self.liveness, instant_takeover=instant)
        self.synced: tuple[Any, float] | None = None  # (connection, virtual time it was set to)
        self.closed = False

    def raw(self) -> Any:
        """This session's psycopg connection (connected if need be)."""
        assert not self.closed, f"{self.name}'s session is closed"
        with _storage(self.storage):
            self.wrapper.ensure_connection()
        return self.wrapper.connection

    def sync(self, now: float) -> None:
        """Set ``sim.now`` to the virtual time, once per clock move this session sees."""
        raw = self.raw()
        if self.synced is not None and self.synced[0] is raw and self.synced[1] == now:
            return
        stamp = datetime.fromtimestamp(now, tz=UTC).isoformat()
        raw.execute("SELECT pg_catalog.set_config('sim.now', %s, false)", [stamp], prepare=True)
        self.synced = (raw, now)

    def close(self, *, wait: bool = True) -> None:
        """Close every connection at the psycopg level (the server rolls back and lets go of
        the locks), then, with ``wait``, until the server has let go of them."""
        if self.closed:
            return
        self.closed = True
        pids = []
        raw = self.wrapper.connection
        if raw is not None and not raw.closed:
            pids.append(raw.info.backend_pid)
            raw.close()
        self.wrapper.connection = None
        pid = self.liveness.backend_pid
        if pid is not None:
            pids.append(pid)
        self.liveness.close()
        if wait and pids:
            self.db.wait_gone(pids)


def _handler_local() -> Any:
    from django.db import connections

    return connections._connections


@contextlib.contextmanager
def _storage(storage: Any) -> Iterator[None]:
    """``connections`` as seen through ``storage`` (this thread's, for the duration)."""
    local = _handler_local()
    saved = object.__getattribute__(local, "_storage")
    object.__setattr__(local, "_storage", storage)
    try:
        yield
    finally:
        object.__setattr__(local, "_storage", saved)


_database: Database | None = None


def database() -> Database:
    """The lane's database for this test session (``install``ed by the test's fixture)."""
    global _database
    if _database is None:
        _database = Database()
    return _database


def shutdown() -> None:
    """Undo ``install`` and close the scheduler's connection (before the test database goes)."""
    global _database
    db, _database = _database, None
    if db is not None:
        try:
            if db.installed:
                db.uninstall()
        finally:
            db.close()


class Lane:
    """One seed's world on PostgreSQL: a session per process, made as it first moves."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.db = database()
        assert self.db.installed, "the PostgreSQL lane needs pg_lane.database().install()"
        self.db.truncate()
        # "postgres-expiry": instant takeover off, so a lease is taken over only once it
        # expires, as on the memory lane; a seed then runs the memory lane's schedule step
        # for step, unless the two stores answer a call differently.
        self.instant = world.config.store == "postgres"
        self.sessions: dict[int, Session] = {}  # pid -> its session
        self.owners: dict[str, Session] = {}  # lease token -> the session that took it
        self.saved: list[Any] = []
        self.store = LaneStore(self)
        self.closed = False

    def session(self, proc: Proc) -> Session:
        found = self.sessions.get(proc.pid)
        if found is None:
            name = f"{proc.actor.name}#{proc.pid}"
            found = self.sessions[proc.pid] = Session(self.db, name, instant=self.instant)
        return found

    def enter(self, proc: Proc) -> None:
        """Swap ``proc``'s connections in (``World.resume``, around its greenlet)."""
        local = _handler_local()
        self.saved.append(object.__getattribute__(local, "_storage"))
        object.__setattr__(local, "_storage", self.session(proc).storage)

    def leave(self) -> None:
        object.__setattr__(_handler_local(), "_storage", self.saved.pop())

    def ended(self, proc: Proc) -> None:
        """``proc`` crashed or finished: its process is gone, and the server knows it."""
        session = self.sessions.pop(proc.pid, None)
        if session is not None:
            session.close()

    def close(self) -> None:
        """Close every process's session (the end of the seed), until the server has let go
        of their locks: the next seed's processes use the same tokens (seeded uuids). The
        scheduler's connection stays: what the world shows (``coverage``) is read after."""
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()
        self.owners.clear()
        self.closed = True

    def for_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Session:
        proc = self.world.current
        if proc is not None:
            return self.session(proc)
        if name in ("renew_lease", "release_lease") and len(args) > 1:
            # The heartbeat renews from the scheduler, for the process that holds the lease.
            owner = self.owners.get(args[1])
            if owner is not None and not owner.closed:
                return owner
            if owner is not None:
                self.world.count("lane: renewal for a process that ended")
        return self.db.main

    def taken_live(self, previous: Any) -> None:
        """A lease taken before it expired (instant takeover) must be a gone process's."""
        owner = self.owners.get(previous.token)
        if owner is not None and owner.closed:
            self.world.count("instant takeovers")
            return
        self.world.violate(
            "takeovers_true",
            f"run {previous.run_id}: the lease {previous.token} was taken over before it "
            f"expired ({previous.expires_at}) while its holder "
            f"{owner.name if owner else '(unknown)'} was alive",
            hole="new",
        )

    def last_seq(self) -> int:
        from durable_agents.models import JournalEntry

        row = self.db.raw().execute(
            f"SELECT coalesce(max(seq), 0) FROM {JournalEntry._meta.db_table}", prepare=True
        )
        return int(row.fetchone()[0])


class LaneStore:
    """The store the lane's world sees (``World.raw``): each call runs on the session of the
    process making it (the scheduler's own outside any), with the virtual clock set there."""

    def __init__(self, lane: Lane) -> None:
        self._lane = lane

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in PORT:
            raise AttributeError(name)
        lane = self._lane

        def call(*args: Any, **kwargs: Any) -> Any:
            session = lane.for_call(name, args, kwargs)
            with _storage(session.storage):
                session.sync(lane.world.now)
                result = getattr(session.store, name)(*args, **kwargs)
            token = (
                args[2]
                if name == "acquire_lease" and len(args) > 2
                else kwargs.get("token")
                if name in ("start_run", "start_or_load")
                else None
            )
            if token is not None and (result[0] if name == "start_or_load" else result):
                lane.owners[token] = session
            if name == "acquire_lease" and result and result.previous and result.previous.live:
                lane.taken_live(result.previous)
            return result

        call.__name__ = name
        self.__dict__[name] = call
        return call

    def last_seq(self) -> int:
        """The last journal seq stored (what ``InMemoryStore._seq`` is to the memory lane)."""
        return self._lane.last_seq()
