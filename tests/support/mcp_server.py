"""A real MCP server for the MCP tests, built with the mcp package's own ``MCPServer``.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http <port>

Every side effect is appended as one JSON line to the file named by ``DA_MCP_EFFECTS``
(outside any journal), so a test counts what really fired. No Django here: the server is
another program, as a site's MCP servers are.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Annotated

from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer("da-test")


def _effect(tool: str, **args: object) -> None:
    path = os.environ.get("DA_MCP_EFFECTS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"tool": tool, "pid": os.getpid(), **args}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(order_id: str) -> dict:
    """Look up an order."""
    _effect("lookup", order_id=order_id)
    return {"order": order_id, "status": "shipped"}


# ``DA_MCP_VARIANT`` is the server's next version (a deploy of the server between a
# gated call's asking and its decision): ``reason`` gives ``refund`` a defaulted argument;
# ``annotations`` keeps its schema and declares it read-only.
VARIANT = os.environ.get("DA_MCP_VARIANT", "")

if VARIANT == "reason":

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def refund(order_id: str, cents: int, reason: str = "goodwill") -> dict:
        """Refund part of an order."""
        _effect("refund", order_id=order_id, cents=cents, reason=reason)
        return {"refunded": cents, "order": order_id, "reason": reason}

else:

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=True if VARIANT == "annotations" else None, destructive_hint=True
        )
    )
    def refund(order_id: str, cents: int) -> dict:
        """Refund part of an order."""
        _effect("refund", order_id=order_id, cents=cents)
        return {"refunded": cents, "order": order_id}


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def send_receipt(order_id: str, idempotency_key: str) -> str:
    """Send a receipt (deduplicated by the caller's key)."""
    _effect("send_receipt", order_id=order_id, key=idempotency_key)
    return f"receipt for {order_id} sent"


@server.tool()
def reject(reason: str) -> str:
    """Always fails, saying why."""
    raise ToolError(f"refused: {reason}")


@server.tool()
def refund_and_die(order_id: str) -> str:
    """The refund happens, then the server process dies before it answers."""
    _effect("refund_and_die", order_id=order_id)
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


@server.tool()
def refund_and_kill_caller(order_id: str) -> str:
    """The refund happens, then the process driving the run (this stdio server's parent)
    is SIGKILLed before the answer reaches it."""
    _effect("refund_and_kill_caller", order_id=order_id)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(0.5)  # the caller is gone before any answer could be written
    os._exit(0)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def slow(seconds: float) -> str:
    """Answers after ``seconds``."""
    time.sleep(seconds)
    return "late"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> dict:
    """This server process's id (a restarted server has another)."""
    return {"pid": os.getpid()}


class Confirm(BaseModel):
    """What the refund tools ask before refunding."""

    approve: bool
    note: str = ""


def _ask_refund(order_id: str, cents: int) -> Elicit[Confirm]:
    # Runs on every round of the call (each tools/call the client sends for it).
    _effect("confirmed_refund_round", order_id=order_id)
    return Elicit(f"Refund {cents} cents on order {order_id}?", Confirm)


@server.tool()
def confirmed_refund(
    order_id: str,
    cents: int,
    answer: Annotated[ElicitationResult[Confirm], Resolve(_ask_refund)],
) -> dict:
    """Refund after a person confirms: the server asks (on 2026-07-28 an InputRequiredResult,
    the SDK's default; on older protocols an elicitation/create mid-call). The refund is
    the only effect, after the answer."""
    _effect("confirmed_refund_asked", order_id=order_id, action=answer.action)
    if answer.action != "accept" or not answer.data.approve:
        return {"refunded": 0, "order": order_id, "action": answer.action}
    _effect("confirmed_refund", order_id=order_id, cents=cents, note=answer.data.note)
    return {"refunded": cents, "order": order_id, "note": answer.data.note}


@server.tool()
async def classic_refund(order_id: str, cents: int, ctx: Context) -> dict:
    """The same with ``ctx.elicit`` in the body (an elicitation/create request while the
    call is open: only on protocols before 2026-07-28)."""
    answer = await ctx.elicit(f"Refund {cents} cents on order {order_id}?", Confirm)
    if answer.action != "accept" or not answer.data.approve:
        return {"refunded": 0, "order": order_id, "action": answer.action}
    _effect("classic_refund", order_id=order_id, cents=cents, note=answer.data.note)
    return {"refunded": cents, "order": order_id, "note": answer.data.note}


def main() -> None:
    transport = sys.argv[1]
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
