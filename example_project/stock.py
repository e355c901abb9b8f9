"""The stock desk: an agent whose tools are an MCP server's (docs/mcp.md).

The warehouse's server (``example_project/stock_server.py``) runs as a subprocess of the
process that lists its tools, over stdio. Its annotations are trusted: ``stock_level`` says
it is read-only, so it runs again after a crash; ``reserve_stock`` is a side effect, at most
once, and staff approve it first (``ToolOptions(approval=True)``), in the admin's inbox like
any gated call. Its tools are listed the first time the agent's tools are needed in a
process, not at import: the ``mcp`` extra (``pip install 'durable-agents[mcp]'``) is needed
then, not before.
"""

from __future__ import annotations

import sys
from pathlib import Path

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

from .agents import effects_path

ROOT = Path(__file__).resolve().parent.parent


def mcp_installed() -> bool:
    """Whether the ``mcp`` package is here (the ``mcp`` extra)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


warehouse = da.mcp.Server(
    "warehouse",
    command=[sys.executable, "-m", "example_project.stock_server"],
    env={"STOCK_EFFECTS": str(effects_path()), "PYTHONPATH": str(ROOT)},
    cwd=str(ROOT),
    trust_annotations=True,
    tools={"reserve_stock": da.mcp.ToolOptions(approval=True)},
    # Starting the server imports the mcp package: seconds on a busy machine.
    connect_timeout=30,
)

# The desk's story (a scripted model: the demo runs without a provider key).
SCRIPT = [
    scripted.calls(scripted.call("warehouse__stock_level", {"sku": "mug-7"})),
    scripted.calls(scripted.call("warehouse__reserve_stock", {"sku": "mug-7", "quantity": 2})),
    scripted.text("Two mugs (mug-7) are reserved for the order."),
]

stock_desk = da.Agent(
    "stock-desk",
    ScriptedModel(SCRIPT, model_id="scripted-stock-desk"),
    "You reserve stock for customers' orders. Check the stock level first.",
    [warehouse],
    max_turns=6,
)
