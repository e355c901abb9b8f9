"""Every refusal leaves a run row that agrees with its journal, and recovery never hands a
run over forever (issue 10, hole 6), on the in-memory store with a virtual clock."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.engine.retry import RetryPolicy
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Crash
from tests.support.wiring import wired


@pytest.fixture(autouse=True)
def _hand_overs_are_recorded(store):
    """A run handed to a driver is listed in ``store.sent``, not driven: these tests look at
    what recovery hands over."""
    sent: list[str] = []
    store.sent = sent
    with wired(dispatcher=sent.append):
        yield


def reader(name="u-reader", instructions="Read.", crash=False):
    fired = []

    @da.tool(read_only=True)
    def look(x: int) -> int:
        fired.append(x)
        if crash and len(fired) == 1:
            raise Crash()
        return x

    script = [scripted.calls(scripted.call("look", {"x": 1})), scripted.text("seen")]
    return da.Agent(name, ScriptedModel(script), instructions, [look], on_drift="error")


def test_a_drift_refusal_leaves_a_failed_row_with_its_error(store):
    with pytest.raises(Crash):
        reader(crash=True).run("r1", "go", store=store)
    assert store.get_run("r1").status == "running"  # its driver died
    with pytest.raises(da.AgentDrift):
        reader(instructions="Read carefully.").run("r1", None, store=store)
    run = store.get_run("r1")
    assert run.status == "failed" and run.last_error["code"] == "config.agent_drift"
    assert run.attempts == 1 and not run.last_error["retryable"]
    assert recover(store=store) == [] and store.sent == []
    [p] = da.pending(store=store)
    assert "different agent" in p.why and "resume" in p.why


def test_a_cancelled_run_driven_again_gets_its_row_back_in_step(store):
    agent = reader()
    store.create_run(RunInfo(run_id="r1", agent=agent.name, input="go"))
    da.cancel("r1", by="bob", store=store)
    store.update_run("r1", {"status": "queued"})  # what a racing writer used to leave
    with pytest.raises(da.ConfigError) as info:
        da.resume("r1", store=store)
    assert info.value.code == "run.cancelled" and store.get_run("r1").status == "cancelled"
    assert recover(store=store) == []


def test_a_run_whose_agent_is_gone_fails_once_instead_of_being_handed_over_forever(store):
    store.create_run(RunInfo(run_id="r1", agent="no-such-agent", input="go"))
    assert drive_quietly("r1", store=store) == "failed"
    run = store.get_run("r1")
    assert run.status == "failed" and run.last_error["code"] == "config.agent_missing"
    assert recover(store=store) == []


def test_recovery_backs_off_and_stops_after_its_attempts(store, clock):
    """A run whose driver keeps dying (status running, lease lapsed) is handed over again
    with growing delays, then left failed for a person, saying why."""
    policy = RetryPolicy(max_attempts=3, base_delay=10, max_delay=60)
    store.create_run(RunInfo(run_id="dies", agent="u-reader", input="go", status="running"))
    store.create_run(RunInfo(run_id="waits", agent="u-reader", input="go"))
    passes = []
    for _ in range(20):
        passes.append(recover(store=store, policy=policy, interval=1))
        clock.t += 5
    # A queued run is handed over again after 1, 2, 4… times its wait (never flooding).
    assert [i for i, sent in enumerate(passes) if "waits" in sent] == [1, 2, 4, 8, 16]
    dies = [i for i, sent in enumerate(passes) if "dies" in sent]
    assert len(dies) == 3 and dies[1] - dies[0] < dies[2] - dies[1], "the delays grow"
    run = store.get_run("dies")
    assert run.status == "failed" and run.attempts == 3
    assert run.last_error["code"] == "run.recovery_exhausted"
    why = {p.run_id: p.why for p in da.pending(store=store)}["dies"]
    assert "gave up after 3 attempts" in why and "durable_agents.resume" in why


def test_recover_is_public():
    import durable_agents
    from durable_agents.celery import recovery

    assert durable_agents.recover is not None and "recover" in durable_agents.__all__
    assert callable(recovery.recover)


def test_the_journal_still_says_what_the_refused_drive_saw(store):
    with pytest.raises(Crash):
        reader(crash=True).run("r1", "go", store=store)
    before = [r.name for r in Journal(store).records("r1")]
    with pytest.raises(da.AgentDrift):
        reader(instructions="Other.").run("r1", None, store=store)
    assert [r.name for r in Journal(store).records("r1")] == before


def test_a_run_that_finishes_while_it_is_being_cancelled_stays_finished(clock):
    """The cancel checked the run before taking its lease; the run finished in between."""
    from durable_agents.engine.commands.runs import create_run

    class FinishesFirst(InMemoryStore):
        armed = False

        def acquire_lease(self, run_id, holder, token, ttl):
            if self.armed:
                self.armed = False
                reader().run(run_id, None, store=self)  # its driver finishes it meanwhile
            return super().acquire_lease(run_id, holder, token, ttl)

    store = FinishesFirst(clock=clock)
    create_run(reader(), "go", "r1", store=store)
    store.armed = True
    with pytest.raises(da.ConfigError) as info:
        da.cancel("r1", by="bob", store=store)
    assert info.value.code == "run.finished"
    assert store.get_run("r1").status == "finished"
    assert Journal(store).get("r1", "run:cancelled") is None
