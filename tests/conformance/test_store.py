"""The Store contract, on every store: first writer wins, commit order, byte fidelity,
leases on the store's clock, fencing, and listing unfinished runs."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from django.db import connections

from durable_agents.database.store import DjangoStore
from durable_agents.engine.errors import ConfigError, LeaseLost
from durable_agents.engine.ports import RunInfo
from durable_agents.models import Run
from tests.support.procs import in_threads, start
from tests.support.stores import DB


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


@DB
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


def test_journal_heads_are_each_runs_last_seq(store, run_id):
    """What the timer sweep compares to tell a paused run written to since it last read it
    (``wake_timers``): the seq of each run's last record; a run without one is left out."""
    other, empty = run_id + "-other", run_id + "-empty"
    store.create_run(RunInfo(run_id=other))
    store.create_run(RunInfo(run_id=empty))
    for i in range(3):
        store.insert(run_id, f"a{i}", "{}")
        store.insert(other, f"b{i}", "{}")
    heads = store.journal_heads([run_id, other, empty, "no-such-run"])
    assert heads == {run_id: store.load(run_id)[-1].seq, other: store.load(other)[-1].seq}
    last, _ = store.insert(run_id, "a3", "{}")
    assert store.journal_heads([run_id])[run_id] == last.seq > heads[run_id]
    assert store.journal_heads([]) == {}


def test_find_reads_named_entries_of_many_runs_at_once(store, run_id):
    """What a sub-run looks for above it before each step (``stops.stop_above``): the
    entries of any of the names in any of the runs, in one read, and nothing else."""
    other, empty = run_id + "-other", run_id + "-empty"
    store.create_run(RunInfo(run_id=other))
    store.create_run(RunInfo(run_id=empty))
    store.insert(run_id, "run:cancelled", '{"by":"ann"}')
    store.insert(run_id, "model:1", "{}")
    store.insert(other, "saga:abort", '{"cause":{}}')
    store.insert(other, "run:cancelled-not", "{}")
    found = store.find([run_id, other, empty, "no-such-run"], ["run:cancelled", "saga:abort"])
    got = sorted((e.run_id, e.name, e.data) for e in found)
    assert got == sorted(
        [(other, "saga:abort", '{"cause":{}}'), (run_id, "run:cancelled", '{"by":"ann"}')]
    )
    assert {e.seq for e in found} == {
        store.get(run_id, "run:cancelled").seq,
        store.get(other, "saga:abort").seq,
    }
    assert store.find([empty], ["run:cancelled"]) == []
    assert store.find([], ["run:cancelled"]) == [] and store.find([run_id], []) == []


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


def test_acquire_reports_the_expired_lease_it_took_over(store, run_id):
    first = store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert first and first.previous is None, "a free lease replaces nobody's"
    again = store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert again and again.previous is None, "re-acquiring one's own lease is no takeover"
    held = store.get_lease(run_id)
    granted = None

    def take():
        nonlocal granted
        granted = store.acquire_lease(run_id, "w2", "tok-2", 30)
        return granted

    assert _wait_until(take)
    previous = granted.previous
    assert (previous.holder, previous.token, previous.live) == ("w1", "tok-1", False)
    assert previous.expires_at == held.expires_at and previous.renewed_at == held.renewed_at
    store.release_lease(run_id, "tok-2")
    after_release = store.acquire_lease(run_id, "w3", "tok-3", 30)
    assert after_release and after_release.previous is None, "a released lease is free"


def test_expired_lease_is_reported_not_live(store, run_id):
    store.acquire_lease(run_id, "w1", "tok-1", 0.2)
    assert _wait_until(lambda: not store.get_lease(run_id).live)
    assert not store.renew_lease(run_id, "tok-1", 30)


def test_lease_threads_one_holder(store, run_id):
    acquired = threading.Barrier(16)

    def take(i):
        granted = store.acquire_lease(run_id, f"w{i}", f"tok-{i}", 30)
        # Every thread's connection stays open until all have tried: on PostgreSQL a holder
        # whose connection closed has given its lease up (instant takeover).
        acquired.wait(timeout=30)
        return granted

    results = in_threads(16, take)
    assert sum(map(bool, results)) == 1


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


def test_a_relaxed_insert_keeps_every_rule(store, run_id):
    """``sync=False`` (the durability dial) changes when a write reaches the disk, nothing a
    reader or another writer sees: first writer wins, the row change comes with it, and a
    lost lease stores nothing."""
    store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    entry, inserted = store.insert(
        run_id, "model:1", '{"v":1}', fence="tok-1", run_changes={"turns": 1}, sync=False
    )
    assert inserted and store.get(run_id, "model:1") == entry
    assert store.get_run(run_id).turns == 1
    again, inserted = store.insert(run_id, "model:1", '{"v":2}', fence="tok-1", sync=False)
    assert not inserted and again.data == '{"v":1}'
    _, inserted = store.insert(run_id, "spend:1", "{}", sync=False)
    assert inserted and [e.name for e in store.load(run_id)] == ["model:1", "spend:1"]
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    with pytest.raises(LeaseLost):
        store.insert(run_id, "model:2", "{}", fence="tok-1", run_changes={"turns": 2}, sync=False)
    assert store.get(run_id, "model:2") is None and store.get_run(run_id).turns == 1


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


# -- issue 10: rules every store keeps ------------------------------------------------


def test_the_store_has_a_clock(store, run_id):
    entry, _ = store.insert(run_id, "t", "{}")
    now = store.now()
    assert now.tzinfo is not None and abs((now - entry.created_at).total_seconds()) < 5


def test_a_run_created_in_a_final_state_is_finished_in_that_one_write(store):
    from durable_agents.engine.ports import FINISHED

    assert store.create_run(RunInfo(run_id="final-1", status=FINISHED, kind="session"))
    run = store.get_run("final-1")
    assert (run.status, run.kind) == ("finished", "session") and run.finished_at is not None
    assert "final-1" not in [r.run_id for r in store.list_unfinished()]


def test_only_agent_runs_are_listed_unfinished(store):
    store.create_run(RunInfo(run_id="kind-agent"))
    store.create_run(RunInfo(run_id="kind-session", kind="session"))
    store.create_run(RunInfo(run_id="kind-journal", kind="journal"))
    assert store.get_run("kind-agent").kind == "agent"
    assert [r.run_id for r in store.list_unfinished()] == ["kind-agent"]


def _halt(run_id: str, attempt: int, op: str = "c1"):
    from durable_agents.engine.ports import HaltInfo

    return HaltInfo(run_id, op, "charge", {"a": 1}, f"attempt:{op}:{attempt}", cause="crashed")


def test_a_halt_is_written_once_per_attempt_and_a_resolution_stays(store, run_id):
    assert store.save_halt(_halt(run_id, 1))
    assert not store.save_halt(_halt(run_id, 1))
    store.resolve_halt_row(run_id, "c1", {"result": "done", "evidence": "ledger"}, "ann")
    # A stale driver saving the same halt again changes nothing: it stays resolved.
    assert not store.save_halt(_halt(run_id, 1))
    [halt] = store.list_halts(run_id=run_id, status=None)
    assert (halt.status, halt.resolved_by) == ("resolved", "ann")
    assert halt.resolution == {"result": "done", "evidence": "ledger"}
    # A later attempt of the same call halts anew.
    assert store.save_halt(_halt(run_id, 2))
    assert [h.attempt for h in store.list_halts(run_id=run_id)] == ["attempt:c1:2"]


def test_a_fenced_halt_after_takeover_is_refused_and_writes_nothing(store, run_id):
    """A driver that lost the run halts from a stale journal: its halt row must not land."""
    store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    with pytest.raises(LeaseLost):
        store.save_halt(_halt(run_id, 1), fence="tok-1")
    assert store.list_halts(run_id=run_id, status=None) == []
    assert store.save_halt(_halt(run_id, 1), fence="tok-2")
    assert not store.save_halt(_halt(run_id, 1), fence="tok-2")
    assert [h.attempt for h in store.list_halts(run_id=run_id)] == ["attempt:c1:1"]


def test_a_halt_keeps_the_reason_its_tool_gave(store, run_id):
    from durable_agents.engine.ports import HaltInfo

    reason = {"type": "GatewayTimeout", "message": "timed out after 30s"}
    halt = HaltInfo(run_id, "c1", "pay", {}, "attempt:c1:1", cause="outcome_unknown", reason=reason)
    assert store.save_halt(halt)
    [kept] = store.list_halts(run_id=run_id)
    assert (kept.cause, kept.reason) == ("outcome_unknown", reason)


def test_orphaning_closes_open_halts_only(store, run_id):
    store.save_halt(_halt(run_id, 1, "c1"))
    store.save_halt(_halt(run_id, 1, "c2"))
    store.resolve_halt_row(run_id, "c1", {"result": 1}, "ann")
    assert store.orphan_halts(run_id) == 1
    statuses = {h.op_id: h.status for h in store.list_halts(run_id=run_id, status=None)}
    assert statuses == {"c1": "resolved", "c2": "orphaned"}
    store.resolve_halt_row(run_id, "c2", {"result": 2}, "bob")
    assert store.list_halts(run_id=run_id, status="orphaned")[0].resolved_by is None


def test_a_conditional_run_update_changes_nothing_unless_the_status_matches(store, run_id):
    assert store.update_run(run_id, {"status": "cancelled"}, if_status=["queued"])
    assert not store.update_run(run_id, {"status": "queued"}, if_status=["awaiting_approval"])
    assert store.get_run(run_id).status == "cancelled"
    store.acquire_lease(run_id, "w1", "tok-1", 30)
    assert store.update_run(run_id, {"turns": 3}, fence="tok-1", if_status=["cancelled"])
    assert not store.update_run(run_id, {"turns": 4}, fence="tok-1", if_status=["queued"])
    assert store.get_run(run_id).turns == 3


def test_a_fenced_approval_request_after_takeover_keeps_the_live_one_and_its_votes(store, run_id):
    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    store.acquire_lease(run_id, "w1", "tok-1", 0.3)
    assert _wait_until(lambda: store.acquire_lease(run_id, "w2", "tok-2", 30))
    live = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, {"kind": "quorum"}, 7)
    assert store.save_approval_request(live, fence="tok-2")
    assert store.save_decision(DecisionInfo(run_id, "c1", "ann", True))
    stale = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 9}, {"kind": "quorum"}, 3)
    with pytest.raises(LeaseLost):
        store.save_approval_request(stale, fence="tok-1")
    with pytest.raises(LeaseLost):
        store.save_approval_request(
            ApprovalRequestInfo(run_id, "c2", "pay", {"cents": 1}, {}, 3), fence="tok-1"
        )
    assert store.get_approval_request(run_id, "c1").arguments == {"cents": 5}
    assert store.get_approval_request(run_id, "c2") is None
    assert [d.approver for d in store.list_decisions(run_id, "c1")] == ["ann"]
    assert not store.save_approval_request(live, fence="tok-2")


def test_a_conditional_approval_status_changes_nothing_unless_it_matches(store, run_id):
    from durable_agents.engine.ports import ApprovalRequestInfo

    store.save_approval_request(ApprovalRequestInfo(run_id, "c1", "pay", {"c": 1}, {}, 1))
    assert store.set_approval_status(run_id, "c1", "withdrawn", if_status=["pending"])
    assert not store.set_approval_status(run_id, "c1", "approved", if_status=["pending"])
    assert store.get_approval_request(run_id, "c1").status == "withdrawn"


def test_a_decision_is_never_saved_on_a_closed_request(store, run_id):
    """A vote on a request decided, withdrawn or expired is refused (issue 43): a decision
    counting it would be journaled after the request closed. A repeat of a vote saved while
    it was open is no new vote: it is found standing."""
    from durable_agents.engine.errors import ApprovalOrphaned
    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    request = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, {"kind": "quorum"}, 7)
    assert store.save_approval_request(request)
    assert store.save_decision(DecisionInfo(run_id, "c1", "ann", True, request=request))
    assert store.set_approval_status(run_id, "c1", "withdrawn", if_status=["pending"])
    with pytest.raises(ApprovalOrphaned):
        store.save_decision(DecisionInfo(run_id, "c1", "bob", True, request=request))
    assert not store.save_decision(DecisionInfo(run_id, "c1", "ann", True, request=request))
    assert [d.approver for d in store.list_decisions(run_id, "c1")] == ["ann"]


def test_a_decision_on_no_request_is_refused(store, run_id):
    """A vote is a row of its request: none (its run deleted or pruned meanwhile), none
    is saved. (The in-memory store saved it, found by the simulator.)"""
    from durable_agents.engine.errors import ApprovalNotFound
    from durable_agents.engine.ports import DecisionInfo

    with pytest.raises(ApprovalNotFound):
        store.save_decision(DecisionInfo(run_id, "c9", "ann", True))
    assert store.list_decisions(run_id, "c9") == []


def test_a_decision_keeps_its_edited_arguments(store, run_id):
    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    request = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, {"kind": "quorum"}, 7)
    assert store.save_approval_request(request)
    edit = {"cents": 2, "memo": "ünï"}
    assert store.save_decision(DecisionInfo(run_id, "c1", "ann", True, arguments=edit))
    assert store.save_decision(DecisionInfo(run_id, "c1", "bob", False, "no"))
    got = {d.approver: d.arguments for d in store.list_decisions(run_id, "c1")}
    assert got == {"ann": edit, "bob": None}


def test_a_decision_is_saved_only_on_the_request_its_maker_was_shown(store, run_id):
    from dataclasses import replace

    from durable_agents.engine.errors import ApprovalArgumentsChanged
    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    shown = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, {"kind": "quorum"}, 7)
    assert store.save_approval_request(shown)
    assert store.save_decision(DecisionInfo(run_id, "c1", "ann", True, request=shown))
    again = replace(shown, arguments={"cents": 5, "memo": ""}, previous_arguments={"cents": 5})
    assert store.save_approval_request(again)  # asked again: the votes go
    with pytest.raises(ApprovalArgumentsChanged) as info:
        store.save_decision(DecisionInfo(run_id, "c1", "bob", True, request=shown))
    assert info.value.details["arguments"] == {"cents": 5, "memo": ""}
    restarted = replace(again, start_seq=9)
    with pytest.raises(ApprovalArgumentsChanged):
        store.save_decision(DecisionInfo(run_id, "c1", "bob", True, request=restarted))
    assert store.list_decisions(run_id, "c1") == []
    assert store.save_decision(DecisionInfo(run_id, "c1", "bob", True, request=again))
    assert [d.approver for d in store.list_decisions(run_id, "c1")] == ["bob"]


def test_a_request_for_other_arguments_replaces_the_decided_one(store, run_id):
    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    first = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, {"kind": "single"}, 7)
    assert store.save_approval_request(first)
    store.save_decision(DecisionInfo(run_id, "c1", "ann", True))
    store.set_approval_status(run_id, "c1", "approved")
    again = ApprovalRequestInfo(
        run_id,
        "c1",
        "pay",
        {"cents": 5, "memo": ""},
        {"kind": "single"},
        7,
        previous_arguments={"cents": 5},
    )
    assert store.save_approval_request(again)
    assert not store.save_approval_request(again)
    request = store.get_approval_request(run_id, "c1")
    assert (request.status, request.arguments) == ("pending", {"cents": 5, "memo": ""})
    assert request.previous_arguments == {"cents": 5}
    assert store.list_decisions(run_id, "c1") == []


def test_a_run_is_created_with_every_field_it_is_given(store):
    """A fork's row is created failed with why (not drivable until its copy is done) and
    with the turns it starts from: every store keeps what ``create_run`` was given."""
    error = {"code": "history.fork_incomplete", "message": "being copied", "retryable": False}
    run = RunInfo(
        run_id="created",
        agent="test",
        status="failed",
        input="go",
        turns=2,
        attempts=1,
        answer="so far",
        last_error=error,
        forked_from="src",
        forked_step=2,
    )
    assert store.create_run(run)
    got = store.get_run("created")
    assert (got.status, got.turns, got.attempts, got.answer) == ("failed", 2, 1, "so far")
    assert got.last_error == error and (got.forked_from, got.forked_step) == ("src", 2)


def test_a_request_is_asked_once_per_arguments_pending_or_decided(store, run_id):
    """A quorum in progress keeps its decisions when a drive asks the same again; so does a
    request already decided (a drive that read the journal just before the decision landed
    must not drop the person's decision row); a request for other arguments, or asked again
    after a decision on others, is asked anew, its decisions dropped."""
    from dataclasses import replace

    from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo

    policy = {"kind": "quorum", "need": 2, "group": "finance"}
    ask = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5}, policy, 7)
    assert store.save_approval_request(ask)
    store.save_decision(DecisionInfo(run_id, "c1", "ann", True))
    assert not store.save_approval_request(ask)
    assert [d.approver for d in store.list_decisions(run_id, "c1")] == ["ann"]
    store.set_approval_status(run_id, "c1", "approved")
    assert not store.save_approval_request(ask)  # the stale drive's ask
    assert store.get_approval_request(run_id, "c1").status == "approved"
    assert [d.approver for d in store.list_decisions(run_id, "c1")] == ["ann"]
    again = replace(ask, previous_arguments={"cents": 4})
    assert store.save_approval_request(again)
    request = store.get_approval_request(run_id, "c1")
    assert request.status == "pending" and request.previous_arguments == {"cents": 4}
    assert store.list_decisions(run_id, "c1") == []
    assert not store.save_approval_request(again)
    other = replace(ask, arguments={"cents": 6})
    assert store.save_approval_request(other)
    assert store.get_approval_request(run_id, "c1").arguments == {"cents": 6}


def test_a_decision_marks_decided_only_the_request_it_was_about(store, run_id):
    """A person decides on what the page showed; a drive that replaced the request with other
    arguments meanwhile (a deploy changed how they validate) keeps its new request pending."""
    from durable_agents.engine.ports import ApprovalRequestInfo

    ask = ApprovalRequestInfo(run_id, "c1", "pay", {"cents": 5, "memo": ""}, {"kind": "single"}, 7)
    assert store.save_approval_request(ask)
    seen = {"cents": 5}
    assert not store.set_approval_status(
        run_id, "c1", "approved", if_status=["pending"], if_arguments=seen
    )
    assert store.get_approval_request(run_id, "c1").status == "pending"
    assert store.set_approval_status(
        run_id, "c1", "approved", if_status=["pending"], if_arguments={"memo": "", "cents": 5}
    )
    assert store.get_approval_request(run_id, "c1").status == "approved"


def test_a_decision_on_the_first_request_never_marks_one_asked_again_about_the_same(store, run_id):
    """An edit that no longer fits (a deploy removed a field it set) makes the drive ask
    again about the arguments its maker was shown: same arguments, another request, whose
    decision has a name of its own. The first decision, finished late by its maker or the
    sweep, must leave it pending (found by the simulator, issue 32: the run then awaited a
    decision nobody could make, every approval answered "already decided")."""
    from durable_agents.engine.ports import ApprovalRequestInfo

    shown = {"cents": 5}
    edited = {"cents": 2, "memo": "goodwill"}
    again = ApprovalRequestInfo(
        run_id, "c1", "pay", shown, {"kind": "single"}, 7, previous_arguments=edited
    )
    assert store.save_approval_request(again)
    assert not store.set_approval_status(
        run_id, "c1", "approved", if_status=["pending"], if_arguments=shown, if_asked_again=False
    )
    assert store.get_approval_request(run_id, "c1").status == "pending"
    assert store.set_approval_status(
        run_id, "c1", "approved", if_status=["pending"], if_arguments=shown, if_asked_again=True
    )
    assert store.get_approval_request(run_id, "c1").status == "approved"


def test_a_record_and_its_run_changes_are_stored_together_or_not_at_all(store, run_id):
    with pytest.raises(ConfigError):
        store.insert(run_id, "rec", "{}", run_changes={"no_such_field": 1})
    assert store.get(run_id, "rec") is None
    store.acquire_lease(run_id, "w1", "tok-1", 30)
    store.insert(run_id, "ok", "{}", fence="tok-1", run_changes={"turns": 2, "status": "running"})
    assert store.get_run(run_id).turns == 2


@DB
@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
@pytest.mark.parametrize("prepared", [True, False])
def test_a_failed_run_update_takes_its_record_with_it(store_kind, prepared):
    from durable_agents.database.store import DjangoStore

    store = DjangoStore(
        using="default" if store_kind == "postgres" else "sqlite", prepared=prepared
    )
    rid = f"atomic-{store_kind}-{prepared}"
    store.create_run(RunInfo(run_id=rid, agent="test"))
    with pytest.raises(Exception):  # noqa: B017 - the database refuses turns < 0
        store.insert(rid, "rec", "{}", run_changes={"turns": -1})
    assert store.get(rid, "rec") is None


# -- issue 17: recovery's dispatch stamp -------------------------------------------------


def test_a_dispatch_stamp_is_on_the_store_clock_and_not_a_change_of_the_row(store, run_id):
    before = store.get_run(run_id)
    assert before.dispatched_at is None
    assert store.mark_dispatched(run_id, seen=None)
    after = store.get_run(run_id)
    assert after.dispatched_at is not None and after.dispatched_at.tzinfo is not None
    assert abs((store.now() - after.dispatched_at).total_seconds()) < 5
    assert after.updated_at == before.updated_at and after.status == before.status
    [listed] = [r for r in store.list_unfinished() if r.run_id == run_id]
    assert listed.dispatched_at == after.dispatched_at
    assert not store.mark_dispatched("no-such-run", seen=None)


def test_a_dispatch_stamp_on_a_whole_second_moves_on_from_itself(store, run_id):
    """SQLite keeps stamps as text to the millisecond; a stamp that fell on a whole second
    (``…:51.000``) read back and passed as ``seen`` (``…:51``) must still match."""
    assert store.mark_dispatched(run_id, seen=None)
    whole = store.get_run(run_id).dispatched_at.replace(microsecond=0)
    if isinstance(store, DjangoStore):
        # as the database's own clock writes it (``Now()``): with its fraction, even if zero
        stamp = whole.strftime("%Y-%m-%d %H:%M:%S.000")
        if connections[store.using].vendor == "postgresql":
            stamp += "+00"
        with connections[store.using].cursor() as cursor:
            cursor.execute(
                f"UPDATE {Run._meta.db_table} SET dispatched_at = %s WHERE run_id = %s",
                [stamp, run_id],
            )
    else:
        store._runs[run_id] = dataclasses.replace(store._runs[run_id], dispatched_at=whole)
    seen = store.get_run(run_id).dispatched_at
    assert seen == whole
    assert store.mark_dispatched(run_id, seen=seen)
    assert store.get_run(run_id).dispatched_at >= whole


def test_a_dispatch_stamp_moves_only_from_the_one_its_caller_saw(store, run_id):
    assert store.mark_dispatched(run_id, seen=None)
    first = store.get_run(run_id).dispatched_at
    assert not store.mark_dispatched(run_id, seen=None), "another pass stamped it meanwhile"
    time.sleep(0.01)
    assert store.mark_dispatched(run_id, seen=first)
    second = store.get_run(run_id).dispatched_at
    assert second > first
    assert not store.mark_dispatched(run_id, seen=first), "a stale read loses"
    assert store.get_run(run_id).dispatched_at == second


def test_concurrent_dispatch_stamps_have_one_winner(store, run_id):
    results = in_threads(8, lambda i: store.mark_dispatched(run_id, seen=None))
    assert sorted(results) == [False] * 7 + [True]


def test_a_new_run_is_never_created_stamped(store):
    from datetime import UTC, datetime

    given = RunInfo(run_id="stamp-new", dispatched_at=datetime(2000, 1, 1, tzinfo=UTC))
    assert store.create_run(given)
    assert store.get_run("stamp-new").dispatched_at is None
