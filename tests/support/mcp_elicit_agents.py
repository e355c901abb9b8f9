"""The MCP elicitation test's agents, which Celery workers load by name
(``DA_EXTRA_AGENTS=tests.support.mcp_elicit_agents.agents``): each calls the stdio test
server's ``confirmed_refund``, which asks a person before refunding. Effects are counted in
the file ``DA_MCP_EFFECTS`` names (the test passes the same path to its workers)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.mcp_servers import stdio

EFFECTS = Path(
    os.environ.get("DA_MCP_EFFECTS")
    # One file per test worker (children inherit the variable): tests count rounds in it,
    # and another worker's servers must not write there meanwhile.
    or Path(tempfile.gettempdir())
    / f"da-mcp-elicit-{os.getuid()}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"
)


def _agent(name: str, order_id: str, **server: object) -> da.Agent:
    crm = stdio(
        EFFECTS,
        name=name,
        tools={"confirmed_refund": da.mcp.ToolOptions(elicitation=True)},
        **server,
    )
    return da.Agent(
        name,
        ScriptedModel(
            [
                scripted.calls(
                    scripted.call(f"{name}__confirmed_refund", {"order_id": order_id, "cents": 42})
                ),
                scripted.text("asked"),
            ]
        ),
        "Refund after asking.",
        [crm],
    )


# Waits up to 60 s for staff (the call's timeout 75 s, less its reserve).
ask = _agent("el-ask", "e1", call_timeout=75)
# Waits 3.2 s: nobody answers in time, the server is told "cancel".
late = _agent("el-late", "e2", call_timeout=4)

agents = [ask, late]
