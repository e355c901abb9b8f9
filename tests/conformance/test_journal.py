"""The Journal over every store: memoised steps, the format header, attempt claims and
refusals of bad input that leave nothing behind."""

from __future__ import annotations

import pytest

from durable_agents.engine.errors import ConfigError, JournalVersionError, ProtocolError
from durable_agents.engine.journal import Journal
from durable_agents.engine.records import HEADER_NAME, JOURNAL_FORMAT, encode
from tests.support.procs import in_threads


@pytest.fixture
def journal(store):
    return Journal(store)


def test_header_is_written_first(journal, store, run_id):
    journal.do(run_id, "first", lambda: {"kind": "value", "v": 1})
    names = [e.name for e in store.load(run_id)]
    assert names == [HEADER_NAME, "first"]
    header = journal.records(run_id)[0]
    assert header.body == {"kind": "header", "format": JOURNAL_FORMAT}


def test_do_records_once_and_replays(journal, run_id):
    calls = []

    def fn():
        calls.append(1)
        return {"kind": "value", "n": len(calls)}

    first = journal.do(run_id, "step", fn)
    second = journal.do(run_id, "step", fn)
    assert calls == [1]
    assert first.body == second.body == {"kind": "value", "n": 1}
    assert Journal(journal.store).do(run_id, "step", fn).body == {"kind": "value", "n": 1}
    assert calls == [1], "a fresh journal (a new process) replays too"


def test_do_returns_the_winners_record(journal, store, run_id):
    """A driver that lost the race reads back the other's record, not its own."""
    journal.do(run_id, "warm", lambda: {"kind": "value"})
    store.insert(run_id, "contested", encode({"kind": "value", "who": "other"}))
    rec, inserted = journal.write(run_id, "contested", {"kind": "value", "who": "me"})
    assert not inserted and rec.get("who") == "other"


def test_a_step_that_raises_records_nothing(journal, store, run_id):
    def boom():
        raise RuntimeError("tool blew up")

    with pytest.raises(RuntimeError):
        journal.do(run_id, "fails", boom)
    assert journal.get(run_id, "fails") is None
    assert journal.do(run_id, "fails", lambda: {"kind": "value", "ok": True}).get("ok")


def test_user_steps(journal, run_id):
    assert journal.step(run_id, "pick", lambda: [1, 2, 3]) == [1, 2, 3]
    assert journal.step(run_id, "pick", lambda: "other") == [1, 2, 3]
    assert journal.get(run_id, "step:pick").kind == "step"


def test_history_in_commit_order(journal, run_id):
    for i in range(5):
        journal.do(run_id, f"s{i}", lambda i=i: {"kind": "value", "i": i})
    history = journal.records(run_id)
    assert [r.name for r in history] == [HEADER_NAME, "s0", "s1", "s2", "s3", "s4"]
    assert [r.seq for r in history] == sorted(r.seq for r in history)


def test_claim_attempt_has_one_winner_under_threads(journal, run_id):
    journal.do(run_id, "warm", lambda: {"kind": "value"})
    results = in_threads(16, lambda i: journal.claim_attempt(run_id, "attempt:c1:1"))
    assert sum(1 for won, _ in results if won) == 1
    claims = {rec.get("claim") for _, rec in results}
    assert len(claims) == 1
    marker = journal.get(run_id, "attempt:c1:1")
    assert marker.kind == "attempt" and marker.get("attempted_at") > 0


def test_not_started_record(journal, run_id):
    won, marker = journal.claim_attempt(run_id, "attempt:c1:1")
    assert won
    rec = journal.mark_not_started(run_id, "not-started:c1:1", marker.get("claim"))
    assert rec.kind == "not-started" and rec.get("claim") == marker.get("claim")


def test_round_trip_of_awkward_values(journal, run_id):
    value = {
        "kind": "value",
        "text": "a\u2028b\u2029c <script>&</script> ☃ 𝄞",
        "big": 2**100,
        "neg": -(2**70),
        "float": 0.1,
        "nested": {"z": [1, {"y": None, "x": [True, False]}], "a": ""},
    }
    journal.write(run_id, "awkward", value)
    again = Journal(journal.store).get(run_id, "awkward")
    assert again.body == value
    raw = journal.store.get(run_id, "awkward").data
    assert "\\u2028" in raw and "<script>" in raw and "☃" in raw
    assert encode(again.body) == raw, "the encoding is a fixed point"


def test_foreign_format_is_refused_before_any_write(store, run_id):
    store.insert(run_id, HEADER_NAME, encode({"kind": "header", "format": "other.v9"}))
    journal = Journal(store)
    with pytest.raises(JournalVersionError) as info:
        journal.do(run_id, "step", lambda: {"kind": "value"})
    assert "other.v9" in str(info.value)
    with pytest.raises(JournalVersionError):
        journal.records(run_id)
    assert [e.name for e in store.load(run_id)] == [HEADER_NAME]


def test_headerless_run_is_refused(store, run_id):
    store.insert(run_id, "model:1", encode({"kind": "model"}))
    journal = Journal(store)
    with pytest.raises(JournalVersionError):
        journal.get(run_id, "model:1")
    with pytest.raises(JournalVersionError):
        journal.write(run_id, "x", {"kind": "value"})
    assert [e.name for e in store.load(run_id)] == ["model:1"]


@pytest.mark.parametrize(
    "bad_run_id", ["", "has space", "x" * 401, "semi;colon", "emoji☃", None, 42]
)
def test_bad_run_ids_store_nothing(journal, store, bad_run_id):
    with pytest.raises(ConfigError) as info:
        journal.do(bad_run_id, "s", lambda: {"kind": "value"})
    assert "run id" in str(info.value)
    assert store.list_unfinished() == []


@pytest.mark.parametrize("name", ["@journal", "@spend/1", "", "x" * 501, "ctl\x00name"])
def test_reserved_or_bad_names_store_nothing(journal, store, run_id, name):
    with pytest.raises(ConfigError):
        journal.do(run_id, name, lambda: {"kind": "value"})
    assert store.load(run_id) == []


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "value", "v": float("nan")},
        {"kind": "value", "v": float("inf")},
        {"kind": "value", "v": {1: "int key"}},
        {"kind": "value", "v": object()},
        {"kind": "value", "v": b"bytes"},
        {"kind": "value", "v": "\ud800 lone surrogate"},
        {"no": "kind"},
        ["not", "a", "dict"],
    ],
)
def test_records_that_do_not_encode_store_nothing(journal, store, run_id, value):
    with pytest.raises(ProtocolError) as info:
        journal.do(run_id, "bad", lambda: value)
    assert str(info.value)
    assert store.load(run_id) == [], "not even the header"
