"""The long-call crash tests' agents, which worker processes load by name
(``DA_EXTRA_AGENTS=tests.support.mcp_task_agents``): a side-effect call the task test
server (``tests.support.mcp_task_server``, at ``DA_MCP_TASK_URL``) runs as a task, and a
slow plain call that reports progress. Nothing connects at import."""

from __future__ import annotations

import os

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

URL = os.environ.get("DA_MCP_TASK_URL", "http://127.0.0.1:9/mcp")

ledger = da.mcp.Server("ledger", url=URL, connect_timeout=30)

mcp_task_crash = da.Agent(
    "mcp-task-crash",
    ScriptedModel(
        [
            scripted.calls(scripted.call("ledger__transfer", {"account": "w1", "cents": 5})),
            scripted.text("moved"),
        ]
    ),
    "Move the money.",
    [ledger],
)

mcp_progress = da.Agent(
    "mcp-progress-live",
    ScriptedModel(
        [scripted.calls(scripted.call("ledger__crunch", {"steps": 12})), scripted.text("crunched")]
    ),
    "Crunch.",
    [ledger],
)
