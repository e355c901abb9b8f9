"""Tool sources (tools known only at run time, as an MCP server's) and error results a tool
raises whole: the engine's side of durable_agents.mcp, without any server."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


class Source:
    """Lists ``tools`` when asked; fails the first ``failures`` times."""

    def __init__(self, tools, failures=0):
        self.tools, self.failures, self.listed = tools, failures, 0

    def load_tools(self):
        self.listed += 1
        if self.listed <= self.failures:
            raise da.ToolError("the source is down", code="test.down")
        return self.tools

    def __repr__(self):
        return "<Source>"


@da.tool(read_only=True)
def remote_lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}"


def test_a_source_is_listed_when_the_tools_are_first_needed_and_again_after_a_failure(store):
    source = Source([remote_lookup], failures=1)
    agent = da.Agent(
        "sources",
        ScriptedModel(
            [scripted.calls(scripted.call("remote_lookup", {"order_id": "7"})), scripted.text("ok")]
        ),
        "",
        [source],
    )
    assert source.listed == 0  # nothing is listed when the agent is made
    with pytest.raises(da.ToolError):
        agent.run("s1", "go", store=store)
    assert store.get_run("s1") is None  # listed before anything is written
    assert agent.run("s1", "go", store=store).answer == "ok"
    assert source.listed == 2
    agent.run("s2", "go", store=store)
    assert source.listed == 2  # kept for the life of the process


def test_a_sources_tool_named_like_another_is_a_config_error():
    agent = da.Agent(
        "sources-clash", ScriptedModel([]), "", [remote_lookup, Source([remote_lookup])]
    )
    with pytest.raises(da.ConfigError) as info:
        _ = agent.tools
    assert info.value.code == "config.tool_name" and "<Source>" in str(info.value)
    with pytest.raises(da.ConfigError):
        da.Agent("sources-bad", ScriptedModel([]), "", [object()])


def test_an_error_result_a_tool_raises_is_journaled_whole_and_read_by_the_model(store):
    @da.tool
    def charge(cents: int) -> str:
        """Charge."""
        raise da.ToolResultError("declined", {"declined": True, "reason": "insufficient funds"})

    seen = []
    agent = da.Agent(
        "error-results",
        ScriptedModel(
            [scripted.calls(scripted.call("charge", {"cents": 5})), scripted.text("sorry")],
            on_request=seen.append,
        ),
        "",
        [charge],
    )
    assert agent.run("e1", "go", store=store).answer == "sorry"
    record = Journal(store).get("e1", "tool:call_1_1")
    assert record.get("is_error")
    assert record.get("result") == {"declined": True, "reason": "insufficient funds"}
    assert "insufficient funds" in str([m.content for m in seen[-1].messages])


def test_mcp_timeouts_are_checked_settings():
    from durable_agents.conf import parse

    settings, problems = parse({"MCP_TIMEOUTS": {"CALL": 300}})
    assert not problems and settings.mcp_timeouts.call == 300.0
    assert settings.mcp_timeouts.connect == 10.0
    _, problems = parse({"MCP_TIMEOUTS": {"CALL": -1, "CONECT": 5}})
    assert any("MCP_TIMEOUTS.CALL" in p for p in problems)
    assert any("'CONECT'" in p and "CONNECT" in p for p in problems)


def test_the_core_imports_no_mcp_and_a_server_without_it_says_how_to_install_it():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import durable_agents as da\n"
        "assert 'mcp' not in sys.modules, 'the mcp package was imported with the core'\n"
        "sys.modules['mcp'] = None  # as if the extra were not installed\n"
        "server = da.mcp.Server('crm', command=['crm-mcp'])\n"
        "try:\n"
        "    server.load_tools()\n"
        "except da.mcp.McpNotInstalled as exc:\n"
        "    print(exc.code, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.startswith("mcp.not_installed") and "durable-agents[mcp]" in out
