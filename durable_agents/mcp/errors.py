"""The errors of tools from MCP servers, each with a stable code."""

from __future__ import annotations

from ..engine.errors import ConfigError, ToolError, ToolOutcomeUnknown


class McpNotInstalled(ConfigError):
    """The ``mcp`` package is missing: install ``durable-agents[mcp]``."""

    code = "mcp.not_installed"


class McpUnavailable(ToolError):
    """An MCP server could not be reached, or failed before a call was sent: nothing ran.
    Retryable: a drive that failed on it is tried again by recovery."""

    code = "mcp.unavailable"
    retryable = True
    http_status = 503


class McpTimeout(McpUnavailable):
    """An MCP server did not connect or list its tools in time (``MCP_TIMEOUTS``)."""

    code = "mcp.timeout"


class McpRefused(ToolError):
    """The server refused a call as malformed before running it (JSON-RPC "method not
    found" or "invalid params"): the model reads it as an error, nothing ran."""

    code = "mcp.refused"

    @classmethod
    def of(cls, server: str, remote: str, message: str) -> McpRefused:
        """The refusal of ``server``'s call of ``remote`` (a plain call's or a task's)."""
        return cls(
            f"MCP server {server!r} refused the call of {remote!r} before running it: {message}",
            server=server,
        )


class McpOutcomeUnknown(ToolOutcomeUnknown):
    """The connection failed or timed out after a call was sent: a side-effect tool halts
    (outcome unknown), a retry-safe one reads it as an error."""

    code = "mcp.outcome_unknown"


def require_sdk() -> None:
    """``McpNotInstalled`` unless the ``mcp`` package can be imported."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise McpNotInstalled(
            "tools from MCP servers need the mcp package: pip install 'durable-agents[mcp]'"
        ) from None
