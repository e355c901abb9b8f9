"""``Store.start_run``, ``Store.finish_run`` and ``Store.finish_run_with``, on every store: a
run started leased with its first records in one write, and a driver's last record (or its
final turn and its end) with its lease released in one, fenced exactly like ``insert``."""

from __future__ import annotations

import time
import uuid

import pytest

from durable_agents.engine.audit import verify_run
from durable_agents.engine.errors import ConfigError, LeaseLost
from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo
from tests.support.procs import in_threads

RECORDS = [("@journal", '{"kind":"header"}'), ("run:start", '{"kind":"start","input":"hi"}')]


def _new_id() -> str:
    return f"start-{uuid.uuid4().hex[:12]}"


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _start(store, run_id: str, token: str = "tok-1", ttl: float = 30, **fields):
    run = RunInfo(run_id=run_id, agent="a", status=RUNNING, input="hi", **fields)
    return store.start_run(run, holder="w1", token=token, ttl=ttl, records=RECORDS)


def test_start_run_writes_the_row_the_lease_and_the_records(store):
    run_id = _new_id()
    entries = _start(store, run_id, fingerprint={"hash": "h"}, session_id="s-1", turns=0)
    assert [(e.name, e.data) for e in entries] == RECORDS
    assert entries[0].seq < entries[1].seq
    assert all(e.run_id == run_id and e.created_at is not None for e in entries)
    assert list(store.load(run_id)) == entries
    run = store.get_run(run_id)
    assert (run.agent, run.status, run.input, run.session_id) == ("a", RUNNING, "hi", "s-1")
    assert run.fingerprint == {"hash": "h"} and run.finished_at is None
    lease = store.get_lease(run_id)
    assert (lease.holder, lease.token, lease.live) == ("w1", "tok-1", True)
    store.insert(run_id, "model:1", "{}", fence="tok-1")  # the lease fences as usual


def test_start_run_of_an_existing_run_writes_nothing(store, run_id):
    assert _start(store, run_id) is None
    assert store.load(run_id) == []
    assert store.get_lease(run_id) is None
    assert store.get_run(run_id).status != RUNNING


def test_start_or_load_starts_a_new_run_as_start_run_does(store):
    run_id = _new_id()
    run = RunInfo(run_id=run_id, agent="a", status=RUNNING, input="hi")
    entries, existing = store.start_or_load(run, holder="w1", token="t", ttl=30, records=RECORDS)
    assert existing is None and [(e.name, e.data) for e in entries] == RECORDS
    assert list(store.load(run_id)) == entries and store.get_lease(run_id).token == "t"


def test_start_or_load_of_a_run_that_exists_reads_it_and_writes_nothing(store, store_kind):
    """What a re-entry of a finished run needs, in the write that found it: its journal and
    its row (a store that cannot read it there says None, and the driver reads as usual)."""
    run_id = _new_id()
    _start(store, run_id)
    store.insert(run_id, "model:1", '{"text":"Hi."}', fence="tok-1")
    store.update_run(run_id, {"status": FINISHED, "answer": "Hi.", "turns": 1})
    store.release_lease(run_id, "tok-1")
    again = RunInfo(run_id=run_id, agent="a", status=RUNNING, input="hi")
    entries, existing = store.start_or_load(
        again, holder="w2", token="tok-2", ttl=30, records=RECORDS
    )
    assert entries is None
    assert store.get_lease(run_id) is None
    assert [e.name for e in store.load(run_id)] == ["@journal", "run:start", "model:1"]
    if existing is None:
        assert store_kind == "sqlite"  # a local read after it costs no round trip
        return
    assert list(existing.entries) == list(store.load(run_id))
    assert (existing.status, existing.answer, existing.turns, existing.imported) == (
        FINISHED,
        "Hi.",
        1,
        "",
    )


def test_start_run_of_a_run_started_before_writes_nothing(store):
    run_id = _new_id()
    assert _start(store, run_id) is not None
    assert _start(store, run_id, token="tok-2") is None
    assert store.get_lease(run_id).token == "tok-1"
    assert [e.name for e in store.load(run_id)] == [name for name, _ in RECORDS]


def test_sixteen_threads_start_one_run_once(store):
    run_id = _new_id()
    results = in_threads(16, lambda i: _start(store, run_id, token=f"tok-{i}"))
    started = [r for r in results if r is not None]
    assert len(started) == 1
    assert store.get_lease(run_id).token == f"tok-{results.index(started[0])}"
    assert len(store.load(run_id)) == len(RECORDS)


def test_finish_run_records_updates_the_row_and_releases_the_lease(store):
    run_id = _new_id()
    _start(store, run_id)
    entry, inserted = store.finish_run(
        run_id,
        "run:complete",
        '{"kind":"complete"}',
        fence="tok-1",
        run_changes={"status": FINISHED, "answer": "done", "turns": 1},
    )
    assert inserted and entry.name == "run:complete"
    assert store.get(run_id, "run:complete").data == '{"kind":"complete"}'
    run = store.get_run(run_id)
    assert (run.status, run.answer, run.turns) == (FINISHED, "done", 1)
    assert run.finished_at is not None
    assert store.get_lease(run_id) is None
    assert store.acquire_lease(run_id, "w2", "tok-2", 30)


def test_finish_run_of_a_recorded_name_keeps_the_lease(store):
    run_id = _new_id()
    _start(store, run_id)
    store.insert(run_id, "run:complete", '{"first":1}', fence="tok-1")
    entry, inserted = store.finish_run(
        run_id, "run:complete", '{"second":1}', fence="tok-1", run_changes={"answer": "x"}
    )
    assert not inserted and entry.data == '{"first":1}'
    assert store.get_lease(run_id).token == "tok-1"
    assert store.get_run(run_id).answer is None


def test_finish_run_after_a_takeover_stores_nothing(store):
    """A lost lease still stops the finish: no record, no row change, the new lease kept."""
    run_id = _new_id()
    _start(store, run_id, ttl=0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    with pytest.raises(LeaseLost):
        store.finish_run(
            run_id, "run:complete", "{}", fence="tok-1", run_changes={"status": FINISHED}
        )
    assert store.get(run_id, "run:complete") is None
    assert store.get_run(run_id).status == RUNNING
    assert store.get_lease(run_id).token == "tok-2"


def test_finish_run_after_expiry_stores_nothing(store):
    run_id = _new_id()
    _start(store, run_id, ttl=0.2)
    assert _wait_until(lambda: not store.get_lease(run_id).live)
    with pytest.raises(LeaseLost):
        store.finish_run(run_id, "run:complete", "{}", fence="tok-1")
    assert store.get(run_id, "run:complete") is None


def test_finish_run_of_a_name_the_new_holder_recorded_is_refused(store):
    run_id = _new_id()
    _start(store, run_id, ttl=0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    store.insert(run_id, "run:complete", '{"fresh":1}', fence="tok-2")
    with pytest.raises(LeaseLost):
        store.finish_run(run_id, "run:complete", '{"stale":1}', fence="tok-1")
    assert store.get(run_id, "run:complete").data == '{"fresh":1}'
    assert store.get_lease(run_id).token == "tok-2"


# -- finish_run_with: a final turn and the run's end in one write --------------------------

LAST = [("model:1", '{"kind":"model","text":"Hi."}'), ("run:complete", '{"kind":"complete"}')]


def _finish_with(store, run_id: str, token: str = "tok-1", **changes):
    changes = changes or {"status": FINISHED, "answer": "Hi.", "turns": 1}
    return store.finish_run_with(run_id, LAST, fence=token, run_changes=changes)


def _nothing_more_than_start(store, run_id: str) -> None:
    assert [e.name for e in store.load(run_id)] == [n for n, _ in RECORDS]
    run = store.get_run(run_id)
    assert (run.status, run.answer, run.finished_at) == (RUNNING, None, None)


def test_finish_run_with_writes_the_records_the_row_and_releases_the_lease(store):
    run_id = _new_id()
    _start(store, run_id)
    entries = _finish_with(store, run_id)
    assert [(e.name, e.data) for e in entries] == LAST
    assert entries[0].seq < entries[1].seq
    assert list(store.load(run_id))[-2:] == entries
    run = store.get_run(run_id)
    assert (run.status, run.answer, run.turns) == (FINISHED, "Hi.", 1)
    assert run.finished_at is not None
    assert store.get_lease(run_id) is None
    # The two records written in one statement chain one after the other.
    report = verify_run(store, run_id)
    assert report.ok and report.links == 4 and report.unchained == 0
    assert store.acquire_lease(run_id, "w2", "tok-2", 30)


def test_finish_run_with_a_recorded_first_name_writes_nothing(store):
    """Another driver's turn 1 stands: neither record, no row change, the lease kept."""
    run_id = _new_id()
    _start(store, run_id)
    store.insert(run_id, "model:1", '{"theirs":1}', fence="tok-1")
    assert _finish_with(store, run_id) is None
    assert store.get(run_id, "model:1").data == '{"theirs":1}'
    assert store.get(run_id, "run:complete") is None
    assert store.get_run(run_id).status == RUNNING
    assert store.get_lease(run_id).token == "tok-1"


def test_finish_run_with_after_a_takeover_writes_nothing(store):
    run_id = _new_id()
    _start(store, run_id, ttl=0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    assert _finish_with(store, run_id) is None
    _nothing_more_than_start(store, run_id)
    assert store.get_lease(run_id).token == "tok-2"


def test_finish_run_with_after_expiry_writes_nothing(store):
    run_id = _new_id()
    _start(store, run_id, ttl=0.2)
    assert _wait_until(lambda: not store.get_lease(run_id).live)
    assert _finish_with(store, run_id) is None
    _nothing_more_than_start(store, run_id)


def test_finish_run_with_unknown_run_fields_is_refused_and_writes_nothing(store):
    run_id = _new_id()
    _start(store, run_id)
    with pytest.raises(ConfigError) as err:
        _finish_with(store, run_id, colour="blue")
    assert err.value.code == "config.run_field"
    _nothing_more_than_start(store, run_id)
    assert store.get_lease(run_id).token == "tok-1"


def test_start_run_without_a_token_writes_the_row_and_records_and_no_lease(store):
    """A run created for a worker (``start``): row, header and ``run:start`` in one write,
    nobody's lease; a run that exists gets nothing."""
    run_id = _new_id()
    run = RunInfo(run_id=run_id, agent="a", status="queued", input="hi")
    entries = store.start_run(run, holder=None, token=None, ttl=None, records=RECORDS)
    assert [(e.name, e.data) for e in entries] == RECORDS
    assert store.get_run(run_id).status == "queued"
    assert store.get_lease(run_id) is None
    assert store.acquire_lease(run_id, "w1", "tok-1", 30)
    again = RunInfo(run_id=run_id, agent="b", status="queued", input="other")
    assert store.start_run(again, holder=None, token=None, ttl=None, records=RECORDS) is None
    assert len(store.load(run_id)) == len(RECORDS)
    assert store.get_run(run_id).agent == "a"
