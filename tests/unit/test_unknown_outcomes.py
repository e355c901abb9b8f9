"""Unknown outcomes on the in-memory store with a virtual clock (issue 10, holes 1, 2, 3, 5
and 13): a live attempt halts before anything else; forks carry it; a halt is resolved only
once it is old enough, by taking the call's next attempt; a stalled driver's result becomes
evidence; ``Journal.step`` is at most once."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import runtime
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


def charge_agent(fired, *, deploy="v1", on_drift=None, crash=False, during=None, name="u-charge"):
    """``charge(order)``; ``v2`` adds a required ``currency``; ``removed`` drops the tool."""

    def effect(order, ctx):
        fired.append((order, ctx.run_id, ctx.idempotency_key))
        if during is not None:
            return during()
        if crash and len(fired) == 1:
            raise Crash()
        return {"charged": order}

    if deploy == "v2":

        @da.tool
        def charge(order: str, currency: str, ctx: da.ToolContext) -> dict:
            return effect(order, ctx)

    else:

        @da.tool
        def charge(order: str, ctx: da.ToolContext) -> dict:  # type: ignore[misc]
            return effect(order, ctx)

    @da.tool(read_only=True)
    def peek(order: str) -> str:
        return order

    script = [scripted.calls(scripted.call("charge", {"order": "7"})), scripted.text("charged")]
    tools = [peek] if deploy == "removed" else [charge, peek]
    return da.Agent(name, ScriptedModel(script), "Charge.", tools, on_drift=on_drift)


def names(store, run_id):
    return [r.name for r in Journal(store).records(run_id)]


# -- 1 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deploy,on_drift", [("v2", None), ("removed", None), ("v2", "error"), ("v1", "error")]
)
def test_a_live_attempt_halts_before_anything_else_is_looked_at(store, deploy, on_drift):
    fired = []
    with pytest.raises(Crash):
        charge_agent(fired, crash=True).run("r1", "go", store=store)
    for _ in range(2):  # and it stays halted
        with pytest.raises(da.OutcomeUnknown) as info:
            charge_agent(fired, deploy=deploy, on_drift=on_drift).run("r1", None, store=store)
        assert info.value.details["halts"] == ["call_1_1"]
        run = store.get_run("r1")
        assert (run.status, run.last_error) == ("halted", None)
    assert "tool:call_1_1" not in names(store, "r1") and len(fired) == 1
    [halt] = store.list_halts(run_id="r1")
    assert (halt.tool_name, halt.arguments, halt.attempt) == (
        "charge",
        {"order": "7"},
        "attempt:call_1_1:1",
    )


# -- 2 ----------------------------------------------------------------------------------


def test_a_fork_carries_a_live_attempt_unless_the_patch_records_its_result(store):
    fired = []
    agent = charge_agent(fired, crash=True)
    with pytest.raises(Crash):
        agent.run("src", "go", store=store)
    fork_id = da.fork("src", 1, store=store)
    assert store.get_run(fork_id).status == "halted"
    assert [h.op_id for h in store.list_halts(run_id=fork_id)] == ["call_1_1"]
    with pytest.raises(da.OutcomeUnknown):
        agent.run(fork_id, None, store=store)
    patched = da.fork("src", 1, da.Patch(tool_results={"call_1_1": "it went through"}), store=store)
    assert store.get_run(patched).status == "queued"
    assert agent.run(patched, None, store=store).answer == "charged"
    assert len(fired) == 1


def test_idempotency_keys_are_the_same_in_a_run_and_all_its_forks(store):
    keys = []

    @da.tool(idempotent=True)
    def send(to: str, ctx: da.ToolContext) -> str:
        keys.append((ctx.run_id, ctx.idempotency_key))
        if len(keys) == 1:
            raise Crash()
        return "sent"

    script = [scripted.calls(scripted.call("send", {"to": "a"})), scripted.text("done")]
    agent = da.Agent("u-keys", ScriptedModel(script), "", [send])
    with pytest.raises(Crash):
        agent.run("src", "go", store=store)
    fork_id = da.fork("src", 1, store=store)
    grandchild = da.fork(fork_id, 1, store=store)
    agent.run(grandchild, None, store=store)
    agent.run("src", None, store=store)
    assert [k[0] for k in keys] == ["src", grandchild, "src"]
    assert len({k[1] for k in keys}) == 1, keys
    assert Journal(store).get(fork_id, "fork").get("origin") == "src"


# -- 3 ----------------------------------------------------------------------------------


def test_a_halt_is_resolved_only_once_it_is_old_enough(store, clock):
    fired = []
    with pytest.raises(Crash):
        charge_agent(fired, crash=True).run("r1", "go", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("r1", store=store)
    runtime.configure(halt_min_age=lambda: 60.0)
    clock.advance(30)
    for min_age in (None, 5):  # a smaller min_age than the setting does not lower it
        with pytest.raises(da.HaltTooYoung) as info:
            da.resolve_halt("r1", "call_1_1", "x", by="ann", min_age=min_age, store=store)
        assert info.value.details["resolvable_at"] == "1970-01-12T13:47:40+00:00"
        assert "can be resolved from 1970-01-12T13:47:40+00:00" in str(info.value)
    clock.advance(31)
    record = da.resolve_halt("r1", "call_1_1", {"charged": "7"}, by="ann", store=store)
    assert record.get("reconciled") and store.get_run("r1").status == "finished"
    claim = Journal(store).get("r1", "attempt:call_1_1:2")
    assert claim.get("resolution") and claim.get("by") == "ann" and len(fired) == 1


def test_the_default_minimum_age_is_twice_the_lease():
    fresh = runtime.Runtime(lease_ttl=lambda: 12.0)
    assert fresh.halt_min_age() == 24.0


def test_a_stalled_driver_loses_its_result_to_the_resolution_and_leaves_evidence(store, clock):
    fired = []

    def stall_while_a_person_resolves():
        clock.advance(31)  # past the lease: this driver is stalled, not dead
        with pytest.raises(da.OutcomeUnknown):
            da.resume("r1", store=store)  # another driver halts the run
        da.resolve_halt("r1", "call_1_1", {"charged": False}, is_error=True, by="ann", store=store)
        assert store.get_run("r1").status == "finished"
        return {"charged": "7"}  # ...and then the stalled charge lands

    agent = charge_agent(fired, during=stall_while_a_person_resolves)
    with pytest.raises(da.LeaseLost):
        agent.run("r1", "go", store=store)
    journal = Journal(store)
    assert journal.get("r1", "tool:call_1_1").get("result") == {"charged": False}
    late = journal.get("r1", "@late/call_1_1/1")
    assert late.get("result") == {"charged": "7"} and late.get("outcome") == "ok"
    assert late.get("claim") == journal.get("r1", "attempt:call_1_1:1").get("claim")
    assert journal.get("r1", "attempt:call_1_1:3") is None and len(fired) == 1
    assert store.get_run("r1").status == "finished"


# -- 5 ----------------------------------------------------------------------------------


def test_a_stale_driver_never_reopens_a_resolved_halt(store, clock):
    fired = []

    def stall_then_say_unknown():
        clock.advance(31)
        with pytest.raises(da.OutcomeUnknown):
            da.resume("r1", store=store)
        da.resolve_halt(
            "r1", "call_1_1", {"charged": "7"}, evidence="ledger", by="ann", store=store
        )
        raise da.ToolOutcomeUnknown("timed out after sending")

    with pytest.raises(da.LeaseLost):
        charge_agent(fired, during=stall_then_say_unknown).run("r1", "go", store=store)
    [halt] = store.list_halts(run_id="r1", status=None)
    assert (halt.status, halt.resolved_by) == ("resolved", "ann")
    assert halt.resolution["evidence"] == "ledger"
    late = Journal(store).get("r1", "@late/call_1_1/1")
    assert late.get("outcome") == "unknown" and "timed out" in late.get("result")


def test_a_stale_driver_leaves_no_halt_open_on_a_call_its_successor_finished(
    store, clock, monkeypatch
):
    """Driver A takes the run and is frozen before it reads the journal; B takes the run
    over once A's lease lapses and charges. A reads the journal while B is inside the tool
    (an attempt, no result yet), halts on it, and loses the run at its status write. B
    records the result and finishes. The halt A wrote was never true: it is closed with the
    result, not left open on a finished run (seed 89786)."""
    from durable_agents.engine import failpoints

    fired: list = []
    real_hit = failpoints.hit

    def crash_after_the_turn(name):
        if name == "after-model:1":
            raise Crash(name)
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", crash_after_the_turn)
    captured: list = []
    real_load, real_acquire = store.load, store.acquire_lease

    def during():
        captured.append(real_load("r1"))  # A's read, while B is inside the tool
        return {"charged": "7"}

    agent = charge_agent(fired, during=during)
    with pytest.raises(Crash):
        agent.run("r1", "go", store=store)
    monkeypatch.setattr(failpoints, "hit", real_hit)
    clock.advance(31)
    acquired: list = []

    def acquire_lease(*args, **kwargs):
        lease = real_acquire(*args, **kwargs)
        acquired.append(lease)
        return lease

    def load(run_id, *args, **kwargs):
        if not acquired:
            return real_load(run_id, *args, **kwargs)
        store.load, store.acquire_lease = real_load, real_acquire
        clock.advance(31)  # A is frozen past its lease; B takes the run over
        assert da.resume("r1", store=store).answer == "charged"
        return captured[0]

    store.load, store.acquire_lease = load, acquire_lease
    with pytest.raises(da.LeaseLost):
        da.resume("r1", store=store)
    assert len(fired) == 1 and store.get_run("r1").status == "finished"
    assert store.list_halts(run_id="r1") == []


# -- 13 ---------------------------------------------------------------------------------


def test_a_journal_step_is_at_most_once_by_default(store):
    journal = Journal(store)
    calls = []

    def crash():
        calls.append(1)
        raise Crash()

    with pytest.raises(Crash):
        journal.step("j1", "charge", crash)
    with pytest.raises(da.OutcomeUnknown) as info:
        journal.step("j1", "charge", lambda: calls.append(2) or "charged")
    assert calls == [1] and info.value.details["halts"] == ["step:charge"]
    assert info.value.details["cause"] == "crashed"
    da.resolve_halt("j1", "step:charge", "it did", by="ann", store=store)
    assert journal.step("j1", "charge", lambda: "again") == "it did" and calls == [1]
    assert store.get_run("j1").kind == "journal" and store.list_unfinished() == []


def test_a_journal_step_that_raises_may_run_again(store):
    journal = Journal(store)
    with pytest.raises(ValueError):
        journal.step("j1", "s", lambda: (_ for _ in ()).throw(ValueError("card declined")))
    assert journal.step("j1", "s", lambda: "ok") == "ok"
    assert "not-started:step:s:1" in names(store, "j1")


def test_a_retry_safe_journal_step_runs_again_after_a_crash(store):
    journal = Journal(store)
    calls = []

    def crash():
        calls.append(1)
        raise Crash()

    with pytest.raises(Crash):
        journal.step("j1", "read", crash, retry_safe=True)
    assert journal.step("j1", "read", lambda: calls.append(2) or 42, retry_safe=True) == 42
    assert calls == [1, 2] and not any(n.startswith("attempt:") for n in names(store, "j1"))


# -- a halt keeps what the tool said (issue 30) ----------------------------------------------


class GatewayTimeout(da.ToolOutcomeUnknown):
    pass


def unsure_agent(fired):
    @da.tool
    def pay(order: str) -> dict:
        fired.append(order)
        raise GatewayTimeout("payment gateway timed out after 30s (https://pay.example/x?k=s)")

    script = [scripted.calls(scripted.call("pay", {"order": "7"})), scripted.text("paid")]
    return da.Agent("u-unsure", ScriptedModel(script), "Pay.", [pay])


def test_a_halt_keeps_the_reason_the_tool_gave_through_resumes_and_forks(store):
    fired = []
    agent = unsure_agent(fired)
    with pytest.raises(da.OutcomeUnknown) as info:
        agent.run("u1", "go", store=store)
    assert info.value.details["cause"] == "outcome_unknown"
    [halt] = store.list_halts(run_id="u1")
    assert halt.cause == "outcome_unknown"
    assert halt.reason["type"] == "GatewayTimeout"
    # The message as the tool said it, URLs redacted as in what a model reads.
    assert halt.reason["message"].startswith("payment gateway timed out after 30s (")
    assert "k=s" not in halt.reason["message"]
    # The journal holds it: a drive that derives the halt again from the journal says it too.
    said = Journal(store).get("u1", f"@unknown/{halt.attempt}")
    assert said.get("reason") == halt.reason
    with pytest.raises(da.OutcomeUnknown) as again:
        da.resume("u1", store=store)
    assert again.value.details["cause"] == "outcome_unknown" and fired == ["7"]
    fork_id = da.fork("u1", from_step=1, new_run_id="u1-fork", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume(fork_id, store=store)
    [forked] = store.list_halts(run_id=fork_id)
    assert (forked.cause, forked.reason) == ("outcome_unknown", halt.reason) and fired == ["7"]
