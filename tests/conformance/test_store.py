"""The Store contract, on every store: first writer wins, commit order, byte fidelity,
leases on the store's clock, fencing, and listing unfinished runs."""

from __future__ import annotations

import time

import pytest

from durable_agents.engine.errors import ConfigError, LeaseLost
from durable_agents.engine.ports import RunInfo
from tests.support.procs import in_threads, start

from .conftest import DB

pytestmark = DB


def test_insert_if_absent_first_writer_wins(store, run_id):
    first, inserted = store.insert(run_id, "a", '{"v":1}')
    assert inserted and first.data == '{"v":1}'
    again, inserted_again = store.insert(run_id, "a", '{"v":2}')
    assert not inserted_again
    assert again.data == '{"v":1}' and again.seq == first.seq
    assert store.get(run_id, "a").data == '{"v":1}'
    assert store.get(run_id, "missing") is None


def test_sixteen_threads_one_winner(store, run_id):
    results = in_threads(16, lambda i: store.insert(run_id, "race", f'{{"writer":{i}}}'))
    winners = [entry for entry, inserted in results if inserted]
    assert len(winners) == 1
    assert {entry.data for entry, _ in results} == {winners[0].data}
    assert [e.name for e in store.load(run_id)] == ["race"]


@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
def test_four_processes_one_winner(store, run_id, store_kind):
    alias = "default" if store_kind == "postgres" else "sqlite"
    procs = [
        start(["tests.support.store_worker", alias, run_id, "race", f'{{"proc":{i}}}'])
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()
    rows = [line.split(" ", 2) for line in outputs]
    assert sum(int(r[0]) for r in rows) == 1, outputs
    assert len({r[2] for r in rows}) == 1
    assert store.get(run_id, "race").data == rows[0][2]


def test_load_in_commit_order(store, run_id):
    names = [f"step-{i}" for i in range(20)]
    for name in names:
        store.insert(run_id, name, "{}")
    entries = store.load(run_id)
    assert [e.name for e in entries] == names
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    tail = store.load(run_id, after=entries[9].seq)
    assert [e.name for e in tail] == names[10:]
    assert store.load("no-such-run") == []


def test_runs_do_not_share_entries(store, run_id):
    other = run_id + "-other"
    store.create_run(RunInfo(run_id=other))
    store.insert(run_id, "x", '"mine"')
    entry, inserted = store.insert(other, "x", '"theirs"')
    assert inserted and entry.data == '"theirs"'
    assert store.get(run_id, "x").data == '"mine"'


BYTES = [
    '{"a":"\\u2028 and \\u2029","b":"<b>&amp;</b>","c":"snow ☃ 𝄞 日本"}',
    '{"big":123456789012345678901234567890,"neg":-0.0,"f":1.5e300,"s":"1.50"}',
    '{"nested":[[[{"k":[1,{"z":null}]}]]],"t":true,"u":"\\"quoted\\" \\\\ back"}',
    '{"ctl":"\\u0000\\u001f","tab":"\\t","nl":"line\\nline"}',
    '"' + "x" * 100_000 + '"',
]


@pytest.mark.parametrize("data", BYTES, ids=range(len(BYTES)))
def test_byte_fidelity(store, run_id, data):
    entry, _ = store.insert(run_id, "bytes", data)
    assert entry.data == data
    assert store.get(run_id, "bytes").data == data
    assert store.load(run_id)[0].data == data


def test_entries_have_commit_timestamps(store, run_id):
    entry, _ = store.insert(run_id, "t", "{}")
    assert entry.created_at is not None and entry.created_at.tzinfo is not None
    assert store.get(run_id, "t").created_at == entry.created_at


# -- leases ---------------------------------------------------------------------------


def test_lease_acquire_renew_release(store, run_id):
    assert store.acquire_lease(run_id, "w1", "tok-1", 30)
    assert store.acquire_lease(run_id, "w1", "tok-1", 30), "re-acquire by the holder renews"
    assert not store.acquire_lease(run_id, "w2", "tok-2", 30)
    lease = store.get_lease(run_id)
    assert (lease.holder, lease.token, lease.live) == ("w1", "tok-1", True)
    assert lease.expires_at > lease.renewed_at
    assert store.renew_lease(run_id, "tok-1", 30)
    assert not store.renew_lease(run_id, "tok-2", 30), "only the holder renews"
    store.release_lease(run_id, "tok-2")  # not the holder: no effect
    assert store.get_lease(run_id).token == "tok-1"
    store.release_lease(run_id, "tok-1")
    assert store.get_lease(run_id) is None
    assert store.acquire_lease(run_id, "w2", "tok-2", 30)


def _wait_until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_lease_expiry_and_takeover(store, run_id):
    assert store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert not store.acquire_lease(run_id, "w2", "tok-2", 30)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    assert store.get_lease(run_id).holder == "w2"
    assert not store.renew_lease(run_id, "tok-1", 30), "an expired holder cannot renew"


def test_expired_lease_is_reported_not_live(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 0.2)
    assert _wait_until(lambda: not store.get_lease(run_id).live)
    assert not store.renew_lease(run_id, "tok-1", 30)


def test_lease_threads_one_holder(store, run_id):
    results = in_threads(16, lambda i: store.acquire_lease(run_id, f"w{i}", f"tok-{i}", 30))
    assert results.count(True) == 1


def test_lease_needs_a_run(store):
    with pytest.raises(ConfigError):
        store.acquire_lease("no-such-run", "w", "t", 30)


# -- fencing --------------------------------------------------------------------------


def test_fenced_write_with_live_lease(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 30)
    entry, inserted = store.insert(run_id, "s1", '{"ok":1}', fence="tok-1")
    assert inserted and entry.data == '{"ok":1}'


def test_fenced_write_after_takeover_stores_nothing(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    with pytest.raises(LeaseLost):
        store.insert(run_id, "s1", '{"stale":1}', fence="tok-1")
    assert store.get(run_id, "s1") is None
    entry, inserted = store.insert(run_id, "s1", '{"fresh":1}', fence="tok-2")
    assert inserted and entry.data == '{"fresh":1}'


def test_fenced_write_of_a_taken_name_after_takeover_is_refused(store, run_id):
    """The stale driver must stop, not read on from the new holder's record."""
    store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    store.insert(run_id, "s1", '{"fresh":1}', fence="tok-2")
    with pytest.raises(LeaseLost):
        store.insert(run_id, "s1", '{"stale":1}', fence="tok-1")
    assert store.get(run_id, "s1").data == '{"fresh":1}'


def test_fenced_write_after_expiry_stores_nothing(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 0.2)
    assert _wait_until(lambda: not store.get_lease(run_id).live)
    with pytest.raises(LeaseLost):
        store.insert(run_id, "late", "{}", fence="tok-1")
    assert store.load(run_id) == []


def test_fenced_write_without_any_lease_or_after_release(store, run_id):
    with pytest.raises(LeaseLost):
        store.insert(run_id, "x", "{}", fence="never-held")
    store.acquire_lease(run_id, "w1", "tok-1", 30)
    store.release_lease(run_id, "tok-1")
    with pytest.raises(LeaseLost):
        store.insert(run_id, "x", "{}", fence="tok-1")
    assert store.load(run_id) == []


def test_fenced_run_update(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 30)
    store.update_run(run_id, {"status": "running", "turns": 2}, fence="tok-1")
    assert store.get_run(run_id).status == "running"
    with pytest.raises(LeaseLost):
        store.update_run(run_id, {"status": "failed"}, fence="other")
    assert store.get_run(run_id).status == "running"


def test_unfenced_insert_needs_the_run(store):
    with pytest.raises(ConfigError):
        store.insert("no-such-run", "x", "{}")


# -- runs and listing -----------------------------------------------------------------


def test_create_run_is_insert_if_absent(store):
    assert store.create_run(RunInfo(run_id="r-create", agent="a", input={"q": "hi"}))
    assert not store.create_run(RunInfo(run_id="r-create", agent="b"))
    run = store.get_run("r-create")
    assert (run.agent, run.input, run.status) == ("a", {"q": "hi"}, "queued")
    assert store.get_run("nope") is None


def test_terminal_status_stamps_finished(store, run_id):
    store.update_run(run_id, {"status": "finished", "answer": "done"})
    run = store.get_run(run_id)
    assert run.finished and run.finished_at is not None and run.answer == "done"


def test_list_unfinished_ignores_finished_runs(store):
    for i in range(6):
        store.create_run(RunInfo(run_id=f"ls-{i}"))
    store.update_run("ls-1", {"status": "finished"})
    store.update_run("ls-3", {"status": "cancelled"})
    store.update_run("ls-4", {"status": "awaiting_approval"})
    ids = [r.run_id for r in store.list_unfinished(limit=100)]
    assert ids == ["ls-0", "ls-2", "ls-4", "ls-5"]
    page1 = store.list_unfinished(limit=2)
    page2 = store.list_unfinished(limit=2, after=page1[-1].run_id)
    assert [r.run_id for r in page1 + page2] == ids
    queued = store.list_unfinished(statuses=["queued"])
    assert [r.run_id for r in queued] == ["ls-0", "ls-2", "ls-5"]


def test_list_unfinished_lease_free(store):
    for i in range(3):
        store.create_run(RunInfo(run_id=f"lf-{i}"))
    store.acquire_lease("lf-0", "w", "t0", 30)
    store.acquire_lease("lf-1", "w", "t1", 0.2)
    assert _wait_until(lambda: not store.get_lease("lf-1").live)
    free = store.list_unfinished(lease_free=True)
    assert [r.run_id for r in free] == ["lf-1", "lf-2"]
    listed = {r.run_id: r.lease_expired for r in store.list_unfinished()}
    assert listed == {"lf-0": False, "lf-1": True, "lf-2": True}
