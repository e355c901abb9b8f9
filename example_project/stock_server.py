"""The warehouse's MCP server: a tiny stock service the ``stock-desk`` agent calls
(``example_project/stock.py``), built on the mcp package's own server framework and spoken
to over stdio. ``python -m example_project.stock_server`` runs it.

It is another program, as a site's MCP servers are: no Django here. Every reservation is
appended as one JSON line to the file ``STOCK_EFFECTS`` names (the demo's side-effect
ledger), so a reservation that fired twice would show.
"""

from __future__ import annotations

import json
import os
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("warehouse")

STOCK = {"mug-7": 12, "teapot-3": 2}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def stock_level(sku: str) -> dict:
    """How many of an article are in stock."""
    return {"sku": sku, "in_stock": STOCK.get(sku, 0)}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def reserve_stock(sku: str, quantity: int) -> dict:
    """Reserve some of an article for a customer's order (it leaves the shelf)."""
    path = os.environ.get("STOCK_EFFECTS")
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as f:
            line = {"kind": "reservation", "at": time.time(), "sku": sku, "quantity": quantity}
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return {"sku": sku, "reserved": quantity}


if __name__ == "__main__":
    server.run("stdio")
