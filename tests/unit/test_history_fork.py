"""History, fork, compare and drift on the in-memory store."""

from __future__ import annotations

import itertools
import logging

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.engine.model import ModelRequest
from durable_agents.providers import anthropic_messages, openai_chat, scripted
from durable_agents.providers.scripted import ScriptedModel


def weather_agent(seen, fired, name="unit-trip", instructions="Plan trips.", extra_tools=()):
    @da.tool(read_only=True)
    def forecast(city: str) -> str:
        """The weather."""
        fired.append(("forecast", city))
        return "sun"

    @da.tool
    def book(city: str) -> str:
        """Book a hotel."""
        fired.append(("book", city))
        return f"booked {city}"

    script = [
        scripted.calls(scripted.call("forecast", {"city": "Oslo"})),
        scripted.calls(scripted.call("forecast", {"city": "Rome"})),
        scripted.calls(scripted.call("book", {"city": "Rome"})),
        scripted.calls(scripted.call("forecast", {"city": "Nice"})),
        scripted.text("Trip planned."),
    ]
    model = ScriptedModel(script, on_request=lambda r: seen.append(r))
    return da.Agent(name, model, instructions, [forecast, book, *extra_tools])


def assert_valid_wire(request: ModelRequest) -> None:
    """The transcript is one both providers accept: every tool call answered, in order,
    before anything else is said."""
    wire = openai_chat.to_wire_messages(request)
    for i, m in enumerate(wire):
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            follow = [x.get("tool_call_id") for x in wire[i + 1 : i + 1 + len(ids)]]
            assert follow == ids
    blocks = anthropic_messages.to_wire_messages(request.messages)
    roles = [b["role"] for b in blocks]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for i, b in enumerate(blocks):
        uses = (
            [c["id"] for c in b["content"] if isinstance(c, dict) and c.get("type") == "tool_use"]
            if isinstance(b["content"], list)
            else []
        )
        if uses:
            results = [
                c["tool_use_id"] for c in blocks[i + 1]["content"] if c.get("type") == "tool_result"
            ]
            assert results == uses


def test_history_lists_each_step_from_the_journal(store):
    seen, fired = [], []
    weather_agent(seen, fired).run("trip", "plan", store=store)
    steps = da.history("trip", store=store)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert steps[0].tool_calls[0].name == "forecast" and steps[0].tool_calls[0].result == "sun"
    assert steps[2].tool_calls[0].arguments == {"city": "Rome"}
    assert steps[4].text == "Trip planned." and steps[4].tool_calls == ()
    messages = da.as_of("trip", 2, store=store)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    with pytest.raises(da.ConfigError, match="steps are 0-5"):
        da.as_of("trip", 9, store=store)


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kind", ["replace", "append_user", "instructions", "none"])
def test_fork_at_each_step_with_each_patch(store, step, kind):
    seen, fired = [], []
    agent = weather_agent(seen, fired, name=f"unit-fork-{kind}-{step}")
    agent.run("src", "plan", store=store)
    source_before = [(r.name, r.data) for r in Journal(store).records("src")]
    fired.clear()
    steps = da.history("src", store=store)
    patch = {
        "replace": da.Patch(
            tool_results={steps[min(step, 4) - 1].tool_calls[0].call_id: "storm warning"}
        ),
        "append_user": da.Patch(append_user="It will rain, plan for that."),
        "instructions": da.Patch(instructions="Plan cautious trips."),
        "none": None,
    }[kind]
    if kind == "replace" and step == 5:
        patch = da.Patch(tool_results={steps[3].tool_calls[0].call_id: "storm warning"})
    fork_id = da.fork("src", step, patch, store=store)
    assert fork_id == "src.fork-1"
    assert store.get_run(fork_id).forked_from == "src"
    seen.clear()
    # The script lines up by counting assistant turns, so the fork continues the story.
    if kind == "append_user" and step == 5:
        agent.model.turns.append(scripted.text("Rain plan ready."))
    result = agent.run(fork_id, None, store=store)
    assert result.answer in ("Trip planned.", "Rain plan ready.")
    # Recorded results up to the fork point were not run again; later steps ran.
    later = [(t.name, t.arguments["city"]) for s in steps[step:] for t in s.tool_calls]
    assert fired == later
    for request in seen:
        assert_valid_wire(request)
    if kind == "replace" and seen:
        tool_msgs = [m.content for m in seen[0].messages if m.role == "tool"]
        assert "storm warning" in tool_msgs
    if kind == "append_user" and seen:
        assert seen[0].messages[-1].content == "It will rain, plan for that."
    if kind == "instructions" and seen:
        assert seen[0].instructions == "Plan cautious trips."
    assert [(r.name, r.data) for r in Journal(store).records("src")] == source_before
    forked = da.history(fork_id, store=store)
    assert forked[0].usage == steps[0].usage


def test_fork_refusals(store):
    seen, fired = [], []
    weather_agent(seen, fired, name="unit-fork-refuse").run("src", "plan", store=store)
    with pytest.raises(da.ConfigError, match="steps are 0-5"):
        da.fork("src", 7, store=store)
    with pytest.raises(da.ConfigError, match="not in steps 1-1"):
        da.fork("src", 1, da.Patch(tool_results={"call_3_1": "x"}), store=store)
    da.fork("src", 1, new_run_id="mine", store=store)
    with pytest.raises(da.ConfigError, match="already exists"):
        da.fork("src", 1, new_run_id="mine", store=store)
    assert da.fork("src", 2, store=store) == "src.fork-1"
    assert [a.action for a in store.list_actions(run_id="src")] == ["fork", "fork"]


def test_compare_finds_where_runs_diverge(store):
    seen, fired = [], []
    agent = weather_agent(seen, fired, name="unit-compare")
    agent.run("a", "plan", store=store)
    agent.run("b", "plan", store=store)
    same = da.compare("a", "b", store=store)
    assert same.diverged_at is None and same.drift["step_count"] == [5, 5]
    call = da.history("a", store=store)[1].tool_calls[0].call_id
    fork_id = da.fork("a", 2, da.Patch(tool_results={call: "storm"}), store=store)
    agent.run(fork_id, None, store=store)
    diff = da.compare("a", fork_id, store=store)
    assert diff.diverged_at == 2
    assert diff.drift["finish"] == ["Trip planned.", "Trip planned."]


def test_a_fork_of_a_paused_run_asks_for_approval_again(store):
    @da.tool(requires_approval=True)
    def pay(cents: int) -> str:
        return "paid"

    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
    agent = da.Agent("unit-fork-gate", ScriptedModel(script), "", [pay])
    with pytest.raises(da.ApprovalPending):
        agent.run("src", "pay", store=store)
    Journal(store).write("src", "approval:call_1_1", {"kind": "approval", "approved": True})
    fork_id = da.fork("src", 1, store=store)
    with pytest.raises(da.ApprovalPending):
        agent.run(fork_id, None, store=store)


def drifted(seen, fired, policy, change, store):
    agent = weather_agent(seen, fired, name=f"unit-drift-{policy}-{change}")
    with pytest.raises(da.ApprovalPending):
        gated = weather_agent(seen, fired, name=agent.name, extra_tools=[_gate()])
        gated.model.turns.insert(0, scripted.calls(scripted.call("gate", {})))
        gated.run("r", "plan", store=store)
    kwargs = {"name": agent.name, "extra_tools": [_gate()]}
    if change == "instructions":
        kwargs["instructions"] = "Something else."
    new = weather_agent(seen, fired, **kwargs)
    new.on_drift = policy
    if change == "model":
        new.model.model_id = "another-model"
    if change == "schema":

        @da.tool(read_only=True)
        def forecast(city: str, days: int = 1) -> str:
            return "sun"

        new.tools["forecast"] = forecast
        new._specs = new._fingerprint = None
    new.model.turns.insert(0, scripted.calls(scripted.call("gate", {})))
    return new


def _gate():
    @da.tool(requires_approval=True)
    def gate() -> str:
        return "ok"

    return gate


@pytest.mark.parametrize("change", ["model", "schema", "instructions"])
@pytest.mark.parametrize("policy", ["warn", "error", "ignore"])
def test_drift_policies(store, policy, change, caplog):
    seen, fired = [], []
    new = drifted(seen, fired, policy, change, store)
    Journal(store).write("r", "approval:call_1_1", {"kind": "approval", "approved": True})
    before = [r.name for r in Journal(store).records("r")]
    if policy == "error":
        with pytest.raises(da.AgentDrift) as info:
            new.run("r", None, store=store)
        assert [r.name for r in Journal(store).records("r")] == before
        assert info.value.details["changes"]
        return
    with caplog.at_level(logging.WARNING, logger="durable_agents"):
        assert new.run("r", None, store=store).answer == "Trip planned."
    drift_records = [r for r in Journal(store).records("r") if r.name.startswith("@drift/")]
    if policy == "warn":
        assert drift_records and "resumes under a changed agent" in caplog.text
        key = {"model": "model", "schema": "tools_changed", "instructions": "instructions"}
        assert key[change] in drift_records[0].get("changes")
    else:
        assert drift_records == []


def test_a_half_written_fork_is_refused(store):
    seen, fired = [], []
    agent = weather_agent(seen, fired, name="unit-fork-partial")
    agent.run("src", "plan", store=store)
    fork_id = da.fork("src", 2, store=store)
    # Simulate a fork that died while being copied: the same journal without "fork:done".
    journal = Journal(store)
    store.create_run(store.get_run(fork_id).__class__(run_id="half", agent=agent.name))
    for rec in journal.records(fork_id):
        if rec.name not in ("@journal", "fork:done"):
            journal.write("half", rec.name, dict(rec.body))
    with pytest.raises(da.ConfigError, match="not completely written"):
        agent.run("half", None, store=store)
    assert agent.run(fork_id, None, store=store).answer == "Trip planned."
    with pytest.raises(da.ConfigError, match="no run 'nope'"):
        da.compare("src", "nope", store=store)
    with pytest.raises(da.ConfigError, match="without giving them a result"):
        da.fork("src", 1, da.Patch(tool_errors=["call_1_1"]), store=store)


def test_a_fork_at_step_zero_sends_the_appended_message(store):
    seen, fired = [], []
    agent = weather_agent(seen, fired, name="unit-fork-zero")
    agent.run("src", "plan", store=store)
    fork_id = da.fork("src", 0, da.Patch(append_user="Only Rome, please."), store=store)
    seen.clear()
    agent.run(fork_id, None, store=store)
    first = seen[0].messages
    assert [(m.role, m.content) for m in first] == [
        ("user", "plan"),
        ("user", "Only Rome, please."),
    ]
    assert da.as_of(fork_id, 0, store=store)[-1].content == "Only Rome, please."
