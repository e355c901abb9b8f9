"""The audit hash chains on every store (docs/audit.md): the same definition everywhere,
and tampering — an edited record, a deleted one, a reordering, an edited action-log row —
reported at the right place."""

from __future__ import annotations

from durable_agents.engine.audit import (
    chain_hash,
    data_digest,
    link_hash,
    verify_actions,
    verify_run,
)
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import ActionInfo
from durable_agents.engine.records import encode
from tests.support import tamper
from tests.support.procs import in_threads


def _write(store, run_id: str, n: int = 4) -> list[str]:
    journal = Journal(store)
    for i in range(n):
        journal.do(run_id, f"s{i}", lambda i=i: {"kind": "value", "i": i, "text": "é ✓"})
    return [link.name for link in store.chain(run_id)]


def test_every_record_is_chained_by_the_one_definition(store, run_id):
    names = _write(store, run_id)
    assert names[0] == "@journal"
    prev = None
    for link in store.chain(run_id):
        assert link.hash == chain_hash(prev, link.name, link.data)
        prev = link.hash
    report = verify_run(store, run_id)
    assert report.ok and report.links == 5 and report.unchained == 0 and report.head == prev


def test_the_definition_is_pinned():
    """A change of the hash's bytes breaks every chain already stored: this must not move
    (it moved once, before release, when the link came to hash the data digest)."""
    header = '{"format":"durable_agents.journal.v1","kind":"header"}'
    assert chain_hash(None, "@journal", header) == (
        "0c7321dcbc9054e97b66a4b125f1c3d8f3a619d09b805439b4cd396f5044c771"
    )
    # chain_hash is written out for speed: it must stay the two steps a redacted export's
    # verifier takes (the data digest, then the link).
    for prev in (None, "", "ab" * 32):
        for name, data in (("@journal", header), ("tool:é✓:1", '{"text":"é ✓ \\u0000"}')):
            assert chain_hash(prev, name, data) == link_hash(prev, name, data_digest(data))


def test_an_edited_record_is_reported_where_it_was_edited(store, run_id):
    _write(store, run_id)
    tamper.edit_record(store, run_id, "s1", encode({"kind": "value", "i": 100, "text": "é ✓"}))
    report = verify_run(store, run_id)
    assert not report.ok and report.broken_name == "s1"
    assert "changed" in report.reason


def test_a_deleted_record_is_reported_at_the_record_after_it(store, run_id):
    _write(store, run_id)
    tamper.delete_record(store, run_id, "s1")
    report = verify_run(store, run_id)
    assert not report.ok and report.broken_name == "s2"
    assert "deleted" in report.reason


def test_a_reordering_is_reported_at_the_first_moved_record(store, run_id):
    _write(store, run_id)
    tamper.swap_records(store, run_id, "s1", "s2")
    report = verify_run(store, run_id)
    assert not report.ok and report.broken_name == "s2"  # now in s1's place


def test_records_written_before_the_chain_are_an_unchained_prefix(store, run_id):
    """Rows from before the migration have no hash; the chain starts at the first record
    written after it, from the empty hash."""
    names = _write(store, run_id, 2)
    tamper.clear_hashes(store, run_id, names)
    journal = Journal(store)
    journal.do(run_id, "after", lambda: {"kind": "value"})
    journal.do(run_id, "after2", lambda: {"kind": "value"})
    report = verify_run(store, run_id)
    assert report.ok and report.unchained == 3 and report.links == 5
    assert "unchained prefix of 3" in report.message()
    tamper.edit_record(store, run_id, "after2", encode({"kind": "value", "x": 1}))
    assert verify_run(store, run_id).broken_name == "after2"


def test_a_removed_hash_after_hashed_records_is_a_break(store, run_id):
    names = _write(store, run_id)
    tamper.clear_hashes(store, run_id, [names[2]])
    report = verify_run(store, run_id)
    assert not report.ok and report.broken_name == names[2]
    assert "no hash" in report.reason


def test_concurrent_writers_to_one_run_keep_one_chain(store, run_id):
    """Decisions and signals write unfenced while a driver writes: the chain stays one line."""
    journal = Journal(store)
    journal.do(run_id, "first", lambda: {"kind": "value"})

    def write(i: int) -> None:
        for k in range(5):
            store.insert(run_id, f"w{i}:{k}", encode({"kind": "value", "i": i, "k": k}))

    in_threads(6, write)
    report = verify_run(store, run_id)
    assert report.ok and report.links == 32
    assert [link.position for link in store.chain(run_id)] == sorted(
        link.position for link in store.chain(run_id)
    )


def _log(store, n: int) -> None:
    for i in range(n):
        store.log_action(
            ActionInfo(
                f"ann{i}", "approve", f"run-{i}", "c1", {"note": "ok", "n": i}, channel="admin"
            )
        )


def test_the_action_log_is_one_chain(store):
    _log(store, 4)
    report = verify_actions(store)
    assert report.ok and report.links == 4 and report.head


def test_an_edited_action_row_is_reported(store):
    _log(store, 4)
    position = tamper.edit_action(store, 2, {"note": "changed", "n": 2})
    report = verify_actions(store)
    assert not report.ok and report.broken_at == position


def test_concurrent_action_writers_keep_one_chain(store):
    def log(i: int) -> None:
        for k in range(4):
            store.log_action(ActionInfo(f"u{i}", "cancel", f"r{i}-{k}", "", {"k": k}))

    in_threads(4, log)
    report = verify_actions(store)
    assert report.ok and report.links == 16
