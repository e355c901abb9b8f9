"""A real MCP server that runs tool calls as *tasks* (MCP 2025-11-25), for the long-call
tests, built on the mcp package's own ``MCPServer``.

    python -m tests.support.mcp_task_server stdio
    python -m tests.support.mcp_task_server http <port>

The mcp SDK (2.3) leaves ``tasks/*`` out of its protocol tables on purpose, so what the
2025-11-25 specification asks of a server is added here with the SDK's own middleware
hook: the ``tasks`` capability and each task tool's ``execution.taskSupport`` on the
handshake, a ``tools/call`` with a ``task`` parameter answered at once with a
``CreateTaskResult``, and ``tasks/get``, ``tasks/result`` and ``tasks/cancel``. It speaks
only the handshake era (``server/discover`` is refused), as servers with tasks do.

Tasks live in this process, not per connection — in the file ``DA_MCP_TASK_STORE`` names
when it is set, so a server restarted on it knows them: a client that died and a new one
polling the same id find the same task. A task's work is its time: it works for
``DA_MCP_TASK_SECONDS``, then it is done. Every side effect is appended to the file
``DA_MCP_EFFECTS`` names, when the work starts (outside any journal). Environment:
``DA_MCP_TASK_SECONDS`` (how long a task works, default 2), ``DA_MCP_POLL_MS`` (the
``pollInterval`` it advertises, default 200), ``DA_MCP_FLAKY`` (a file: while it exists,
every ``tasks/get`` fails with an internal error).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

TASK_TOOLS = {"transfer", "audit", "doomed", "forgetful"}
STEPS = 4

_lock = threading.Lock()
_memory: dict[str, dict[str, Any]] = {}


def _effect(tool: str, **args: object) -> None:
    path = os.environ.get("DA_MCP_EFFECTS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"tool": tool, "pid": os.getpid(), **args}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _text(value: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": error}


# Tasks are kept in the file DA_MCP_TASK_STORE when it is set (else in memory): a server
# restarted on it knows the tasks of the one before, as a server with a database would. A
# task's work is its time: it is working until ``finish_at``, then done.
def _load() -> dict[str, dict[str, Any]]:
    path = os.environ.get("DA_MCP_TASK_STORE")
    if not path:
        return _memory
    try:
        with open(path) as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return {}


def _save(tasks: dict[str, dict[str, Any]]) -> None:
    path = os.environ.get("DA_MCP_TASK_STORE")
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(tasks, f)
    os.replace(path + ".tmp", path)


def _view(record: dict[str, Any]) -> dict[str, Any]:
    """The task as the protocol shows it, and its result once it has one."""
    now = time.time()
    task: dict[str, Any] = {
        "taskId": record["taskId"],
        "status": "working",
        "createdAt": _iso(record["created"]),
        "lastUpdatedAt": _iso(min(now, record["finish_at"])),
        "ttl": record["ttl"],
        "pollInterval": record["pollInterval"],
    }
    if record.get("cancelled"):
        task["status"] = "cancelled"
    elif now < record["finish_at"]:
        done = int(STEPS * (now - record["created"]) / (record["finish_at"] - record["created"]))
        if done:
            task["statusMessage"] = f"{done} of {STEPS} done"
    elif record["tool"] == "doomed":
        task["status"], task["statusMessage"] = "failed", "the ledger refused it"
        task["result"] = _text("ledger refused the transfer", error=True)
    else:
        task["status"] = "completed"
        done_with = {"tool": record["tool"], "task": record["taskId"], **record["arguments"]}
        task["result"] = {
            "content": [{"type": "text", "text": json.dumps(done_with)}],
            "structuredContent": done_with,
            "isError": False,
        }
    return task


def _start(params: dict[str, Any]) -> dict[str, Any]:
    tool, arguments = params["name"], dict(params.get("arguments") or {})
    now = time.time()
    record = {
        "taskId": uuid.uuid4().hex,
        "tool": tool,
        "arguments": arguments,
        "created": now,
        "finish_at": now + float(os.environ.get("DA_MCP_TASK_SECONDS", "2")),
        "ttl": (params.get("task") or {}).get("ttl") or 60_000,
        "pollInterval": int(os.environ.get("DA_MCP_POLL_MS", "200")),
    }
    _effect(tool, task_id=record["taskId"], **arguments)  # the work starts: its effect
    if tool != "forgetful":  # forgetful: a server that lost the task at once
        with _lock:
            tasks = _load()
            tasks[record["taskId"]] = record
            _save(tasks)
    return {"task": {k: v for k, v in _view(record).items() if k != "result"}}


def _find(params: Any) -> dict[str, Any]:
    task_id = (params or {}).get("taskId")
    with _lock:
        record = _load().get(task_id) if isinstance(task_id, str) else None
    if record is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: {task_id}")
    return _view(record)


def _public(task: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in task.items() if k != "result"}


async def tasks_middleware(ctx: Any, call_next: Any) -> Any:
    method, params = ctx.method, ctx.params
    if method == "server/discover":
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data=method)
    if method == "initialize":
        result = dict(await call_next(ctx))
        capabilities = dict(result.get("capabilities") or {})
        capabilities["tasks"] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
        result["capabilities"] = capabilities
        return result
    if method == "tools/list":
        result = dict(await call_next(ctx))
        result["tools"] = [
            {**t, "execution": {"taskSupport": "required"}} if t["name"] in TASK_TOOLS else t
            for t in result.get("tools", [])
        ]
        return result
    if method == "tools/call" and params and params.get("task") is not None:
        if params.get("name") not in TASK_TOOLS:
            raise MCPError(code=METHOD_NOT_FOUND, message="this tool does not run as a task")
        return _start(dict(params))
    if method == "tasks/get":
        flaky = os.environ.get("DA_MCP_FLAKY")
        if flaky and os.path.exists(flaky):
            raise ConnectionResetError("the test server fails this poll")
        return _public(_find(params))
    if method == "tasks/result":
        while True:  # blocks until the task is terminal, as the specification says
            task = _find(params)
            if task["status"] in ("completed", "failed", "cancelled"):
                break
            await asyncio.sleep(0.05)
        if task["status"] == "cancelled":
            raise MCPError(code=-32000, message="Task cancelled")
        return task["result"]
    if method == "tasks/cancel":
        with _lock:
            tasks = _load()
            record = tasks.get((params or {}).get("taskId"))
            if record is None:
                raise MCPError(code=INVALID_PARAMS, message="no such task")
            if _view(record)["status"] == "working":
                record["cancelled"] = True
                _save(tasks)
        return _public(_view(record))
    return await call_next(ctx)


server = MCPServer("da-tasks", middleware=[tasks_middleware])


@server.tool()
def transfer(account: str, cents: int) -> str:
    """Move money (a task: it takes a while)."""
    return "only as a task"


@server.tool()
def audit(account: str) -> str:
    """Audit an account (a task; read-only)."""
    return "only as a task"


@server.tool()
def doomed(account: str) -> str:
    """A task that fails."""
    return "only as a task"


@server.tool()
def forgetful(account: str) -> str:
    """A task the server forgets at once (as if it restarted)."""
    return "only as a task"


@server.tool()
async def crunch(steps: int, ctx: Context) -> str:
    """A slow plain call that reports its progress."""
    _effect("crunch", steps=steps)
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1} of {steps}")
        await asyncio.sleep(0.25)
    return f"crunched {steps}"


def main() -> None:
    transport = sys.argv[1]
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
