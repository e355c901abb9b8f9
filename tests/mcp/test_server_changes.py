"""A gated MCP call whose server changed between the asking and the decision: the server
restarted as its next version (a new process, which lists its tools anew: the list is read
once per process), and the agent made anew, as a worker started after a deploy does.
Effects are counted by the server, in a file."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.mcp_servers import effects, stdio

pytestmark = pytest.mark.timeout(90)

GATED = {"refund": da.mcp.ToolOptions(approval=True)}


def worker(name, server):
    """The agent as a worker process loads it: its tools listed from ``server`` now."""
    ask = scripted.call("crm-deploy__refund", {"order_id": name, "cents": 900})
    model = ScriptedModel([scripted.calls(ask), scripted.text("done")])
    agent = da.Agent(name, model, "Use the tools.", [server])
    assert "crm-deploy__refund" in agent.tools  # listed by this "process"
    return agent


def fired(effects_file, order_id):
    return [e for e in effects(effects_file, "refund") if e["order_id"] == order_id]


def test_a_defaulted_argument_added_before_the_decision_asks_again(store, effects_file):
    """As for a Python tool (tests/unit/test_approvals_halts.py): the server's next version
    gives ``refund`` a defaulted ``reason``, so the approved call would now run with other
    arguments. The decision on the old ones does not fire it: the call is asked again,
    showing both, and fires once with what the second decision approved."""
    old = stdio(effects_file, name="crm-deploy", tools=GATED)
    try:
        with pytest.raises(da.ApprovalPending):
            worker("mcp-reason", old).run("d-run", "refund", store=store)
    finally:
        old.close()
    new = stdio(effects_file, name="crm-deploy", tools=GATED, variant="reason")
    try:
        agent = worker("mcp-reason", new)
        assert agent.tools["crm-deploy__refund"].parameters["properties"]["reason"] == {
            "default": "goodwill",
            "title": "Reason",
            "type": "string",
        }
        da.approve("d-run", "call_1_1", True, by="ann", store=store)
        assert fired(effects_file, "mcp-reason") == []
        assert store.get_run("d-run").status == "awaiting_approval"
        again = store.get_approval_request("d-run", "call_1_1")
        assert again.status == "pending"
        assert again.arguments == {"order_id": "mcp-reason", "cents": 900, "reason": "goodwill"}
        assert again.previous_arguments == {"order_id": "mcp-reason", "cents": 900}
        da.approve("d-run", "call_1_1", True, by="ann", store=store)
        assert store.get_run("d-run").status == "finished"
        assert [(e["cents"], e["reason"]) for e in fired(effects_file, "mcp-reason")] == [
            (900, "goodwill")
        ]
        da.resume("d-run", store=store)  # nothing left to run
        assert len(fired(effects_file, "mcp-reason")) == 1
    finally:
        new.close()


def test_a_defaulted_argument_taken_away_before_the_decision_asks_again(store, effects_file):
    """The other way round: asked under the version with ``reason`` (the model left it out:
    the approver saw the default), decided after the server went back to the version
    without it. The approved arguments are not what would run: asked again, then fired once
    with what the second decision approved (a Python tool's field removed is the same)."""
    new = stdio(effects_file, name="crm-deploy", tools=GATED, variant="reason")
    try:
        with pytest.raises(da.ApprovalPending):
            worker("mcp-back", new).run("b-run", "refund", store=store)
        assert store.get_approval_request("b-run", "call_1_1").arguments["reason"] == "goodwill"
    finally:
        new.close()
    old = stdio(effects_file, name="crm-deploy", tools=GATED)
    try:
        worker("mcp-back", old)
        da.approve("b-run", "call_1_1", True, by="ann", store=store)
        assert fired(effects_file, "mcp-back") == []
        again = store.get_approval_request("b-run", "call_1_1")
        assert (again.status, again.arguments) == (
            "pending",
            {"order_id": "mcp-back", "cents": 900},
        )
        assert again.previous_arguments["reason"] == "goodwill"
        da.approve("b-run", "call_1_1", True, by="ann", store=store)
        assert [e.get("reason") for e in fired(effects_file, "mcp-back")] == [None]
        assert store.get_run("b-run").status == "finished"
        assert Journal(store).get("b-run", "tool:call_1_1").get("is_error") is not True
    finally:
        old.close()


def test_an_annotation_change_alone_asks_again_and_fires_once(store, effects_file):
    """The server is not the site's code: a decision is about the call's arguments *and* the
    tool as its server declared it when asked. A trusted server that now declares
    ``refund`` read-only (same schema, same arguments) changes the tool the person approved:
    the approval does not fire it; the call is asked again about the new definition, and
    fires once, with the approved arguments, after the second decision."""
    old = stdio(effects_file, name="crm-deploy", tools=GATED, trust_annotations=True)
    try:
        agent = worker("mcp-annotated", old)
        assert agent.tools["crm-deploy__refund"].origin["class"] == "side_effect"
        before = agent.tools["crm-deploy__refund"].definition_digest
        with pytest.raises(da.ApprovalPending):
            agent.run("a-run", "refund", store=store)
        assert store.get_approval_request("a-run", "call_1_1").tool_digest == before
    finally:
        old.close()
    new = stdio(
        effects_file,
        name="crm-deploy",
        tools=GATED,
        trust_annotations=True,
        variant="annotations",
    )
    try:
        agent = worker("mcp-annotated", new)
        tool = agent.tools["crm-deploy__refund"]
        assert tool.origin["class"] == "read_only"
        assert tool.definition_digest != before
        da.approve("a-run", "call_1_1", True, by="ann", store=store)
        assert fired(effects_file, "mcp-annotated") == []
        again = store.get_approval_request("a-run", "call_1_1")
        assert (again.status, again.tool_digest) == ("pending", tool.definition_digest)
        assert (
            again.previous_arguments
            == again.arguments
            == {"order_id": "mcp-annotated", "cents": 900}
        )
        assert store.get_run("a-run").status == "awaiting_approval"
        da.approve("a-run", "call_1_1", True, by="ann", store=store)
        assert store.get_run("a-run").status == "finished"
        assert [e["cents"] for e in fired(effects_file, "mcp-annotated")] == [900]
        # The run's start fingerprinted the server's tools: the resume was drift naming it.
        [drift] = [r for r in Journal(store).records("a-run") if r.name.startswith("@drift")]
        assert drift.get("changes")["sources_changed"] == ["crm-deploy"]
    finally:
        new.close()
