"""Instant takeover on PostgreSQL, the store's part: a lease whose holder's connection closed
(its process died) may be taken at once, and the taker learns it replaced a live lease; a
holder whose connection is open — another thread, or this very connection — keeps its lease.
``INSTANT_TAKEOVER = False`` (poolers that cannot hold session locks) falls back to the TTL.
Recovery's listing sees the same: a run whose driver died is lease-free at once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

import durable_agents as da
from durable_agents.database.liveness import Liveness, close_all, liveness_for
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import header
from durable_agents.engine.ports import RunInfo

pytestmark = pytest.mark.django_db(transaction=True)


class _Holder:
    """Another "process" leasing a run: another thread, with liveness locks of its own;
    ``die()`` closes its connections, which is what the server sees when a driver's process
    dies."""

    def __init__(self, store: DjangoStore, run_id: str, token: str):
        self._leased, self._close = threading.Event(), threading.Event()
        self._liveness = Liveness("default") if store.instant_takeover else None
        own = self.store = DjangoStore(
            instant_takeover=store.instant_takeover, liveness=self._liveness
        )
        self._pids: list[int | None] = []

        def hold():
            try:
                assert own.acquire_lease(run_id, "holder", token, 30)
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    self._pids.append(cursor.fetchone()[0])
                if self._liveness is not None:
                    self._pids.append(self._liveness.backend_pid)
                self._leased.set()
                self._close.wait(timeout=30)
            finally:
                connections.close_all()

        self._thread = threading.Thread(target=hold)
        self._thread.start()
        assert self._leased.wait(timeout=30)

    def die(self) -> None:
        """Close the holder's connections and wait until their server backends have gone: a
        backend releases its session locks as it exits, a moment after the client closes."""
        self._close.set()
        self._thread.join(timeout=30)
        if self._liveness is not None:
            self._liveness.close()
        deadline = time.monotonic() + 30
        while any(_backend_alive(pid) for pid in self._pids):
            assert time.monotonic() < deadline, "the holder's backends never exited"
            time.sleep(0.02)


def _backend_alive(pid: int | None) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] > 0


def test_a_lease_whose_holder_connection_closed_is_taken_at_once():
    store = DjangoStore()
    store.create_run(RunInfo("live-1", agent="echo"))
    holder = _Holder(store, "live-1", "tok-holder")
    assert not store.acquire_lease("live-1", "taker", "tok-taker", 30), "its holder is alive"
    holder.die()
    granted = store.acquire_lease("live-1", "taker", "tok-taker", 30)
    assert granted and granted.previous is not None
    assert (granted.previous.holder, granted.previous.live) == ("holder", True)
    store.release_lease("live-1", "tok-taker")


def test_a_lease_this_connection_holds_is_not_taken_by_it_under_another_token():
    store = DjangoStore()
    store.create_run(RunInfo("live-2", agent="echo"))
    assert store.acquire_lease("live-2", "outer", "tok-outer", 30)
    assert not store.acquire_lease("live-2", "inner", "tok-inner", 30)
    store.release_lease("live-2", "tok-outer")
    granted = store.acquire_lease("live-2", "inner", "tok-inner", 30)
    assert granted and granted.previous is None, "a released lease is free"
    store.release_lease("live-2", "tok-inner")


def test_with_instant_takeover_off_a_closed_holder_keeps_its_lease_until_it_expires():
    store = DjangoStore(instant_takeover=False)
    store.create_run(RunInfo("live-3", agent="echo"))
    _Holder(store, "live-3", "tok-holder").die()
    assert not store.acquire_lease("live-3", "taker", "tok-taker", 30)
    assert store.get_lease("live-3").live


def _advisory_locks(pid: int | None) -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND pid = %s",
            [pid],
        )
        return cursor.fetchone()[0]


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_driver_lets_its_liveness_locks_go_with_its_leases():
    from durable_agents.engine.commands.runs import resume
    from tests.support.agents import echo, gated

    close_all()  # a lease an earlier test left held would keep the connection open
    liveness = liveness_for("default")
    echo.run("live-4", "where is order 7?")  # started and finished in one write each
    assert liveness.held == frozenset()
    with pytest.raises(da.ApprovalPending):  # paused: its lease released
        gated.run("live-5", "refund order 7")
    assert liveness.held == frozenset()
    store = DjangoStore()
    store.create_run(RunInfo("live-6", agent=echo.name, input="where is order 7?"))
    resume("live-6")  # leased by acquire_lease, finished by finish_run
    assert store.get_run("live-6").status == "finished"
    assert liveness.held == frozenset()
    assert _advisory_locks(pg_backend_pid()) == 0, "none on the driver's own connection"
    # The three runs' unlocks were deferred to this connection's next statement.
    store.create_run(RunInfo("live-6b", agent="echo"))
    assert store.acquire_lease("live-6b", "me", "tok-next", 30)
    assert _advisory_locks(liveness.backend_pid) == 1, "only the lease held now"
    store.release_lease("live-6b", "tok-next")
    pid = liveness.backend_pid
    _wait(lambda: liveness.backend_pid is None, "an idle liveness connection to close")
    _wait(lambda: not _backend_alive(pid), "its backend to exit")


def test_a_driver_that_lost_its_lease_lets_its_lock_go_when_it_lets_the_lease_go():
    """A kept connection (a worker's, between tasks: docs/celery.md) holds no lock of a lease
    its driver lost: ``release`` unlocks whether or not the lease was still its own."""
    store = DjangoStore()
    store.create_run(RunInfo("live-lost", agent="echo"))
    assert store.acquire_lease("live-lost", "me", "tok-lost", 30)
    assert _advisory_locks(pg_backend_pid()) == 1  # the lease statement's, on this connection
    with connections["default"].cursor() as cursor:  # another driver took it over meanwhile
        cursor.execute(
            "UPDATE durable_agents_lease SET token = 'tok-other' WHERE run_id = 'live-lost'"
        )
    store.release_lease("live-lost", "tok-lost")
    assert _advisory_locks(pg_backend_pid()) == 0
    assert store.get_lease("live-lost").token == "tok-other"  # not ours to delete


def pg_backend_pid() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_driver_whose_django_connection_closed_keeps_its_lease():
    """The liveness lock is not on the driver's Django connection: closing that (a tool's
    ``close_old_connections()``, ``CONN_MAX_AGE``) leaves the run leased by a live driver,
    for other drivers and for recovery alike."""
    store = DjangoStore()
    store.create_run(RunInfo("live-11", agent="echo", status="running"))
    assert store.acquire_lease("live-11", "me", "tok-me", 30)
    try:
        old = pg_backend_pid()
        connections["default"].close()
        _wait(lambda: not _backend_alive(old), "the closed connection's backend to exit")
        store.create_run(RunInfo("live-12", agent="echo", status="running"))
        other = _Holder(store, "live-12", "tok-other")  # another process's store
        try:
            assert not other.store.acquire_lease("live-11", "taker", "tok-taker", 30)
        finally:
            other.die()
        assert not _free(store, "live-11"), "recovery sees its driver alive"
    finally:
        store.release_lease("live-11", "tok-me")
    assert _free(store, "live-11")


def test_a_forked_child_never_uses_or_closes_its_parents_liveness_connection():
    """A Celery prefork child starts with no liveness connection of its own, and whatever it
    does on the way out (closing every liveness connection it knows, dropping the parent's
    objects) leaves the parent's connection, and so its leases' locks, alone."""
    import gc
    import os

    from durable_agents.database import liveness as module

    store = DjangoStore()
    store.create_run(RunInfo("live-13", agent="echo", status="running"))
    assert store.acquire_lease("live-13", "parent", "tok-parent", 30)
    parent = liveness_for("default")
    parent_pid = parent.backend_pid
    assert parent_pid is not None
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        ok = 0
        try:
            mine = module.liveness_for("default")
            ok = int(mine is not parent and mine.backend_pid is None and not mine.held)
            module.close_all()
            parent.close()
            del mine
            gc.collect()
        finally:
            os.write(write, bytes([ok]))
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"\x01", "the child saw its parent's liveness connection"
    finally:
        os.close(read)
        os.waitpid(child, 0)
    try:
        assert parent.backend_pid == parent_pid and _backend_alive(parent_pid)
        assert _advisory_locks(parent_pid) >= 1, "the parent's lock survived the child"
        assert not _free(store, "live-13")
    finally:
        store.release_lease("live-13", "tok-parent")


def _free(store: DjangoStore, run_id: str) -> bool:
    return run_id in [r.run_id for r in store.list_unfinished(lease_free=True, limit=1000)]


@pytest.mark.parametrize("instant", [True, False], ids=["instant", "ttl"])
def test_recovery_lists_a_run_whose_driver_died_as_lease_free_at_once(instant):
    store = DjangoStore(instant_takeover=instant)
    store.create_run(RunInfo("live-7", agent="echo", status="running"))
    store.create_run(RunInfo("live-8", agent="echo", status="running"))
    dead = _Holder(store, "live-7", "tok-dead")
    alive = _Holder(store, "live-8", "tok-alive")
    try:
        assert not _free(store, "live-7") and not _free(store, "live-8"), "both drivers live"
        dead.die()
        assert store.get_lease("live-7").live, "its lease has not expired"
        assert _free(store, "live-7") is instant, "a dead holder frees it only with the locks"
        assert not _free(store, "live-8"), "a live holder on another connection keeps its run"
        [row] = [r for r in store.list_unfinished(limit=1000) if r.run_id == "live-7"]
        assert row.lease_expired is instant
    finally:
        alive.die()


def test_recovery_does_not_list_a_run_this_connection_drives():
    store = DjangoStore()
    store.create_run(RunInfo("live-9", agent="echo", status="running"))
    assert store.acquire_lease("live-9", "me", "tok-me", 30)
    try:
        assert not _free(store, "live-9"), "a lease held on the listing's own connection is live"
    finally:
        store.release_lease("live-9", "tok-me")
    assert _free(store, "live-9")


def test_recovery_hands_a_dead_holders_run_over_once_per_interval():
    """Taking dead drivers at once does not flood the broker: the run recovery handed over
    is not sent again within the interval (``dispatched_at``), and a second recovery pass
    right after finds nothing to send."""
    from durable_agents.celery.recovery import recover
    from tests.support.wiring import wired

    store = DjangoStore()
    store.create_run(RunInfo("live-10", agent="echo", status="running"))
    _Holder(store, "live-10", "tok-dead").die()
    sent: list[str] = []
    with wired(dispatcher=sent.append):
        assert "live-10" in recover(interval=60)
        assert "live-10" not in recover(interval=60), "sent again within the interval"
    assert sent.count("live-10") == 1
    assert store.get_run("live-10").attempts == 1, "the death counted once"


def test_a_dropped_liveness_connection_is_replaced_and_its_locks_taken_again():
    """The server ends the library's connection (a restart, ``pg_terminate_backend``): the
    lease heartbeat's next check reconnects and locks every held lease's key again."""
    store = DjangoStore()
    store.create_run(RunInfo("live-14", agent="echo", status="running"))
    assert store.acquire_lease("live-14", "me", "tok-14", 30)
    liveness = liveness_for("default")
    try:
        old = liveness.backend_pid
        driver = pg_backend_pid()  # the lease statement's own lock is on this one
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old])
        connections["default"].close()
        _wait(lambda: not _backend_alive(old), "the terminated backend to exit")
        _wait(lambda: not _backend_alive(driver), "the driver's closed backend to exit")
        assert _free(store, "live-14"), "its locks went with the connections"
        liveness._checked = 0.0  # the heartbeat's next check is due
        assert store.renew_lease("live-14", "tok-14", 30)
        assert liveness.backend_pid not in (None, old)
        assert not _free(store, "live-14"), "locked again on the new connection"
    finally:
        store.release_lease("live-14", "tok-14")


@da.tool(read_only=True)
def _look(order: str) -> dict:
    """Look an order up."""
    _SEEN.append(("tool", set(liveness_for("default").held)))
    return {"order": order}


_SEEN: list = []


def test_a_new_run_is_locked_by_its_start_until_its_next_write_takes_the_library_lock():
    """A run started in one write (``start_run``) is locked on the driver's connection by
    that statement; the library's connection locks it with the driver's next fenced write,
    so a one-turn run, whose next write is its end, costs that connection nothing. While
    it waits for its first model answer the run is not free to take."""
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    store = DjangoStore()
    liveness = liveness_for("default")
    _SEEN.clear()

    def first_call(request):
        if not _SEEN:
            lease = store.get_lease("live-15")
            _SEEN.append(("model", lease.token, liveness.deferred(lease.token)))
            _SEEN.append(("free", _free(store, "live-15")))

    agent = da.Agent(
        "live-lazy",
        ScriptedModel(
            [scripted.calls(scripted.call("_look", {"order": "7"})), scripted.text("ok")],
            on_request=first_call,
        ),
        "Answer.",
        [_look],
    )
    assert agent.run("live-15", "where is order 7?", store=store).answer == "ok"
    (_, token, deferred), free, (_, held_in_tool) = _SEEN
    assert deferred and token not in liveness.held
    assert free == ("free", False), "the start's own lock keeps the run"
    assert token in held_in_tool, "locked on the library's connection before the tool ran"
    assert token not in liveness.held and not liveness.deferred(token)


def test_the_heartbeat_locks_a_new_run_still_in_its_first_model_call():
    """A first model call that outlasts a heartbeat: the heartbeat's check takes the
    library's lock, so closing the driver's connection no longer frees the run."""
    store = DjangoStore()
    run = RunInfo("live-16", agent="echo", status="running", input="hi")
    records = [header(), ("run:start", '{"kind":"start","input":"hi"}')]
    assert store.start_run(run, holder="me", token="tok-16", ttl=30, records=records)
    liveness = liveness_for("default")
    try:
        assert liveness.deferred("tok-16")
        liveness._checked = 0.0  # the heartbeat's next check is due
        assert store.renew_lease("live-16", "tok-16", 30)
        assert "tok-16" in liveness.held and not liveness.deferred("tok-16")
        driver = pg_backend_pid()
        connections["default"].close()
        _wait(lambda: not _backend_alive(driver), "the driver's closed backend to exit")
        assert not _free(store, "live-16"), "its driver is alive"
    finally:
        store.release_lease("live-16", "tok-16")
    assert _free(store, "live-16")
