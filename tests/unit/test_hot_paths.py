"""The engine's per-record shortcuts (docs/benchmarks.md) decide exactly as the long ways do:
``encode`` refuses what the full check refuses, with its message; the transcript a driver
keeps from turn to turn equals one rebuilt from the journal."""

from __future__ import annotations

import math

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.errors import ProtocolError
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.engine.records import Record, _check, decode, encode
from durable_agents.engine.transcript import RunState
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

REFUSED = [
    {"a": math.nan},
    {"a": [1, {"b": -math.inf}]},
    {1: "x"},
    {"a": [{"b": {2: 3}}]},
    {True: 1},
    {None: 1},
    ({"a": 1}, {(1, 2): 3}),
    {"a": "\ud800"},
    {"\udfff": 1},
    {"a": object()},
    {"a": {1, 2}},
    {"a": b"bytes"},
    [1, (2, {"x": math.inf})],
]

ACCEPTED = [
    None,
    "text \u2028 \u2029 é ✓ 😀",
    {"a": (1, 2), "b": [True, None, 1.5, -0.0], "c": {"d": {"e": []}}},
    [{"k": "v"}, ({"z": 1},)],
    {"z": 1, "a": {"y": 2, "b": 3}},
    1e300,
]


def _self_list() -> list:
    loop: list = [1]
    loop.append(loop)
    return loop


def _self_dict() -> dict:
    loop: dict = {"a": 1}
    loop["me"] = {"again": [loop]}
    return loop


# Values the encoder refuses with a bare ValueError (an int longer than Python's int->str
# limit, 4300 digits; a value that contains itself) that must be the same ProtocolError.
REFUSED += [10**5000, {"a": [-(10**4300)]}, _self_list(), _self_dict(), [_self_dict()]]


@pytest.mark.parametrize("value", REFUSED, ids=range(len(REFUSED)))
def test_encode_refuses_what_the_full_check_refuses_with_its_message(value):
    with pytest.raises(ProtocolError) as full:
        _check(value, "$")
    with pytest.raises(ProtocolError) as fast:
        encode(value)
    assert str(fast.value) == str(full.value)
    assert fast.value.code == "protocol.encoding"


def test_encode_names_where_a_value_contains_itself_and_how_long_an_int_is():
    with pytest.raises(ProtocolError, match=r"\$\.me\.again\[0\] is the value at \$ itself"):
        encode(_self_dict())
    with pytest.raises(ProtocolError, match=r"\$\.a\[0\] is an integer of 4301 digits") as info:
        encode({"a": [-(10**4300)]})
    assert len(str(info.value)) < 300  # the number itself is not in the message


def test_encode_refuses_a_value_nested_deeper_than_it_can_walk():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nested too deeply") as info:
        encode({"a": deep})
    assert info.value.code == "protocol.encoding"


def test_an_int_at_the_limit_encodes_and_shared_values_are_not_cycles():
    big = 10**4299  # 4300 digits
    assert decode(encode({"n": big})) == {"n": big}
    shared = {"x": 1}
    assert encode([shared, {"again": shared}]) == '[{"x":1},{"again":{"x":1}}]'


@pytest.mark.parametrize("value", ACCEPTED, ids=range(len(ACCEPTED)))
def test_encode_accepts_what_the_full_check_accepts_canonically(value):
    _check(value, "$")
    text = encode(value)
    assert "\u2028" not in text and "\u2029" not in text
    assert encode(decode(text)) == text  # a fixed point


def test_a_driven_transcript_is_the_one_rebuilt_from_the_journal(store):
    """Each model request of a long run carries exactly the messages a fresh fold of the
    journal gives at that point (the driver keeps its settled prefix between turns)."""

    @da.tool(read_only=True)
    def pair(n: int) -> dict:
        """Return n twice."""
        return {"n": n, "again": n}

    run_id = "hot-transcript"
    journal = Journal(store)
    mismatches: list[int] = []

    def compare(request) -> None:
        fresh = RunState.of(journal.records(run_id)).messages()
        if list(request.messages) != fresh:
            mismatches.append(len(request.messages))

    script = [
        scripted.calls(scripted.call("pair", {"n": i}), scripted.call("pair", {"n": -i}))
        for i in range(12)
    ]
    script.append(scripted.text("Done."))
    agent = da.Agent("hot-transcript", ScriptedModel(script, on_request=compare), "Go.", [pair])
    result = agent.run(run_id, "Start.", store=store)
    assert result.answer == "Done." and result.turns == 13
    assert mismatches == []


def _rec(name: str, body: dict, seq: int) -> Record:
    return Record("r", name, seq, encode(body))


def test_a_kept_transcript_follows_a_pending_call_and_a_late_user_message():
    """A turn with an unanswered call is not kept as settled; a user message recorded after a
    settled turn (a fork's) drops what was kept."""
    call = {"id": "c1", "name": "t", "arguments": {}}
    start = _rec(names.RUN_START, {"kind": "start", "input": "hi"}, 1)
    turn1 = _rec(
        names.model(1),
        {"kind": "model", "message": {"role": "assistant", "content": "", "tool_calls": [call]}},
        2,
    )
    result1 = _rec(names.tool("c1"), {"kind": "tool", "result": "ok", "is_error": False}, 3)
    turn2 = _rec(
        names.model(2), {"kind": "model", "message": {"role": "assistant", "content": "a"}}, 4
    )
    user = _rec(names.user(1), {"kind": "user", "text": "and then?"}, 5)

    kept = RunState.of([start, turn1])
    assert kept.messages() == RunState.of([start, turn1]).messages()  # c1 pending
    for rec in (result1, turn2):
        kept.add(rec)
        assert kept.messages() == RunState.of([start, turn1, result1, turn2][: rec.seq]).messages()
    kept.add(user)
    everything = [start, turn1, result1, turn2, user]
    assert kept.messages() == RunState.of(everything).messages()
    assert [m.content for m in kept.messages()][-2:] == ["and then?", "a"]


def test_a_run_log_read_lazily_answers_as_one_read_at_once(store):
    """A run's first read makes Records only of the names asked for (a finished run's resume
    looks up three); lookups, order, length, writes and a later read give what a log whose
    every record was made at once gives, and one name is always the same Record."""
    journal = Journal(store)
    run_id = "hot-lazy"
    store.create_run(RunInfo(run_id=run_id, agent="a"))
    for i in range(5):
        journal.write(run_id, f"step:{i}", {"kind": "value", "value": i})
    eager = list(journal.open(run_id))

    log = journal.open(run_id)
    assert len(log) == len(eager) and log._unread is not None  # nothing made yet
    third = log.get("step:2")
    assert third is not None and third.get("value") == 2
    assert log.get("step:2") is third and log.has("step:4") and not log.has("step:9")
    assert log.get("step:9") is None
    assert log.write("step:1", {"kind": "value", "value": "other"})[0].get("value") == 1
    assert [(r.name, r.seq, r.data) for r in log] == [(r.name, r.seq, r.data) for r in eager]
    assert next(r for r in log if r.name == "step:2") is third  # the one asked for, kept

    journal.write(run_id, "step:5", {"kind": "value", "value": 5})  # another writer's
    late = journal.open(run_id)
    late.get("step:0")
    late.refresh(since_last=True)  # a later read after a lazy first one
    assert [r.name for r in late][-1] == "step:5" and len(late) == len(eager) + 1
    written, inserted = late.write("step:6", {"kind": "value", "value": 6})
    assert inserted and late.get("step:6") is written and len(late) == len(eager) + 2
