"""Tools from MCP servers, durable and gated (docs/mcp.md).

``durable_agents.mcp.Server("crm", command=[...])`` in an agent's ``tools=`` makes the
server's tools durable tools. The ``mcp`` package (``pip install 'durable-agents[mcp]'``)
is imported only when a server is first listed or called, so this module costs nothing
without it.
"""

from .connection import close_all
from .errors import McpNotInstalled, McpOutcomeUnknown, McpRefused, McpTimeout, McpUnavailable
from .server import McpTool, Server, ToolOptions, declared_class

__all__ = [
    "McpNotInstalled",
    "McpOutcomeUnknown",
    "McpRefused",
    "McpTimeout",
    "McpTool",
    "McpUnavailable",
    "Server",
    "ToolOptions",
    "close_all",
    "declared_class",
]
