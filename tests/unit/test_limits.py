"""Limits (engine.limits) on the in-memory store: a run over its agent's limit, a call over
its tool's rate or concurrency, or a model call over the site's provider rate waits
``throttled`` and goes on later; nothing recorded runs twice, nothing fails."""

from __future__ import annotations

import threading
import time

import pytest

import durable_agents as da
from durable_agents.engine import limits
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.errors import ConfigError
from durable_agents.engine.ports import FINISHED, THROTTLED, RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.wiring import wired


def _one_call(tool: str, args: dict) -> list:
    return [scripted.calls(scripted.call(tool, args)), scripted.text("done")]


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("10/s", 10, 1.0), ("500/m", 500, 60.0), ("1000/h", 1000, 3600.0), ("3/10s", 3, 10.0)],
)
def test_rates_read_as_written(text, count, period):
    rate = limits.parse_rate(text, "t")
    assert (rate.count, rate.period) == (count, period)


@pytest.mark.parametrize("bad", ["", "ten/s", "10", "0/s", "10/0s", "10/fortnight", 10, None])
def test_a_rate_that_is_not_one_is_a_config_error(bad):
    with pytest.raises(ConfigError) as err:
        limits.parse_rate(bad, "tool 'x'")
    assert err.value.code == "config.rate" and "10/s" in str(err.value)


def test_bad_limits_are_refused_where_they_are_declared():
    with pytest.raises(ConfigError, match="max_concurrent_runs"):
        da.Agent("lim-bad", ScriptedModel([]), max_concurrent_runs=0)
    with pytest.raises(ConfigError, match="max_concurrent"):
        da.tool(read_only=True, max_concurrent=True)(lambda: "x")
    with pytest.raises(ConfigError, match="rate"):
        da.tool(read_only=True, rate="fast")(lambda: "x")


def test_a_run_over_its_agents_limit_waits_and_goes_when_the_slot_is_given_back(store, fired):
    seen: dict = {}

    @da.tool(read_only=True)
    def look(order: str) -> str:
        fired.append(order)
        if "b" not in seen:
            # Run A holds the agent's only slot while its tool runs: B must wait.
            with pytest.raises(da.Throttled) as throttled:
                agent.run("lim-b", "go", store=store)
            seen["b"] = (store.get_run("lim-b").status, throttled.value.details)
            seen["waiting"] = list(store.list_throttled())
        return "ok"

    agent = da.Agent(
        "lim-agent",
        ScriptedModel(_one_call("look", {"order": "o"})),
        "",
        [look],
        max_concurrent_runs=1,
    )
    assert agent.run("lim-a", "go", store=store).answer == "done"
    status, details = seen["b"]
    assert status == THROTTLED
    assert details["key"] == "agent/lim-agent" and details["reason"] == "slots"
    [waiting] = seen["waiting"]
    assert (waiting.run_id, waiting.key, waiting.limit) == ("lim-b", "agent/lim-agent", "1 at once")
    # A gave its slot back at its end and handed B over (the unit store drives it inline).
    assert store.get_run("lim-b").status == FINISHED
    assert fired == ["o", "o"]  # one call each: B's wait ran nothing
    assert list(store.list_throttled()) == []


def test_a_call_over_its_tools_rate_waits_until_a_permit_frees(store, clock, fired):
    @da.tool(idempotent=True, rate="1/m")
    def notify(who: str) -> str:
        fired.append(who)
        return "sent"

    script = [
        scripted.calls(scripted.call("notify", {"who": "ann"})),
        scripted.calls(scripted.call("notify", {"who": "bob"})),
        scripted.text("done"),
    ]
    agent = da.Agent("lim-rate", ScriptedModel(script), "", [notify])
    with pytest.raises(da.Throttled) as throttled:
        agent.run("lim-r", "go", store=store)
    assert throttled.value.details["reason"] == "rate"
    assert throttled.value.details["limit"] == "1/m"
    assert store.get_run("lim-r").status == THROTTLED
    assert fired == ["ann"]
    assert wake_timers(store=store) == []  # not due yet: no busy loop
    clock.advance(30)
    assert wake_timers(store=store) == []
    clock.advance(31)
    assert wake_timers(store=store) == ["lim-r"]
    assert store.get_run("lim-r").status == FINISHED
    assert fired == ["ann", "bob"]


def test_a_side_effect_throttled_before_its_claim_is_not_a_halt(store, clock, fired):
    """Throttling comes before the attempt claim: the call provably never started, so its
    retry is a first attempt, not an unknown outcome."""

    @da.tool(rate="1/h")
    def charge(amount: int) -> str:
        fired.append(amount)
        return "charged"

    script = [
        scripted.calls(scripted.call("charge", {"amount": 1})),
        scripted.calls(scripted.call("charge", {"amount": 2})),
        scripted.text("done"),
    ]
    agent = da.Agent("lim-charge", ScriptedModel(script), "", [charge])
    with pytest.raises(da.Throttled):
        agent.run("lim-c", "go", store=store)
    assert [e.name for e in store.load("lim-c") if e.name.startswith("attempt:")] == [
        "attempt:call_1_1:1"
    ]
    clock.advance(3601)
    assert wake_timers(store=store) == ["lim-c"]
    assert store.get_run("lim-c").status == FINISHED
    assert fired == [1, 2]


@pytest.mark.parametrize(("limit", "most"), [(1, 1), (None, 3)])
def test_parallel_calls_of_a_tool_never_exceed_its_concurrency(store, clock, fired, limit, most):
    """The run's own parallel calls (``tool_concurrency=3``) wait in the drive for a slot of
    the tool: never more at once than its limit, measured by the tool; without the limit the
    same calls overlap (the measurement can fail)."""
    running = [0]
    lock = threading.Lock()

    @da.tool(read_only=True, max_concurrent=limit)
    def fetch(page: int) -> int:
        with lock:
            running[0] += 1
            fired.append(running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return page

    calls = [scripted.call("fetch", {"page": n}) for n in (1, 2, 3)]
    script = [scripted.calls(*calls), scripted.text("done")]
    agent = da.Agent("lim-par", ScriptedModel(script), "", [fetch], tool_concurrency=3)
    assert agent.run("lim-p", "go", store=store).answer == "done"  # never throttled
    assert len(fired) == 3 and max(fired) == most


def test_a_slot_held_by_a_dead_driver_frees_with_its_lease(store, clock, fired):
    @da.tool(read_only=True)
    def look(order: str) -> str:
        fired.append(order)
        return "ok"

    agent = da.Agent(
        "lim-dead",
        ScriptedModel(_one_call("look", {"order": "o"})),
        "",
        [look],
        max_concurrent_runs=1,
    )
    # A driver took run "gone"'s lease and the agent's slot, then its process died.
    store.create_run(RunInfo("gone", agent="lim-dead", status="running"))
    assert store.acquire_lease("gone", "dead-worker", "tok-dead", 30.0) is not None
    assert store.claim_slot("agent/lim-dead", "gone", "gone", "tok-dead", 1)
    with pytest.raises(da.Throttled):
        agent.run("lim-d", "go", store=store)
    assert fired == []
    clock.advance(31)  # the dead driver's lease expired: so did its slot
    assert wake_timers(store=store) == ["lim-d"]
    assert store.get_run("lim-d").status == FINISHED and fired == ["o"]


def test_a_stale_driver_never_gives_back_the_slot_its_successor_took(store, clock, fired):
    """Found by the simulator (seed 321): a driver's lease lapsed inside a tool, a successor
    took the run and the agent's slot for it (the same holder: the run), and the stale
    driver's drive, ending, gave that slot back: a third run was driven beside the successor,
    over the limit of one. A slot is given back only under the lease token it was taken
    with."""
    from durable_agents.engine.errors import LeaseLost

    @da.tool(read_only=True)
    def look(order: str) -> str:
        fired.append(order)
        clock.advance(31)  # this driver's lease lapses; a successor takes the run, its slot
        assert store.acquire_lease("lim-s", "successor", "tok-next", 30.0) is not None
        assert store.claim_slot("agent/lim-stale", "lim-s", "lim-s", "tok-next", 1)
        return "ok"

    agent = da.Agent(
        "lim-stale",
        ScriptedModel(_one_call("look", {"order": "o"}) * 2),
        "",
        [look],
        max_concurrent_runs=1,
    )
    with pytest.raises(LeaseLost):
        agent.run("lim-s", "go", store=store)
    with pytest.raises(da.Throttled):  # the successor still holds the agent's only slot
        agent.run("lim-t", "go", store=store)
    assert store.get_run("lim-t").status == THROTTLED and fired == ["o"]


def test_a_providers_model_rate_throttles_model_calls(store, clock, fired):
    script = [scripted.text("one")]
    rates = {"scripted": limits.parse_rate("1/m", "MODEL_RATES")}
    agent = da.Agent("lim-model", ScriptedModel(script * 2))
    with wired(model_rates=lambda: rates):
        assert agent.run("lim-m1", "go", store=store).answer == "one"
        with pytest.raises(da.Throttled) as throttled:
            agent.run("lim-m2", "go", store=store)
        assert throttled.value.details["key"] == "model/scripted"
        clock.advance(61)
        assert wake_timers(store=store) == ["lim-m2"]
    assert store.get_run("lim-m2").status == FINISHED


def test_a_pending_run_says_what_it_waits_for(store, clock):
    @da.tool(idempotent=True, rate="1/h")
    def ping(n: int) -> int:
        return n

    script = [
        scripted.calls(scripted.call("ping", {"n": 1})),
        scripted.calls(scripted.call("ping", {"n": 2})),
        scripted.text("done"),
    ]
    with pytest.raises(da.Throttled):
        da.Agent("lim-pending", ScriptedModel(script), "", [ping]).run("lim-q", "go", store=store)
    [run] = da.pending(store=store)
    assert run.status == THROTTLED and "limit is full" in run.why
    [wait] = run.waits
    assert (wait.kind, wait.name, wait.prompt) == ("throttle", "tool/ping", "1/h")


def test_a_sub_run_over_its_agents_limit_waits_and_its_parent_with_it(store, clock, fired):
    """A sub-run whose agent's only slot is taken waits ``throttled``; its parent pauses on
    it (awaiting its child, with the child's retry time) and goes on when the child ends."""

    @da.tool(read_only=True)
    def note(text: str) -> str:
        fired.append(text)
        return "noted"

    child_script = [scripted.calls(scripted.call("note", {"text": "child"})), scripted.text("c")]
    inner = da.Agent("lim-inner", ScriptedModel(child_script), "", [note], max_concurrent_runs=1)
    outer_script = [
        scripted.calls(scripted.call("lim-inner", {"input": "go"})),
        scripted.text("parent done"),
    ]
    outer = da.Agent("lim-outer", ScriptedModel(outer_script), "", [inner.as_tool()])
    # Another driver of lim-inner holds its only slot.
    store.create_run(RunInfo("busy", agent="lim-inner", status="running"))
    assert store.acquire_lease("busy", "elsewhere", "tok-busy", 30.0) is not None
    assert store.claim_slot("agent/lim-inner", "busy", "busy", "tok-busy", 1)
    with pytest.raises(da.Pause) as paused:
        outer.run("lim-tree", "go", store=store)
    assert paused.value.details.get("wake_ms")  # the parent's call tries again then too
    [child] = store.list_throttled(key="agent/lim-inner")
    assert child.run_id.startswith("lim-tree/")
    assert store.get_run("lim-tree").status == "awaiting_input"
    store.release_lease("busy", "tok-busy")  # the other driver is done
    clock.advance(2)
    assert wake_timers(store=store) == [child.run_id]
    assert store.get_run(child.run_id).status == FINISHED
    assert store.get_run("lim-tree").status == FINISHED
    assert fired == ["child"]


def test_a_throttled_run_can_be_cancelled_and_waits_no_more(store, clock, fired):
    @da.tool(idempotent=True, rate="1/h")
    def ping(n: int) -> int:
        fired.append(n)
        return n

    script = [
        scripted.calls(scripted.call("ping", {"n": 1})),
        scripted.calls(scripted.call("ping", {"n": 2})),
        scripted.text("done"),
    ]
    with pytest.raises(da.Throttled):
        da.Agent("lim-cancel", ScriptedModel(script), "", [ping]).run("lim-x", "go", store=store)
    da.cancel("lim-x", by="ann", store=store)
    assert store.get_run("lim-x").status == "cancelled"
    assert list(store.list_throttled()) == []
    clock.advance(3601)
    assert wake_timers(store=store) == []
    assert fired == [1]
