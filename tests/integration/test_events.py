"""Following a run's journal live (``durable_agents.events``, ``agent.events``) on real
PostgreSQL (LISTEN/NOTIFY from the migration's triggers) and on SQLite (polling): records
arrive in order, none is lost or repeated, a follower resumes after a seq, and it ends when
the run pauses or ends."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connections

import durable_agents as da
from durable_agents.engine.errors import NotFound
from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo
from durable_agents.events import channel, events, listen_connection, ticks_of
from durable_agents.storage import DjangoStore
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
        entry, _ = store.insert("ev-5>turn/1", "step:a", "{}")
        store.update_run("ev-5>turn/1", {"status": FINISHED})
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert heard == [f"{entry.seq} ev-5>turn/1", "0 ev-5>turn/1"]


def test_one_trigger_chains_and_announces_a_record_whoever_writes_it():
    """Migration 0009: the chain's trigger also notifies, for the store's insert and for a
    plain ORM insert alike (``import`` writes so); no second journal trigger is left."""
    from durable_agents.audit import verify
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
        first, _ = store.insert("ev-6", "step:a", '{"kind":"value"}')
        orm = JournalEntry.objects.create(run_id="ev-6", name="step:b", data='{"kind":"value"}')
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert heard == [f"{first.seq} ev-6", f"{orm.seq} ev-6"]
    (report,) = verify(["ev-6"])
    assert report.ok and report.links == 2 and report.unchained == 0
