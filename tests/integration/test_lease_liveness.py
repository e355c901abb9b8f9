"""Instant takeover on PostgreSQL, the store's part: a lease whose holder's process died may
be taken at once, and the taker learns it replaced a live lease; a holder whose process is
alive keeps its lease — another process, this very one, or one whose Django connection was
closed under it (the liveness lock is on a connection of the library's own). A liveness
connection that drops is replaced, and its locks taken again, at the next renewal.
``INSTANT_TAKEOVER = False`` (poolers that cannot hold session locks) falls back to the TTL.
Recovery's listing sees the same: a run whose driver died is lease-free at once."""

from __future__ import annotations

import time

import pytest
from django.db import connections

import durable_agents as da
from durable_agents import liveness
from durable_agents.engine.ports import RunInfo
from durable_agents.storage import DjangoStore
from tests.support.procs import start

pytestmark = pytest.mark.django_db(transaction=True)


class _Holder:
    """A child process holding ``run_id``'s lease under ``token`` (tests.support.lease_holder)."""

    def __init__(self, run_id: str, token: str) -> None:
        self.proc = start(["tests.support.lease_holder", run_id, token])
        assert self.answer() == "leased", self.proc.stderr.read()

    def answer(self) -> str:
        line = self.proc.stdout.readline().strip()
        if not line:
            self.proc.kill()
            raise AssertionError(f"the holder died: {self.proc.communicate(timeout=30)[1]}")
        return line

    def say(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)

    def __enter__(self) -> _Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


def _lock_held(token: str) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND granted AND classid = ('x' || substr(md5(%s), 1, 8))::bit(32)::bigint::oid "
            "AND objid = ('x' || substr(md5(%s), 9, 8))::bit(32)::bigint::oid",
            [token, token],
        )
        return cursor.fetchone()[0] > 0


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _terminate_liveness_connection(holder: _Holder) -> None:
    """End the holder's liveness connection (a server-side idle timeout, a pooler or an
    operator dropping it) while its process lives."""
    backend = int(holder.say("backend"))
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid = %s AND application_name = %s",
            [backend, liveness.APPLICATION_NAME],
        )
        assert cursor.fetchone() == (True,)


def test_a_lease_whose_holder_process_died_is_taken_at_once():
    store = DjangoStore()
    store.create_run(RunInfo("live-1", agent="echo"))
    with _Holder("live-1", "tok-holder") as holder:
        assert not store.acquire_lease("live-1", "taker", "tok-taker", 30), "its holder is alive"
        holder.kill()
    granted = store.acquire_lease("live-1", "taker", "tok-taker", 30)
    assert granted and granted.previous is not None
    assert (granted.previous.holder, granted.previous.live) == ("child", True)
    store.release_lease("live-1", "tok-taker")


def test_a_holder_whose_django_connection_was_closed_keeps_its_lease():
    """Issue 17's trap: the lock must not go with a connection the site may close."""
    store = DjangoStore()
    store.create_run(RunInfo("live-11", agent="echo", status="running"))
    with _Holder("live-11", "tok-holder") as holder:
        assert holder.say("close") == "closed"
        assert _lock_held("tok-holder")
        assert not store.acquire_lease("live-11", "taker", "tok-taker", 30), "its holder lives"
        assert not _free(store, "live-11"), "recovery does not list a live driver's run"
        assert holder.say("renew") == "True", "and its Django connection comes back"


def test_the_liveness_connection_dropped_is_replaced_and_its_lock_taken_again():
    store = DjangoStore()
    store.create_run(RunInfo("live-12", agent="echo", status="running"))
    with _Holder("live-12", "tok-holder") as holder:
        _terminate_liveness_connection(holder)
        _wait(lambda: not _lock_held("tok-holder"), "the server to let the lock go")
        assert holder.say("renew") == "True"
        assert _lock_held("tok-holder"), "the renewal took the lock again"
        assert holder.say("locks") == "True"
        assert not store.acquire_lease("live-12", "taker", "tok-taker", 30)
        assert not _free(store, "live-12")


def test_a_holder_whose_liveness_connection_dropped_and_lost_its_run_is_told_at_renewal():
    store = DjangoStore()
    store.create_run(RunInfo("live-13", agent="echo", status="running"))
    with _Holder("live-13", "tok-holder") as holder:
        _terminate_liveness_connection(holder)
        _wait(lambda: not _lock_held("tok-holder"), "the server to let the lock go")
        granted = store.acquire_lease("live-13", "taker", "tok-taker", 30)
        assert granted and granted.previous is not None and granted.previous.live
        assert holder.say("renew") == "False", "the holder learns its run was taken"
        assert holder.say("locks") == "False", "and keeps no lock for a lease it lost"
        store.release_lease("live-13", "tok-taker")


def test_a_lease_this_connection_holds_is_not_taken_by_it_under_another_token():
    store = DjangoStore()
    store.create_run(RunInfo("live-2", agent="echo"))
    assert store.acquire_lease("live-2", "outer", "tok-outer", 30)
    assert not store.acquire_lease("live-2", "inner", "tok-inner", 30)
    store.release_lease("live-2", "tok-outer")
    granted = store.acquire_lease("live-2", "inner", "tok-inner", 30)
    assert granted and granted.previous is None, "a released lease is free"
    store.release_lease("live-2", "tok-inner")


def test_with_instant_takeover_off_a_dead_holder_keeps_its_lease_until_it_expires():
    store = DjangoStore(instant_takeover=False)
    store.create_run(RunInfo("live-3", agent="echo"))
    with _Holder("live-3", "tok-holder") as holder:
        holder.kill()
    assert not store.acquire_lease("live-3", "taker", "tok-taker", 30)
    assert store.get_lease("live-3").live


def _my_advisory_locks() -> int:
    """Liveness locks on this test's database (no other process uses it here)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


def test_a_driver_lets_its_liveness_locks_go_with_its_leases():
    """Held while leased; let go with the lease — on the server with the process's next
    statement on its liveness connection, so they never pile up."""
    from durable_agents.engine.commands.runs import resume
    from tests.support.agents import echo, gated

    store = DjangoStore()
    live = store._liveness()
    before = live.held()  # leases other tests of this process took and left
    echo.run("live-4", "where is order 7?")  # started and finished in one write each
    assert live.held() == before
    with pytest.raises(da.ApprovalPending):  # paused: its lease released
        gated.run("live-5", "refund order 7")
    assert live.held() == before
    store.create_run(RunInfo("live-6", agent=echo.name, input="where is order 7?"))
    resume("live-6")  # leased by acquire_lease, finished by finish_run
    assert store.get_run("live-6").status == "finished"
    assert live.held() == before
    assert store.acquire_lease("live-6", "me", "tok-last", 30)
    assert live.held() == before + 1
    assert _my_advisory_locks() == before + 1, "the runs' locks went with the next one taken"
    store.release_lease("live-6", "tok-last")
    assert live.held() == before


def test_a_renewal_racing_the_last_write_leaves_no_lock_behind():
    """The heartbeat may renew a lease the driver's last write just deleted: the renewal
    takes the token's lock again before it learns the lease is gone, then lets it go."""
    store = DjangoStore()
    live = store._liveness()
    store.create_run(RunInfo("live-14", agent="echo", status="running"))
    assert store.acquire_lease("live-14", "me", "tok-again", 30)
    store.release_lease("live-14", "tok-again")
    assert not store.renew_lease("live-14", "tok-again", 30), "released: not renewed"
    assert not live.holds("tok-again")
    assert store.acquire_lease("live-14", "me", "tok-next", 30)
    assert not _lock_held("tok-again"), "unlocked on the server with the next lock taken"
    assert _lock_held("tok-next")
    store.release_lease("live-14", "tok-next")
    assert not live.holds("tok-next")


def _free(store: DjangoStore, run_id: str) -> bool:
    return run_id in [r.run_id for r in store.list_unfinished(lease_free=True, limit=1000)]


@pytest.mark.parametrize("instant", [True, False], ids=["instant", "ttl"])
def test_recovery_lists_a_run_whose_driver_died_as_lease_free_at_once(instant):
    store = DjangoStore(instant_takeover=instant)
    store.create_run(RunInfo("live-7", agent="echo", status="running"))
    store.create_run(RunInfo("live-8", agent="echo", status="running"))
    with _Holder("live-7", "tok-dead") as dead, _Holder("live-8", "tok-alive") as alive:
        assert not _free(store, "live-7") and not _free(store, "live-8"), "both drivers live"
        dead.kill()
        assert alive.say("close") == "closed"
        assert store.get_lease("live-7").live, "its lease has not expired"
        assert _free(store, "live-7") is instant, "a dead holder frees it only with the locks"
        assert not _free(store, "live-8"), "a live holder keeps its run, Django connection or not"
        [row] = [r for r in store.list_unfinished(limit=1000) if r.run_id == "live-7"]
        assert row.lease_expired is instant


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
    from durable_agents.recovery import recover
    from tests.support.wiring import wired

    store = DjangoStore()
    store.create_run(RunInfo("live-10", agent="echo", status="running"))
    with _Holder("live-10", "tok-dead") as dead:
        dead.kill()
    sent: list[str] = []
    with wired(dispatcher=sent.append):
        assert "live-10" in recover(interval=60)
        assert "live-10" not in recover(interval=60), "sent again within the interval"
    assert sent.count("live-10") == 1
    assert store.get_run("live-10").attempts == 1, "the death counted once"


def test_a_forked_child_leaves_its_parents_liveness_connection_alone():
    """A Celery prefork child starts with its parent's memory: closing what it inherited
    would end the parent's session and free its runs. The child opens its own instead."""
    import gc
    import os

    store = DjangoStore()
    store.create_run(RunInfo("live-15", agent="echo", status="running"))
    assert store.acquire_lease("live-15", "parent", "tok-parent", 30)
    try:
        pid = os.fork()
        if pid == 0:  # the child: what it does at exit, then more
            code = 1
            try:
                liveness.close_all()
                gc.collect()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _lock_held("tok-parent"), "the parent's lock outlived the child"
        assert store.renew_lease("live-15", "tok-parent", 30)
        assert not store.acquire_lease("live-15", "taker", "tok-taker-15", 30)
    finally:
        store.release_lease("live-15", "tok-parent")


def test_unlocks_waiting_for_a_statement_are_few():
    """A process that lets many leases go and takes none keeps no pile of dead locks: the
    32nd waiting unlock is sent at once, with the others."""
    live = DjangoStore()._liveness()
    tokens = [f"tok-pile-{i}" for i in range(32)]
    for token in tokens:
        assert live.hold(token)
    for token in tokens[:-1]:
        live.let_go(token)
    assert _lock_held(tokens[0]), "waiting for the next statement"
    live.let_go(tokens[-1])
    assert not any(_lock_held(token) for token in tokens)
