"""The MCP crash test's agent, which child processes load by name (``DA_EXTRA_AGENTS=
tests.support.mcp_agents.mcp_crash``): one side-effect call of the stdio test server that
kills the process driving the run right after the effect, before the answer arrives.
Effects are counted in the file ``DA_MCP_EFFECTS`` names."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.mcp_servers import stdio

# One file per test worker (children inherit the variable): another worker's servers must
# not write where a test counts.
EFFECTS = Path(
    os.environ.get("DA_MCP_EFFECTS")
    or Path(tempfile.gettempdir())
    / f"da-mcp-{os.getuid()}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"
)

mcp_crash = da.Agent(
    "mcp-crash",
    ScriptedModel(
        [
            scripted.calls(scripted.call("crm__refund_and_kill_caller", {"order_id": "c1"})),
            scripted.text("refunded"),
        ]
    ),
    "Refund order c1.",
    [stdio(EFFECTS)],
)
