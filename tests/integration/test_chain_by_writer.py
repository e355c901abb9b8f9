"""Records hashed by their writer (PostgreSQL; migration 0012, docs/audit.md).

A driver hashes its next record itself after the last one it wrote, and sends the hash and
its predecessor's seq with the insert; the trigger hashes everything else. What must hold
whoever writes, in whatever order: each run is one unbroken chain in seq order, each record
names the one before it as ``prev_seq``, and no record is lost or written twice.
"""

from __future__ import annotations

import importlib
import threading
import uuid

import psycopg
import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor

from durable_agents.database import store as storage
from durable_agents.database.events import channel, listen_connection
from durable_agents.database.followers import Registration
from durable_agents.database.liveness import liveness_for
from durable_agents.database.store import _HASHED_INSERT, DjangoStore
from durable_agents.engine.audit import chain_hash, verify_run
from durable_agents.engine.ports import RunInfo
from durable_agents.models import JournalEntry
from tests.support.chains import check_chain

pytestmark = pytest.mark.django_db(transaction=True)

DATA = '{"kind":"value","value":"é"}'


@pytest.fixture(autouse=True)
def _postgres():
    # Writer-hashed records are PostgreSQL's; the suite's default database is PostgreSQL
    # (tests/settings.py), so anything else is a misconfigured run, not a reason to skip.
    assert connection.vendor == "postgresql", connection.vendor


def _leased(store: DjangoStore, run_id: str) -> str:
    store.create_run(RunInfo(run_id, agent="echo"))
    token = uuid.uuid4().hex
    assert store.acquire_lease(run_id, "test", token, 60)
    return token


def _statements(store: DjangoStore, monkeypatch) -> list[str]:
    sent: list[str] = []
    execute = store._execute

    def spy(sql, params, fetch, conn=None):
        sent.append(sql)
        return execute(sql, params, fetch, conn)

    monkeypatch.setattr(store, "_execute", spy)
    return sent


def _hashed_here(sql: str) -> bool:
    return "prev_seq" in sql and "INSERT" in sql


def _links(run_id: str) -> list[tuple[int, int | None, str]]:
    return list(
        JournalEntry.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "prev_seq", "name")
    )


def _assert_one_chain(store: DjangoStore, run_id: str) -> list[str]:
    """The run is one chain (``check_chain``); its record names in seq order."""
    check_chain(run_id)
    return [n for _, _, n in _links(run_id)]


def test_a_drivers_second_record_on_is_hashed_by_the_driver(monkeypatch):
    store = DjangoStore()
    token = _leased(store, "wh-1")
    sent = _statements(store, monkeypatch)
    for i in range(4):
        assert store.insert("wh-1", f"step:{i}", DATA, fence=token)[1]
    store.insert("wh-1", "step:3", DATA, fence=token)  # recorded: nothing written
    assert [_hashed_here(s) for s in sent if "INSERT" in s] == [False, True, True, True, True]
    assert _assert_one_chain(store, "wh-1") == [f"step:{i}" for i in range(4)]


def test_a_record_someone_else_appended_sends_the_driver_through_the_trigger(monkeypatch):
    """A decision or a signal appends without the lease: the driver's idea of the last
    record is stale, its hashed insert is refused whole by the unique ``prev_seq``, and the
    record is written again, hashed by the trigger after the true last one."""
    driver, staff = DjangoStore(), DjangoStore()
    token = _leased(driver, "wh-2")
    assert driver.insert("wh-2", "step:0", DATA, fence=token)[1]
    assert driver.insert("wh-2", "step:1", DATA, fence=token)[1]
    assert staff.insert("wh-2", "signal:1", DATA)[1]  # unfenced: the trigger hashes it
    sent = _statements(driver, monkeypatch)
    assert driver.insert("wh-2", "step:2", DATA, fence=token)[1]
    assert [_hashed_here(s) for s in sent] == [True, False]  # refused, then the trigger
    assert driver.insert("wh-2", "step:3", DATA, fence=token)[1]  # hashed here again
    assert _hashed_here(sent[-1])
    assert _assert_one_chain(driver, "wh-2") == [
        "step:0",
        "step:1",
        "signal:1",
        "step:2",
        "step:3",
    ]


def test_the_final_records_are_hashed_here_and_refused_whole_when_stale():
    driver, staff = DjangoStore(), DjangoStore()
    token = _leased(driver, "wh-3")
    assert driver.insert("wh-3", "step:0", DATA, fence=token)[1]
    assert driver.insert("wh-3", "step:1", DATA, fence=token)[1]
    assert staff.insert("wh-3", "signal:1", DATA)[1]
    written = driver.finish_run_with(
        "wh-3",
        [("model:2", DATA), ("run:complete", DATA)],
        fence=token,
        run_changes={"status": "completed"},
    )
    assert written is not None and [e.name for e in written] == ["model:2", "run:complete"]
    assert driver.get_lease("wh-3") is None
    assert driver.get_run("wh-3").status == "completed"
    assert _assert_one_chain(driver, "wh-3")[-3:] == ["signal:1", "model:2", "run:complete"]


def test_the_final_records_hashed_here_chain_after_the_drivers_last(monkeypatch):
    store = DjangoStore()
    token = _leased(store, "wh-4")
    assert store.insert("wh-4", "step:0", DATA, fence=token)[1]
    sent = _statements(store, monkeypatch)
    assert store.finish_run_with("wh-4", [("model:1", DATA), ("run:complete", DATA)], fence=token)
    assert len(sent) == 1 and sent[0].count("prev_seq") == 2
    assert _assert_one_chain(store, "wh-4") == ["step:0", "model:1", "run:complete"]
    assert token not in store._tails  # let go with the lease


def test_a_new_runs_records_are_hashed_by_their_writer_and_are_its_tail(monkeypatch):
    store = DjangoStore()
    token = uuid.uuid4().hex
    sent = _statements(store, monkeypatch)
    entries = store.start_run(
        RunInfo("wh-5", agent="echo"),
        holder="test",
        token=token,
        ttl=60,
        records=[("header", DATA), ("run:start", DATA)],
    )
    assert entries is not None
    assert store.insert("wh-5", "model:1", DATA, fence=token)[1]
    assert len(sent) == 2 and all(_hashed_here(sql) for sql in sent)
    assert _assert_one_chain(store, "wh-5") == ["header", "run:start", "model:1"]
    # Queued for a worker (no lease): hashed here too; the worker's first write (a new
    # lease) goes through the trigger.
    assert store.start_run(
        RunInfo("wh-5q", agent="echo"),
        holder=None,
        token=None,
        ttl=None,
        records=[("header", DATA), ("run:start", DATA), ("note", DATA)],
    )
    worker = uuid.uuid4().hex
    assert store.acquire_lease("wh-5q", "test", worker, 60)
    assert store.insert("wh-5q", "model:1", DATA, fence=worker)[1]
    assert store.insert("wh-5q", "run:complete", DATA, fence=worker)[1]
    assert _assert_one_chain(store, "wh-5q") == [
        "header",
        "run:start",
        "note",
        "model:1",
        "run:complete",
    ]


def test_inside_a_sites_transaction_the_trigger_hashes(monkeypatch):
    """A refused statement would abort the site's transaction: there the trigger hashes."""
    store = DjangoStore()
    token = _leased(store, "wh-6")
    assert store.insert("wh-6", "step:0", DATA, fence=token)[1]
    sent = _statements(store, monkeypatch)
    with transaction.atomic():
        assert store.insert("wh-6", "step:1", DATA, fence=token)[1]
        assert DjangoStore().insert("wh-6", "signal:1", DATA)[1]
        assert store.insert("wh-6", "step:2", DATA, fence=token)[1]
    assert not any(_hashed_here(s) for s in sent)
    assert _assert_one_chain(store, "wh-6") == ["step:0", "step:1", "signal:1", "step:2"]


def test_a_lost_lease_forgets_the_tail():
    store = DjangoStore()
    token = _leased(store, "wh-7")
    assert store.insert("wh-7", "step:0", DATA, fence=token)[1]
    assert token in store._tails
    store.release_lease("wh-7", token)
    assert token not in store._tails


def test_a_stale_hash_cannot_fork_the_chain():
    """The database, not the writer's good faith, keeps one successor per record: a second
    record naming the same predecessor is refused."""
    store = DjangoStore()
    token = _leased(store, "wh-8")
    first, _ = store.insert("wh-8", "step:0", DATA, fence=token)
    assert store.insert("wh-8", "step:1", DATA, fence=token)[1]
    with pytest.raises(IntegrityError, match="da_journal_prev_seq"):
        JournalEntry.objects.create(
            run_id="wh-8", name="fork", data=DATA, hash="0" * 64, prev_seq=first.seq
        )


def test_racing_writers_of_one_run_keep_one_chain():
    """Two threads of one driver (same lease) and a staff writer append to one run at once,
    each on its own connection: every record is stored once, and the run is one chain."""
    store = DjangoStore()
    token = _leased(store, "wh-race")
    assert store.insert("wh-race", "step:start", DATA, fence=token)[1]
    per_writer = 40
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def write(prefix: str, fence: str | None) -> None:
        try:
            barrier.wait()
            for i in range(per_writer):
                assert store.insert("wh-race", f"{prefix}:{i}", DATA, fence=fence)[1]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=write, args=("a", token)),
        threading.Thread(target=write, args=("b", token)),
        threading.Thread(target=write, args=("staff", None)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    names = _assert_one_chain(store, "wh-race")
    assert len(names) == 1 + 3 * per_writer == len(set(names))


def test_migration_0012_forward_and_back_keeps_the_chain():
    """Back to 0011: the trigger hashes every record again, and a run written across the
    migration (both ways) stays one chain."""
    store = DjangoStore()
    token = _leased(store, "wh-mig")
    assert store.insert("wh-mig", "step:0", DATA, fence=token)[1]
    assert store.insert("wh-mig", "step:1", DATA, fence=token)[1]  # hashed here
    executor = MigrationExecutor(connection)
    target = [("durable_agents", "0011_lease_without_constraint_no_pattern_indexes")]
    latest = executor.loader.graph.leaf_nodes("durable_agents")
    try:
        executor.migrate(target)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'durable_agents_journalentry' AND column_name = 'prev_seq'"
            )
            assert cursor.fetchone() is None
        # The code before 0012 wrote like this: no hash, the trigger hashes.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO durable_agents_journalentry (run_id, name, data, created_at) "
                "VALUES (%s, %s, %s, now())",
                ["wh-mig", "old:0", DATA],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)
    module = importlib.import_module("durable_agents.migrations.0012_journal_chain_by_writer")
    assert module.Migration.dependencies == target
    # A fresh store (a deploy): its first record goes through the trigger, then hashed here.
    after = DjangoStore()
    token2 = uuid.uuid4().hex
    store.release_lease("wh-mig", token)
    assert after.acquire_lease("wh-mig", "test", token2, 60)
    assert after.insert("wh-mig", "step:2", DATA, fence=token2)[1]
    assert after.insert("wh-mig", "step:3", DATA, fence=token2)[1]
    report = verify_run(after, "wh-mig")
    assert report.ok and not report.unchained, report.message()
    links = _links("wh-mig")
    # Rows written before the migration (and by the old code) have no prev_seq; every row
    # written since names its predecessor.
    assert [n for _, _, n in links] == ["step:0", "step:1", "old:0", "step:2", "step:3"]
    assert links[3][1] == links[2][0] and links[4][1] == links[3][0]


def test_a_hashed_insert_notifies_a_followed_run():
    store = DjangoStore()
    token = _leased(store, "wh-ev")
    assert store.insert("wh-ev", "step:0", DATA, fence=token)[1]
    with listen_connection("default") as conn:
        conn.execute(f'LISTEN "{channel("wh-ev")}"')
        Registration(conn, "wh-ev", every=15).start()
        entry, _ = store.insert("wh-ev", "step:1", DATA, fence=token)
        final = store.finish_run_with("wh-ev", [("model:2", DATA), ("done", DATA)], fence=token)
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=3)]
    assert final is not None
    assert heard == [f"{e.seq} wh-ev" for e in [entry, *final]]


def test_a_record_the_trigger_hashes_waits_for_a_hashed_insert_in_flight():
    """A staff record (hashed by the trigger) during a driver's hashed insert that has not
    committed: it waits for it (it locks the run's lease row, which the hashed insert holds
    ``FOR SHARE``) and then follows it — never refused, so it may be written inside a site's
    transaction. A new follower's ``settle`` waits on the same row."""
    store = DjangoStore()
    token = _leased(store, "wh-wait")
    store.insert("wh-wait", "step:0", DATA, fence=token)
    tail = store._tail("wh-wait", token, store.connection)
    assert tail is not None
    prev_seq, prev_hash = tail
    staff_done = threading.Event()
    errors: list[BaseException] = []

    def staff() -> None:
        try:
            with transaction.atomic():
                assert DjangoStore().insert("wh-wait", "signal:1", DATA)[1]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            staff_done.set()
            connections.close_all()

    with listen_connection("default") as writer, listen_connection("default") as follower:
        writer.autocommit = False
        hashed = chain_hash(prev_hash, "step:1", DATA)
        writer.execute(
            _HASHED_INSERT, ["wh-wait", "step:1", DATA, hashed, prev_seq, "wh-wait", token]
        )
        thread = threading.Thread(target=staff)
        thread.start()
        assert not staff_done.wait(0.5), "the staff record did not wait"
        follower.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            follower.execute(
                "SELECT 1 FROM durable_agents_lease WHERE run_id = %s FOR NO KEY UPDATE",
                ["wh-wait"],
            )
        writer.commit()
        thread.join(10)
    assert not errors, errors
    assert _assert_one_chain(store, "wh-wait") == ["step:0", "step:1", "signal:1"]


def test_a_refused_first_write_of_a_new_run_still_takes_its_liveness_lock():
    """A run started in one write defers its liveness lock to its next fenced write; when
    that write is refused (a staff record came first) and written again, the lock is
    still taken, once."""
    store = DjangoStore()
    token = uuid.uuid4().hex
    assert store.start_run(
        RunInfo("wh-live", agent="echo", status="running"),
        holder="test",
        token=token,
        ttl=60,
        records=[("header", DATA), ("run:start", DATA)],
    )
    liveness = liveness_for("default")
    try:
        assert liveness.deferred(token)
        assert DjangoStore().insert("wh-live", "signal:1", DATA)[1]
        assert store.insert("wh-live", "model:1", DATA, fence=token)[1]
        assert token in liveness.held and not liveness.deferred(token)
        assert _assert_one_chain(store, "wh-live") == ["header", "run:start", "signal:1", "model:1"]
    finally:
        store.release_lease("wh-live", token)
    assert token not in liveness.held


def test_the_tails_kept_are_bounded_the_oldest_lease_going_first(monkeypatch):
    monkeypatch.setattr(storage, "_TAILS_MAX", 2)
    store = DjangoStore()
    for token in ("t1", "t2", "t3"):
        store._remember_tail(token, "run", 1, None)
    assert list(store._tails) == ["t2", "t3"]
    store._remember_tail("t3", "run", 2, None)  # a known lease moves on, evicting nobody
    assert store._tails == {"t2": ("run", 1, None), "t3": ("run", 2, None)}


def test_a_new_follower_waits_for_a_hashed_insert_in_flight():
    """``settle`` waits on the run's lease row, which a hashed insert (no journal lock, no
    run-row change) holds until it commits: the record is in the follower's first read."""
    store = DjangoStore()
    token = _leased(store, "wh-settle")
    store.insert("wh-settle", "step:0", DATA, fence=token)
    tail = store._tail("wh-settle", token, store.connection)
    assert tail is not None
    settled = threading.Event()

    with listen_connection("default") as writer, listen_connection("default") as follower:
        writer.autocommit = False
        hashed = chain_hash(tail[1], "step:1", DATA)
        writer.execute(
            _HASHED_INSERT, ["wh-settle", "step:1", DATA, hashed, tail[0], "wh-settle", token]
        )

        def register() -> None:
            Registration(follower, "wh-settle", every=15).start()
            settled.set()

        thread = threading.Thread(target=register)
        thread.start()
        assert not settled.wait(0.5), "the follower did not wait for the insert in flight"
        writer.commit()
        thread.join(10)
        assert settled.is_set()
    assert _assert_one_chain(store, "wh-settle") == ["step:0", "step:1"]
