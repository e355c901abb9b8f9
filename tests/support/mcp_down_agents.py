"""An agent whose MCP server is down (its command does not exist), with limits on two of its
tools: the limits page lists them without connecting (tests/integration/test_limits_views.py).
Only that test loads this module (its own ``AGENTS`` setting)."""

from __future__ import annotations

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

down = da.mcp.Server(
    "crm-down",
    command=["/nonexistent/crm-mcp"],
    tools={
        "refund": da.mcp.ToolOptions(approval=True, rate="5/m", max_concurrent=2),
        "lookup": da.mcp.ToolOptions(safety="read_only"),
        "mail": da.mcp.ToolOptions(max_concurrent=1),
    },
    names={"mail": "send_mail"},
)

desk = da.Agent("mcp-down-desk", ScriptedModel([scripted.text("no")]), "", [down])
