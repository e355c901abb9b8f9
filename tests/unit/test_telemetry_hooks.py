"""The engine's telemetry hooks (``engine.telemetry``), seen by a recording observer on the
in-memory store: one drive per lease held, one model turn per generated response, one tool
call per invocation with its safety class and attempt, outcomes from how each ended. The
default observer does nothing; the OpenTelemetry one is tested in
tests/integration/test_telemetry.py."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine import telemetry
from durable_agents.engine.journal import header
from durable_agents.engine.ports import RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash

# The span the current hook runs inside, as a tracer's context would carry it.
_current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("current", default=None)


class Recorder(telemetry.Observer):
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.created: list[str] = []
        self.takeovers: list[tuple[str, str]] = []

    @contextmanager
    def _span(self, kind: str, **attributes: Any) -> Iterator[telemetry.Span]:
        record = {"kind": kind, "parent": _current.get(), **attributes}
        self.spans.append(record)
        token = _current.set(record)

        class Handle(telemetry.Span):
            def set(self, **more: Any) -> None:
                record.update({k: v for k, v in more.items() if v is not None})

        try:
            yield Handle()
        except BaseException as exc:
            record.setdefault("outcome", telemetry.outcome_of(exc))
            raise
        finally:
            _current.reset(token)
        record.setdefault("outcome", telemetry.OK)

    def drive(self, run_id, agent):
        return self._span("drive", run_id=run_id, agent=agent)

    def model_turn(self, run_id, n):
        return self._span("model_turn", run_id=run_id, n=n)

    def tool_call(self, run_id, call_id, tool, safety, attempt):
        return self._span(
            "tool_call", run_id=run_id, call_id=call_id, tool=tool, safety=safety, attempt=attempt
        )

    def run_created(self, run_id):
        self.created.append(run_id)

    def takeover(self, run_id, reason):
        self.takeovers.append((run_id, reason))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["kind"] == kind]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    telemetry.install(recorder)
    try:
        yield recorder
    finally:
        telemetry.install(None)


def _tools(crash_on: set[str] | None = None) -> list[da.Tool]:
    crash_on = crash_on if crash_on is not None else set()

    @da.tool(read_only=True)
    def lookup(order_id: str) -> dict:
        return {"order": order_id}

    @da.tool(idempotent=True)
    def receipt(order_id: str) -> str:
        return "sent"

    @da.tool(idempotency_key=lambda args: f"mail:{args['order_id']}")
    def mail(order_id: str) -> str:
        return "mailed"

    @da.tool
    def refund(order_id: str) -> dict:
        if "refund" in crash_on:
            crash_on.discard("refund")
            raise Crash()
        return {"refunded": order_id}

    @da.tool
    def broken(order_id: str) -> dict:
        raise ValueError("no such order")

    return [lookup, receipt, mail, refund, broken]


SCRIPT = [
    scripted.calls(
        scripted.call("lookup", {"order_id": "7"}),
        scripted.call("receipt", {"order_id": "7"}),
        scripted.call("mail", {"order_id": "7"}),
    ),
    scripted.calls(
        scripted.call("refund", {"order_id": "7"}), scripted.call("broken", {"order_id": "7"})
    ),
    scripted.text("done"),
]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_run_is_one_drive_with_a_span_per_turn_and_per_call(store, recorder, concurrency):
    agent = da.Agent("traced", ScriptedModel(SCRIPT), "", _tools(), tool_concurrency=concurrency)
    assert agent.run("t1", "go", store=store).answer == "done"
    assert recorder.created == ["t1"]
    [drive] = recorder.of("drive")
    assert drive | {"parent": None} == {
        "kind": "drive",
        "parent": None,
        "run_id": "t1",
        "agent": "traced",
        "outcome": "ok",
    }
    turns = recorder.of("model_turn")
    assert [(t["n"], t["outcome"], t["finish"]) for t in turns] == [
        (1, "ok", "tool_calls"),
        (2, "ok", "tool_calls"),
        (3, "ok", "stop"),
    ]
    assert all(t["parent"] is drive and t["run_id"] == "t1" for t in turns)
    calls = {c["call_id"]: c for c in recorder.of("tool_call")}
    assert {
        cid: (c["tool"], c["safety"], c["attempt"], c["outcome"]) for cid, c in calls.items()
    } == {
        "call_1_1": ("lookup", "read_only", 0, "ok"),
        "call_1_2": ("receipt", "idempotent", 0, "ok"),
        "call_1_3": ("mail", "keyed", 0, "ok"),
        "call_2_1": ("refund", "side_effect", 1, "ok"),
        "call_2_2": ("broken", "side_effect", 1, "error"),
    }
    # Also from the tool pool's threads: a call's span is inside its drive's.
    assert all(c["parent"] is drive and c["run_id"] == "t1" for c in calls.values())


def test_a_resume_is_another_drive_and_replays_without_spans(store, recorder):
    agent = da.Agent("traced", ScriptedModel(SCRIPT), "", _tools({"refund"}))
    with pytest.raises(Crash):
        agent.run("t2", "go", store=store)
    first = recorder.of("drive")
    assert [d["outcome"] for d in first] == ["error"]
    assert [c["call_id"] for c in recorder.of("tool_call")][-1] == "call_2_1"
    # The crash left a live attempt on the side effect: the next drive halts on it.
    with pytest.raises(da.OutcomeUnknown):
        agent.run("t2", "go", store=store)
    second = recorder.of("drive")[1]
    assert second["outcome"] == "halted"
    assert [s for s in recorder.spans[recorder.spans.index(second) :] if s is not second] == []
    assert recorder.created == ["t2"]


def test_a_pause_is_an_outcome_not_an_error(store, recorder):
    @da.tool(requires_approval=True)
    def pay(cents: int) -> str:
        return "paid"

    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("ok")]
    agent = da.Agent("payer", ScriptedModel(script), "", [pay])
    with pytest.raises(da.ApprovalPending):
        agent.run("t3", "go", store=store)
    assert [d["outcome"] for d in recorder.of("drive")] == ["paused"]
    assert recorder.of("tool_call") == []  # nothing ran: it waits for a person
    da.approve("t3", "call_1_1", approved=True, by="ann", store=store)
    drives = recorder.of("drive")
    assert [d["outcome"] for d in drives] == ["paused", "ok"]
    [call] = recorder.of("tool_call")
    assert (call["tool"], call["safety"], call["outcome"], call["parent"]) == (
        "pay",
        "side_effect",
        "ok",
        drives[1],
    )


def test_a_takeover_is_told(store, recorder, clock):
    agent = da.Agent("traced", ScriptedModel([scripted.text("done")]), "", [])
    store.create_run(RunInfo("t4", agent="traced"))
    store.insert("t4", *header())
    assert store.acquire_lease("t4", "worker-dead@host:41", "dead-token", 30)
    with pytest.raises(da.RunBusy):
        agent.run("t4", "go", store=store)
    assert recorder.takeovers == []
    assert [d["outcome"] for d in recorder.of("drive")] == []  # busy before any drive
    clock.t += 31
    assert agent.run("t4", "go", store=store).answer == "done"
    assert recorder.takeovers == [("t4", "expired")]


def test_the_default_observer_does_nothing():
    observer = telemetry.observer()
    assert type(observer) is telemetry.Observer
    with observer.drive("r", "a") as span:
        span.set(outcome="ok")
    with pytest.raises(KeyError), observer.tool_call("r", "c", "t", "read_only", 0):
        raise KeyError("passes through")


def test_a_throttled_drive_says_so_and_runs_no_tool(store, recorder):
    @da.tool(idempotent=True, rate="1/h")
    def ping(n: int) -> int:
        return n

    script = [
        scripted.calls(scripted.call("ping", {"n": 1})),
        scripted.calls(scripted.call("ping", {"n": 2})),
        scripted.text("ok"),
    ]
    with pytest.raises(da.Throttled):
        da.Agent("pinger", ScriptedModel(script), "", [ping]).run("t9", "go", store=store)
    assert [d["outcome"] for d in recorder.of("drive")] == ["throttled"]
    assert [c["outcome"] for c in recorder.of("tool_call")] == ["ok"]  # the second never ran
