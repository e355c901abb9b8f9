"""Timers: ``ctx.sleep`` / ``ctx.wait_until`` journal the wake time once, the run pauses
``sleeping``, an early resume pauses again without a second record, and the sweep wakes a
due run (in-memory store, virtual clock, runs handed over inline)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


def sleeping_agent(fired, seconds=60.0, name="unit-timers", safe=True, until=None):
    @da.tool(idempotent=safe)
    def nap(ctx: da.ToolContext) -> str:
        """Wait a while, then go on."""
        fired.append("nap")
        woke = ctx.sleep("later", seconds) if until is None else ctx.wait_until("later", until)
        fired.append("woke")
        return woke.isoformat()

    script = [scripted.calls(scripted.call("nap", {})), scripted.text("rested")]
    return da.Agent(name, ScriptedModel(script), "", [nap])


def _wait_records(store, run_id):
    return [r for r in Journal(store).records(run_id) if r.name.startswith(names.WAIT)]


def test_sleep_journals_its_wake_time_once_and_an_early_resume_pauses_again(store, fired, clock):
    a = sleeping_agent(fired)
    start = store.now()
    with pytest.raises(da.TimerPending) as info:
        a.run("r1", "go", store=store)
    assert info.value.details["waits"] == ["later"]
    wake_ms = info.value.details["wake_ms"]
    assert store.get_run("r1").status == "sleeping"
    [rec] = _wait_records(store, "r1")
    assert rec.get("kind") == "timer" and rec.get("wake_ms") == wake_ms
    assert abs(wake_ms / 1000 - (start + timedelta(seconds=60)).timestamp()) < 1

    clock.advance(59)  # a recovered or redeployed run waits to the same instant
    with pytest.raises(da.TimerPending) as again:
        a.run("r1", store=store)
    assert again.value.details["wake_ms"] == wake_ms
    assert len(_wait_records(store, "r1")) == 1
    assert Journal(store).get("r1", names.waited("later")) is None
    assert "woke" not in fired

    clock.advance(2)
    assert a.run("r1", store=store).answer == "rested"
    assert fired.count("woke") == 1
    waited = Journal(store).get("r1", names.waited("later"))
    assert waited.get("outcome") == "woke" and waited.get("woke_ms") >= wake_ms


def test_pending_shows_the_wake_time(store, fired):
    a = sleeping_agent(fired, seconds=3600)
    with pytest.raises(da.TimerPending) as info:
        a.run("r1", "go", store=store)
    [p] = da.pending(store=store)
    assert p.status == "sleeping"
    [w] = p.waits
    assert w.kind == "timer" and w.name == "later"
    assert w.deadline == datetime.fromtimestamp(info.value.details["wake_ms"] / 1000, tz=UTC)


def test_wait_until_a_past_time_goes_on_at_once(store, fired):
    a = sleeping_agent(fired, until=store.now() - timedelta(days=1))
    assert a.run("r1", "go", store=store).answer == "rested"
    assert fired == ["nap", "woke"]


def test_wait_until_a_future_time_sleeps_until_then(store, fired, clock):
    when = store.now() + timedelta(minutes=5)
    a = sleeping_agent(fired, until=when)
    with pytest.raises(da.TimerPending) as info:
        a.run("r1", "go", store=store)
    assert info.value.details["wake_ms"] == int(when.timestamp() * 1000)
    clock.advance(301)
    assert a.run("r1", store=store).answer == "rested"


def test_the_sweep_wakes_only_due_runs_and_never_early(store, fired, clock):
    a = sleeping_agent(fired, seconds=60)
    with pytest.raises(da.TimerPending):
        a.run("r1", "go", store=store)
    b = sleeping_agent(fired, seconds=600, name="unit-timers-long")
    with pytest.raises(da.TimerPending):
        b.run("r2", "go", store=store)
    assert wake_timers(store=store) == []
    clock.advance(61)
    assert wake_timers(store=store) == ["r1"]  # handed over, and here driven at once
    assert store.get_run("r1").status == "finished"
    assert store.get_run("r2").status == "sleeping"
    assert wake_timers(store=store) == []


def test_cancel_works_while_sleeping(store, fired):
    a = sleeping_agent(fired)
    with pytest.raises(da.TimerPending):
        a.run("r1", "go", store=store)
    da.cancel("r1", by="ann", store=store)
    assert store.get_run("r1").status == "cancelled"


def test_bad_timers_are_refused_with_nothing_recorded(store, fired):
    for bad in (-1, float("nan"), "10", True):
        a = sleeping_agent(fired, seconds=bad, name=f"unit-bad-{len(fired)}")
        run_id = f"bad-{len(fired)}"
        with pytest.raises(da.ConfigError):
            a.run(run_id, "go", store=store)
        assert _wait_records(store, run_id) == []
    naive = sleeping_agent(fired, until=datetime(2030, 1, 1), name="unit-naive")
    with pytest.raises(da.ConfigError):
        naive.run("naive", "go", store=store)
    assert _wait_records(store, "naive") == []


def test_a_sleep_in_a_tool_that_is_not_retry_safe_is_refused(store, fired):
    a = sleeping_agent(fired, safe=False)
    with pytest.raises(da.ConfigError) as info:
        a.run("r1", "go", store=store)
    assert info.value.code == "config.wait_not_retry_safe"
    assert _wait_records(store, "r1") == []


def test_the_sweep_wakes_a_signal_wait_whose_deadline_passed(store, fired, clock):
    @da.tool(idempotent=True)
    def wait_payment(ctx: da.ToolContext) -> str:
        got = ctx.await_signal("paid", timeout=60)
        return "timeout" if isinstance(got, da.TimedOut) else str(got)

    script = [scripted.calls(scripted.call("wait_payment", {})), scripted.text("ok")]
    a = da.Agent("unit-sweep-signal", ScriptedModel(script), "", [wait_payment])
    with pytest.raises(da.SignalPending):
        a.run("r1", "go", store=store)
    assert wake_timers(store=store) == []
    clock.advance(61)
    assert wake_timers(store=store) == ["r1"]
    assert store.get_run("r1").status == "finished"
    assert Journal(store).get("r1", names.tool("call_1_1")).get("result") == "timeout"


def test_wake_now_is_a_staff_decision_journaled_once(store, fired, clock):
    a = sleeping_agent(fired, seconds=3600)
    with pytest.raises(da.TimerPending) as info:
        a.run("r1", "go", store=store)
    wake_ms = info.value.details["wake_ms"]
    with pytest.raises(da.ConfigError) as missing:
        da.wake_timer("r1", "other", by="ann", store=store)
    assert missing.value.code == "timer.not_found"
    with pytest.raises(da.ConfigError) as nobody:
        da.wake_timer("nope", "later", by="ann", store=store)
    assert nobody.value.code == "run.not_found"
    assert Journal(store).get("r1", names.waited("later")) is None

    clock.advance(10)
    outcome = da.wake_timer("r1", "later", by="ann", store=store)
    assert outcome.recorded and outcome.woke and outcome.early and outcome.by == "ann"
    assert outcome.wake_ms == wake_ms and outcome.woke_ms < wake_ms
    assert store.get_run("r1").status == "finished" and fired.count("woke") == 1
    waited = Journal(store).get("r1", names.waited("later"))
    assert waited.get("early") is True and waited.get("by") == "ann"
    # The tool still reads the journaled wake time: the record, not the clock, was changed.
    tool = Journal(store).get("r1", names.tool("call_1_1"))
    assert datetime.fromtimestamp(wake_ms / 1000, tz=UTC).isoformat() in str(tool.get("result"))

    again = da.wake_timer("r1", "later", by="bob", store=store)
    assert not again.recorded and not again.woke and again.by == "ann"
    assert [a.action for a in store.list_actions(run_id="r1")] == ["wake"]


def test_a_timer_that_woke_by_its_time_is_not_woken_again(store, fired, clock):
    a = sleeping_agent(fired, seconds=60)
    with pytest.raises(da.TimerPending):
        a.run("r1", "go", store=store)
    clock.advance(61)
    assert a.run("r1", store=store).answer == "rested"
    late = da.wake_timer("r1", "later", by="ann", store=store)
    assert not late.recorded and not late.early and late.by is None


def test_the_sweep_reads_a_quiet_run_once_until_it_is_written_to_or_due(
    store, fired, clock, monkeypatch
):
    """Runs paused for days are not read again on every sweep: a run read and left alone is
    read again only when its row or its journal changes, or its wake time comes."""
    a = sleeping_agent(fired, seconds=600)
    with pytest.raises(da.TimerPending):
        a.run("r1", "go", store=store)
    reads: list[str] = []
    load = store.load

    def counting_load(run_id, after=0):
        reads.append(run_id)
        return load(run_id, after)

    monkeypatch.setattr(store, "load", counting_load)
    assert wake_timers(store=store) == [] and reads == ["r1"]
    clock.advance(60)
    assert wake_timers(store=store) == [] and reads == ["r1"], "read again, nothing new"
    store.insert("r1", "note:unrelated", '{"kind":"value"}')  # any record: read again
    assert wake_timers(store=store) == [] and reads == ["r1", "r1"]
    assert wake_timers(store=store) == [] and reads == ["r1", "r1"]
    clock.advance(541)  # due: read, and woken
    assert wake_timers(store=store) == ["r1"]
    assert store.get_run("r1").status == "finished"
