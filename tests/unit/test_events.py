"""What the engine announces to its host (``engine.events``), on a store that listens: each
fact once, at the write that makes it true — never again on a resume, a repeated decision, a
second recovery pass or a fork of a halted run's journal; and nothing after a crash between
the fact and its announcement (at most once). The Django signals built on this are tested
in tests/integration/test_signals.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine import events, failpoints
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.ports import RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Clock, Crash
from tests.support.wiring import wired


class ListeningStore(InMemoryStore):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.heard: list[tuple[str, dict[str, Any]]] = []

    def announce(self, event: str, details: dict[str, Any]) -> None:
        assert event in events.EVENTS
        self.heard.append((event, dict(details)))

    def said(self) -> list[str]:
        return [event for event, _ in self.heard]


@pytest.fixture
def store(clock: Clock) -> Iterator[ListeningStore]:
    store = ListeningStore(clock=clock)
    with wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        lease_ttl=lambda: 30.0,
        halt_min_age=lambda: 0.0,
        recovery_interval=lambda: 0.0,
    ):
        yield store


@da.tool(requires_approval=True)
def refund(order: str) -> str:
    return f"refunded {order}"


def refunder() -> da.Agent:
    script = [scripted.calls(scripted.call("refund", {"order": "7"})), scripted.text("done")]
    return da.Agent("u-ev-refund", ScriptedModel(script), "Refund.", [refund])


@da.tool
def charge(card: str) -> str:
    raise da.ToolOutcomeUnknown("timed out after sending")


def charger() -> da.Agent:
    script = [scripted.calls(scripted.call("charge", {"card": "4242"})), scripted.text("ok")]
    return da.Agent("u-ev-charge", ScriptedModel(script), "Charge.", [charge])


def test_each_fact_of_an_approved_run_is_announced_once(store):
    agent = refunder()
    with pytest.raises(da.ApprovalPending):
        agent.run("ev-1", "refund 7", store=store)
    with pytest.raises(da.ApprovalPending):
        agent.run("ev-1", store=store)  # resumed: the same request, not asked again
    assert store.said() == ["approval_requested"]
    da.approve("ev-1", "call_1_1", True, by="ann", store=store)
    da.approve("ev-1", "call_1_1", True, by="ann", store=store)  # the same decision again
    assert agent.run("ev-1", store=store).answer == "done"
    assert store.said() == ["approval_requested", "approval_decided", "run_finished"]
    assert store.heard[1][1]["decision"] == "approve" and store.heard[1][1]["by"] == "ann"


def test_a_crash_between_the_decision_and_its_announcement_loses_only_the_announcement(
    store, monkeypatch
):
    agent = refunder()
    with pytest.raises(da.ApprovalPending):
        agent.run("ev-crash", "refund 7", store=store)
    real = failpoints.hit

    def hit(name: str) -> None:
        if name == "after-decision:call_1_1":
            raise Crash(name)
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    with pytest.raises(Crash):
        da.approve("ev-crash", "call_1_1", True, by="ann", store=store)
    monkeypatch.setattr(failpoints, "hit", real)
    # The decision stands (the journal holds it) and the run finishes; it is not announced
    # late by the drive that carries it on.
    assert agent.run("ev-crash", store=store).answer == "done"
    assert store.said() == ["approval_requested", "run_finished"]


def test_a_halt_is_announced_once_and_a_fork_that_keeps_it_halts_anew(store):
    agent = charger()
    with pytest.raises(da.OutcomeUnknown):
        agent.run("ev-halt", "charge", store=store)
    with pytest.raises(da.OutcomeUnknown):
        agent.run("ev-halt", store=store)
    assert store.heard == [
        (
            "run_halted",
            {
                "run_id": "ev-halt",
                "agent": "u-ev-charge",
                "call_id": "call_1_1",
                "tool": "charge",
                "cause": "outcome_unknown",
            },
        )
    ]
    fork_id = da.fork("ev-halt", from_step=1, new_run_id="ev-halt-fork", store=store)
    assert [(e, d["run_id"]) for e, d in store.heard[1:]] == [("run_halted", fork_id)]
    # The fork halts on the copied attempt and still says what the tool said.
    assert store.heard[1][1]["cause"] == "outcome_unknown"


def test_a_failure_is_announced_per_failed_drive_and_recovery_giving_up_once(store, clock):
    agent = da.Agent("u-ev-fail", ScriptedModel([]), "Nothing scripted.", [])
    with pytest.raises(da.DurableAgentsError):
        agent.run("ev-fail", "go", store=store)
    assert store.said() == ["run_failed"]
    failed = store.heard[0][1]
    assert failed["attempts"] == 1 and failed["error"]["code"]

    store.create_run(RunInfo(run_id="ev-dead", agent="u-ev-fail", input="go", status="running"))
    store.update_run("ev-dead", {"attempts": 99})
    store.heard.clear()
    clock.advance(3600)  # past any backoff
    recover(store=store)
    recover(store=store)  # the run is failed already: nothing again
    assert store.said() == ["run_failed"]
    assert store.heard[0][1]["error"]["code"] == "run.recovery_exhausted"
    assert store.heard[0][1]["will_retry"] is False
