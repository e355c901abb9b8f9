"""Recovery never floods the broker (issue 17): a run handed to a driver less than one
recovery interval ago is not sent again, and a run nobody picks up is sent again less and
less often. On the in-memory store with a virtual clock; the dispatcher only records."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import runtime
from durable_agents.engine.commands.recovery import MAX_RESEND_WAIT, recover
from durable_agents.engine.ports import RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.testing import InMemoryStore

INTERVAL = 15.0


class Clock:
    def __init__(self) -> None:
        self.t = 3_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    store = InMemoryStore(clock=clock)
    saved = dict(runtime._runtime.__dict__)
    sent: list[str] = []
    runtime.configure(dispatcher=sent.append, recovery_interval=lambda: INTERVAL)
    store.sent = sent
    yield store
    runtime._runtime.__dict__.update(saved)


@pytest.fixture
def agent():
    return da.Agent("u-resend", ScriptedModel([scripted.text("ok")]), "Answer.", [])


def test_recovery_twice_within_an_interval_sends_once_and_again_after_it(store, clock, agent):
    agent.start("go", run_id="r1", store=store)
    assert store.sent == ["r1"]
    assert recover(store=store) == [], "just handed over by start: maybe still in the queue"
    clock.t += INTERVAL
    assert recover(store=store) == ["r1"]
    clock.t += INTERVAL - 1
    assert recover(store=store) == [], "recovery sent it less than an interval ago"
    clock.t += 1
    assert recover(store=store) == ["r1"]
    assert store.sent == ["r1", "r1", "r1"]
    assert store.get_run("r1").dispatched_at == store.now()


def test_a_run_nobody_picks_up_is_sent_again_less_and_less_often(store, clock, agent):
    """An hour of passes with no worker consuming: one message per doubling of the wait,
    not one per pass (the issue saw the queue grow by one per run per pass)."""
    agent.start("go", run_id="r1", store=store)
    passes = int(3600 / INTERVAL)
    sends_at = []
    for n in range(1, passes + 1):
        clock.t += INTERVAL
        if recover(store=store):
            sends_at.append(n)
    assert sends_at[:5] == [1, 2, 4, 8, 16], sends_at
    assert len(sends_at) <= 9, f"{len(sends_at)} messages for {passes} passes"
    # The waits are capped: a run stuck for days is still sent about once an hour.
    run = store.get_run("r1")
    clock.t = run.dispatched_at.timestamp() + MAX_RESEND_WAIT * 10
    assert recover(store=store) == ["r1"]
    clock.t += MAX_RESEND_WAIT
    assert recover(store=store) == ["r1"]


def test_a_run_queued_again_counts_from_then(store, clock, agent):
    """An approval or a resolved halt makes the run queued and hands it over: that hand-over
    counts like recovery's own."""
    agent.start("go", run_id="r1", store=store)
    clock.t += INTERVAL
    assert recover(store=store) == ["r1"]
    clock.t += 5
    store.update_run("r1", {"status": "queued"})  # what approve() does before dispatching
    clock.t += INTERVAL - 1
    assert recover(store=store) == []
    clock.t += 1
    assert recover(store=store) == ["r1"]


def test_a_dead_drivers_run_is_not_sent_twice_within_an_interval(store, clock):
    store.create_run(RunInfo(run_id="dead", agent="u-resend", input="go", status="running"))
    assert recover(store=store) == ["dead"], "no lease, no hand-over known: at once"
    assert store.get_run("dead").attempts == 1
    clock.t += 1
    assert recover(store=store) == [], "handed over a second ago: its driver may be starting"
    assert store.get_run("dead").attempts == 1, "a skipped pass counts no failed attempt"
    clock.t += INTERVAL
    assert recover(store=store) == ["dead"]
    assert store.get_run("dead").attempts == 2


def test_an_interval_of_zero_sends_every_run_nobody_drives(store, clock, agent):
    agent.start("go", run_id="r1", store=store)
    assert recover(store=store, interval=0) == ["r1"]
    assert recover(store=store, interval=0) == ["r1"]


def test_the_interval_is_the_configured_one(store, clock, agent):
    runtime.configure(recovery_interval=lambda: 60.0)
    agent.start("go", run_id="r1", store=store)
    clock.t += INTERVAL
    assert recover(store=store) == []
    clock.t += 60 - INTERVAL
    assert recover(store=store) == ["r1"]


def test_a_run_halted_between_recoverys_move_and_its_hand_over_is_not_handed_over(
    store, clock, agent
):
    """Recovery lists a run its driver left running, moves it, and marks its hand-over; in
    between, a driver took the run and halted it on an unknown outcome. Handed over anyway,
    the drive would only halt again: a halted run is a person's (issue 43, found by the
    simulator: ``halted_never_driven``)."""
    agent.start("go", run_id="r1", store=store)
    store.update_run("r1", {"status": "running"})
    clock.t += INTERVAL
    mark = store.mark_dispatched

    def halted_first(run_id, **kwargs):
        store.update_run(run_id, {"status": "halted"})  # what the other driver wrote
        return mark(run_id, **kwargs)

    store.mark_dispatched = halted_first
    assert recover(store=store) == []
    assert store.sent == ["r1"], "only the start's hand-over"
    assert store.get_run("r1").status == "halted"
