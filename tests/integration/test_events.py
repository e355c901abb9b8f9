"""Following a run's journal live (``durable_agents.database.events``, ``agent.events``) on real
PostgreSQL (LISTEN/NOTIFY from the migration's triggers) and on SQLite (polling): records
arrive in order, none is lost or repeated, a follower resumes after a seq, and it ends when
the run pauses or ends."""

from __future__ import annotations

import queue
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.db.models.functions import Now
from django.utils import timezone

import durable_agents as da
from durable_agents.database.events import channel, events, listen_connection, ticks_of
from durable_agents.database.followers import MIN_TTL, SETTLE_TIMEOUT, Registration
from durable_agents.database.store import DjangoStore
from durable_agents.engine.errors import NotFound
from durable_agents.engine.ports import FINISHED, QUEUED, RUNNING, RunInfo
from durable_agents.engine.records import Record
from durable_agents.models import Follower, JournalEntry, Run
from tests.support import procs
from tests.support.agents import echo, gated

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.timeout(60)]


class Collector(threading.Thread):
    """Follows a run in a thread of its own (closing its connections when done)."""

    def __init__(self, run_id: str, after: int = 0, store: DjangoStore | None = None) -> None:
        super().__init__(daemon=True)
        self.run_id, self.after, self.store = run_id, after, store
        self.records: list = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.records = list(events(self.run_id, self.after, store=self.store))
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            connections.close_all()

    def result(self, timeout: float = 20) -> list:
        self.join(timeout)
        assert not self.is_alive(), "the follower did not end"
        assert self.error is None, self.error
        return self.records


def journal(run_id: str, using: str = "default") -> list[tuple[int, str]]:
    return [(e.seq, e.name) for e in DjangoStore(using).load(run_id)]


def test_a_paused_run_gives_its_backlog_and_ends_and_resumes_after_the_decision():
    with pytest.raises(da.ApprovalPending):
        gated.run("ev-1", "refund order 7")
    paused = journal("ev-1")
    assert [(r.seq, r.name) for r in events("ev-1")] == paused  # paused: backlog, then end
    assert list(events("ev-1", after=paused[-1][0])) == []  # nothing more until decided
    da.approve("ev-1", "call_1_1", True, by=User.objects.create_superuser("root"))
    # Inline dispatch drove it to the end; following again from the last seq gets the rest.
    rest = list(events("ev-1", after=paused[-1][0]))
    assert journal("ev-1") == paused + [(r.seq, r.name) for r in rest]
    assert rest[0].name == "approval:call_1_1" and rest[-1].kind == "complete"


def test_agent_events_resumes_after_a_seq_of_a_finished_run():
    echo.run("ev-2", "where is order 7?")
    whole = journal("ev-2")
    assert [(r.seq, r.name) for r in echo.events("ev-2")] == whole
    assert [(r.seq, r.name) for r in echo.events("ev-2", after=whole[2][0])] == whole[3:]
    assert list(echo.events("ev-2", after=whole[-1][0])) == []
    with pytest.raises(NotFound):
        list(echo.events("no-such-run"))


@pytest.mark.parametrize("using", ["default", "sqlite"])
def test_concurrent_writes_arrive_in_order_none_lost_none_repeated(using):
    """A writer commits records while a follower starts: whatever falls between its
    LISTEN (or first poll) and its backlog read is neither lost nor repeated."""
    store = DjangoStore(using)
    store.create_run(RunInfo(run_id="ev-3", agent="echo", status=RUNNING))
    store.insert("ev-3", "step:0", '{"kind":"step"}')
    followers = [Collector("ev-3", store=store) for _ in range(3)]

    def write() -> None:
        try:
            for i in range(1, 120):
                store.insert("ev-3", f"step:{i}", '{"kind":"step"}')
                if i == 40:
                    for f in followers:
                        f.start()  # joining mid-stream
            store.update_run("ev-3", {"status": FINISHED})
        finally:
            connections.close_all()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(30)
    for follower in followers:
        got = [(r.seq, r.name) for r in follower.result()]
        assert got == journal("ev-3", using)
        assert len(got) == 120


def test_a_notification_wakes_the_follower_at_once_and_idle_ticks_keep_it_alive():
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-4", agent="echo", status=RUNNING))
    stream = ticks_of("ev-4", store=store, idle=0.3)
    assert next(stream) == RUNNING  # the status first
    assert next(stream) is None  # nothing for `idle` seconds: a keep-alive tick
    started = time.monotonic()
    writer = threading.Thread(
        target=lambda: (store.insert("ev-4", "step:a", "{}"), connections.close_all())
    )
    writer.start()
    record = next(stream)
    assert record is not None and record.name == "step:a"
    assert time.monotonic() - started < 0.25  # woken by NOTIFY, not by the idle timeout
    store.update_run("ev-4", {"status": FINISHED})
    assert list(stream) == [FINISHED]  # the status change notifies too: the stream ends


def test_the_triggers_notify_the_runs_channel_with_seq_and_run_id():
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-5>turn/1", agent="echo", status=RUNNING))
    with listen_connection("default") as conn:
        conn.execute(f'LISTEN "{channel("ev-5>turn/1")}"')
        Registration(conn, "ev-5>turn/1", every=15).start()
        entry, _ = store.insert("ev-5>turn/1", "step:a", "{}")
        store.update_run("ev-5>turn/1", {"status": FINISHED})
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert heard == [f"{entry.seq} ev-5>turn/1", "0 ev-5>turn/1"]


def test_only_a_run_with_an_unexpired_follower_notifies():
    """Migration 0010: a notifying commit waits on every other one on the server, so a run
    nobody follows (or whose follower's registration expired: it crashed) sends nothing."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-7", agent="echo", status=RUNNING))
    store.create_run(RunInfo(run_id="ev-7b", agent="echo", status=RUNNING))
    with listen_connection("default") as conn:
        conn.execute(f'LISTEN "{channel("ev-7")}"')
        conn.execute(f'LISTEN "{channel("ev-7b")}"')
        Follower.objects.create(run_id="ev-7", expires_at=timezone.now() - timedelta(seconds=1))
        store.insert("ev-7", "step:unfollowed", "{}")
        store.update_run("ev-7", {"status": QUEUED})
        Registration(conn, "ev-7b", every=15).start()  # another run's follower
        store.insert("ev-7", "step:other-followed", "{}")
        assert [n.payload for n in conn.notifies(timeout=0.5)] == []
        # Registering swept the expired row of the crashed follower.
        assert list(Follower.objects.values_list("run_id", flat=True)) == ["ev-7b"]
        Registration(conn, "ev-7", every=15).start()
        entry, _ = store.insert("ev-7", "step:followed", "{}")
        store.update_run("ev-7", {"status": RUNNING})
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert heard == [f"{entry.seq} ev-7", "0 ev-7"]


def test_a_follower_is_registered_while_it_follows_and_removes_itself():
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-8", agent="echo", status=RUNNING))
    stream = ticks_of("ev-8", store=store, idle=0.2)
    assert next(stream) == RUNNING
    (row,) = Follower.objects.filter(run_id="ev-8")
    first_expiry = row.expires_at
    assert row.expires_at > timezone.now()
    assert next(stream) is None and next(stream) is None  # keep-alive ticks refresh it
    assert Follower.objects.get(pk=row.pk).expires_at > first_expiry
    store.update_run("ev-8", {"status": FINISHED})
    assert list(stream) == [FINISHED]
    assert not Follower.objects.filter(run_id="ev-8").exists()  # ended: gone
    stream = ticks_of("ev-8", store=store)
    stream.close()  # closed before it started: nothing registered, nothing left
    early = events("ev-8")
    assert list(early) == []
    with pytest.raises(NotFound):
        list(events("no-such-run"))
    assert not Follower.objects.exists()


def test_a_lapsed_registration_registers_again_and_reads_again():
    """A follower that did not run for longer than its registration lasts (a consumer that
    stopped pulling, a stalled process) may have missed notifications: renewing finds its
    row expired, registers anew and has the caller read again."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-9", agent="echo", status=RUNNING))
    with listen_connection("default") as conn:
        follower = Registration(conn, "ev-9", every=0.05)
        follower.start()
        assert follower.renew() is False  # not due yet
        deadline = time.monotonic() + 5
        while time.monotonic() < follower.refresh_at:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert follower.renew() is False  # due, alive: refreshed in place
        first = follower.id
        Follower.objects.filter(pk=first).update(expires_at=timezone.now() - timedelta(seconds=1))
        follower.refresh_at = 0.0
        assert follower.renew() is True  # lapsed: read again
        assert follower.id != first
        assert list(Follower.objects.values_list("pk", flat=True)) == [follower.id]
        Follower.objects.all().delete()  # swept by someone else
        follower.refresh_at = 0.0
        assert follower.waiting(lambda timeout: False)(10.0) is True
        assert Follower.objects.filter(pk=follower.id).exists()
        follower.stop()
    assert not Follower.objects.exists()


def test_a_killed_followers_registration_expires_and_its_run_stops_notifying():
    """SIGKILL of a following process: nothing deletes its row, so its run notifies until the
    row expires (at least ``MIN_TTL`` seconds), then no more; the next registration sweeps it."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-11", agent="echo", status=RUNNING))
    child = procs.start(["tests.support.follow_child", "ev-11", "1"])  # lasts MIN_TTL
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == RUNNING  # registered, read, waiting
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
        child.communicate(timeout=10)
    (row,) = Follower.objects.filter(run_id="ev-11")
    with listen_connection("default") as conn:
        conn.execute(f'LISTEN "{channel("ev-11")}"')
        entry, _ = store.insert("ev-11", "step:a", "{}")
        assert [n.payload for n in conn.notifies(timeout=5, stop_after=1)] == [f"{entry.seq} ev-11"]
        deadline = time.monotonic() + MIN_TTL + 10
        while Follower.objects.filter(pk=row.pk, expires_at__gt=Now()).exists():
            assert time.monotonic() < deadline, "the registration never expired"
            time.sleep(0.1)
        store.insert("ev-11", "step:b", "{}")
        store.update_run("ev-11", {"status": FINISHED})
        assert [n.payload for n in conn.notifies(timeout=0.5)] == []
    assert [r.name for r in events("ev-11")] == ["step:a", "step:b"]
    assert not Follower.objects.exists()  # swept by that registration, then its own deleted


def test_a_follower_waits_boundedly_for_a_writer_in_its_own_thread():
    """Following a run while this very thread's open transaction writes it: the follower
    must not wait for that transaction forever (it never commits while the thread waits).
    It waits ``SETTLE_TIMEOUT``, goes on, and reads the record at its next keep-alive."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-12", agent="echo", status=RUNNING))
    with listen_connection("default") as writer:
        writer.autocommit = False
        writer.execute(
            f"INSERT INTO {JournalEntry._meta.db_table} (run_id, name, data) "
            "VALUES ('ev-12', 'step:mine', '{}')"
        )
        started = time.monotonic()
        stream = ticks_of("ev-12", store=store, idle=0.5)
        assert next(stream) == RUNNING  # the record is not committed yet
        assert SETTLE_TIMEOUT <= time.monotonic() - started < SETTLE_TIMEOUT + 5
        writer.commit()
    item = next(stream)
    if item is None:  # the keep-alive tick may come first
        item = next(stream)
    assert isinstance(item, Record) and item.name == "step:mine"
    stream.close()
    assert not Follower.objects.exists()


def _blocked_on_a_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.parametrize("write", ["journal", "status"])
def test_a_write_that_probed_before_the_registration_committed_still_arrives_at_once(write):
    """The registration race: a writer's trigger probes for followers before the follower's
    registration commits (so it does not notify), and commits only after the follower
    started. The follower waits for that writer before its first read (``settle``), so the
    write arrives at once, not at the next keep-alive (30 s here)."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-10", agent="echo", status=RUNNING))
    got: queue.Queue = queue.Queue()

    def follow() -> None:
        try:
            for item in ticks_of("ev-10", store=store, idle=30):
                got.put(item)
        except BaseException as exc:  # reported by the test
            got.put(exc)
        finally:
            got.put(StopIteration)
            connections.close_all()

    with listen_connection("default") as writer:
        writer.autocommit = False
        if write == "journal":
            writer.execute(
                f"INSERT INTO {JournalEntry._meta.db_table} (run_id, name, data) "
                "VALUES ('ev-10', 'step:racing', '{}')"
            )
        else:
            writer.execute(
                f"UPDATE {Run._meta.db_table} SET status = 'finished' WHERE run_id = 'ev-10'"
            )
        # The trigger has probed: nobody followed yet. Now the follower starts.
        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        deadline = time.monotonic() + 10
        while not (_blocked_on_a_lock() or not got.empty()):  # waits on us, or read past us
            assert time.monotonic() < deadline, "the follower neither read nor waited"
            time.sleep(0.01)
        writer.commit()
    started = time.monotonic()
    first = got.get(timeout=5)
    if write == "journal":
        assert isinstance(first, Record) and first.name == "step:racing"
        assert got.get(timeout=5) == RUNNING
        store.update_run("ev-10", {"status": FINISHED})
        assert got.get(timeout=5) == FINISHED
    else:
        assert first == FINISHED  # the status it committed, not the one before
    assert got.get(timeout=5) is StopIteration
    assert time.monotonic() - started < 5
    follower.join(5)


def test_one_trigger_chains_and_announces_a_record_whoever_writes_it():
    """Migration 0009: the chain's trigger also notifies, for the store's insert and for a
    plain ORM insert alike (``import`` writes so); no second journal trigger is left."""
    from durable_agents.database.audit import verify
    from durable_agents.models import JournalEntry

    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
            "AND tgrelid = 'durable_agents_journalentry'::regclass"
        )
        assert [name for (name,) in cursor.fetchall()] == ["durable_agents_journal_chain"]
    store = DjangoStore()
    store.create_run(RunInfo(run_id="ev-6", agent="echo", status=RUNNING))
    with listen_connection("default") as conn:
        conn.execute(f'LISTEN "{channel("ev-6")}"')
        Registration(conn, "ev-6", every=15).start()
        first, _ = store.insert("ev-6", "step:a", '{"kind":"value"}')
        orm = JournalEntry.objects.create(run_id="ev-6", name="step:b", data='{"kind":"value"}')
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert heard == [f"{first.seq} ev-6", f"{orm.seq} ev-6"]
    (report,) = verify(["ev-6"])
    assert report.ok and report.links == 2 and report.unchained == 0
