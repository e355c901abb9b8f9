"""MCP tasks: a long call the server runs on its own and the client polls (MCP 2025-11-25,
"Tasks"), made durable.

A tool is called as a task when the server says it can run tool calls as tasks (the
``tasks.requests.tools.call`` capability) and the tool allows it (``execution.taskSupport``
``"optional"`` or ``"required"``). The call is a ``tools/call`` with a ``task`` parameter;
the server answers at once with the task (its id). The id is journaled (``handle:<call>``,
fenced by the lease, ``engine.handles``) **before** any wait; then ``tasks/get`` is polled
until the task is terminal, and ``tasks/result`` gives the call's ``CallToolResult``, which
is journaled whole as any call's. A resume (a crash, a deploy, another worker) that finds
the id and no result polls the same task again: ``tools/call`` is never sent twice, for any
safety class.

What each ending is:

* completed: the task's result, as a plain call's (an ``isError`` result is an error);
* failed or cancelled: an error result the model reads (the server's own result if it
  gives one, else what its status says);
* the server no longer knows the task (JSON-RPC "invalid params" for its id: it expired
  or the server restarted without it): ``McpOutcomeUnknown`` — a side effect halts, a
  retry-safe call reads it as an error;
* still not terminal ``task_timeout`` seconds (``MCP_TIMEOUTS["TASK"]``) after the task was
  created, counted across crashes: ``McpOutcomeUnknown`` (``mcp.timeout``).

Polling is read-only: a poll that fails (the connection dropped, no answer in the list
timeout, an error other than "invalid params") is tried again, reconnecting, until the
task's time is up. Polls are spaced by the server's ``pollInterval`` (0.1-30 s; 1 s when it
gives none), and never past the deadline.

The mcp SDK (2.3) leaves ``tasks/*`` out of its protocol tables and validates a
``tools/call`` answer as a ``CallToolResult`` (which a task is not), so these requests go
through the session's own dispatcher, stamped as the session stamps its requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..engine import failpoints
from ..engine.errors import ToolResultError
from .connection import _GRACE, Connection, _connection_failed, _describe, _run
from .errors import McpOutcomeUnknown, McpRefused, McpUnavailable

TERMINAL = frozenset({"completed", "failed", "cancelled"})
KIND = "mcp-task"
MIN_POLL, MAX_POLL, DEFAULT_POLL = 0.1, 30.0, 1.0


def server_runs_tasks(capabilities: Any) -> bool:
    """Whether a server's capabilities say it runs ``tools/call`` as tasks."""
    tasks = getattr(capabilities, "tasks", None)
    requests = getattr(tasks, "requests", None)
    tools = getattr(requests, "tools", None)
    return getattr(tools, "call", None) is not None


def task_support(remote: Any) -> str | None:
    """A listed tool's ``execution.taskSupport`` (None: absent, i.e. "forbidden")."""
    execution = getattr(remote, "execution", None)
    value = getattr(execution, "task_support", None)
    return value if value in ("optional", "required") else None


def handle_for(server: str, remote: str, task: dict[str, Any]) -> dict[str, Any]:
    """What is journaled about a task before it is waited on."""
    return {
        "kind": KIND,
        "server": server,
        "remote": remote,
        "task_id": task["taskId"],
        "created_at": task.get("createdAt"),
        "poll_interval_ms": task.get("pollInterval"),
        "ttl_ms": task.get("ttl"),
        # Our own clock (epoch seconds): the task's time limit counts from here, across
        # crashes, whatever the server's clock says.
        "started_at": time.time(),
    }


def task_of(handle: dict[str, Any] | None) -> str | None:
    """The task id a journaled handle names (None: not a task's handle)."""
    if not handle or handle.get("kind") != KIND or not isinstance(handle.get("task_id"), str):
        return None
    return str(handle["task_id"])


def poll_delay(task: dict[str, Any], left: float) -> float:
    """Seconds until the next poll: the server's ``pollInterval``, within bounds and the
    time left."""
    interval = task.get("pollInterval")
    seconds = (
        interval / 1000
        if isinstance(interval, int | float) and not isinstance(interval, bool)
        else DEFAULT_POLL
    )
    return max(0.0, min(max(MIN_POLL, min(seconds, MAX_POLL)), left))


def error_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


async def _send(client: Any, method: str, params: dict[str, Any], timeout: float) -> Any:
    session = client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {"timeout": timeout}
    session._stamp(data, opts)  # the negotiated protocol's headers (HTTP)
    async with asyncio.timeout(timeout):
        return await session._dispatcher.send_raw_request(method, data.get("params"), opts)


def _is_invalid_params(exc: BaseException) -> bool:
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS

    return isinstance(exc, MCPError) and exc.code == INVALID_PARAMS


class TaskCall:
    """One call of one tool run as a task, in one drive."""

    def __init__(self, connection: Connection, remote: str, ctx: Any) -> None:
        self.connection = connection
        self.server = connection.server
        self.remote = remote
        self.ctx = ctx
        self.timeouts = self.server.timeouts()

    # -- starting --------------------------------------------------------------------------

    def start(self, arguments: dict[str, Any], ttl_ms: int | None = None) -> dict[str, Any]:
        """Send ``tools/call`` as a task; the raw answer (a task, or a result if the server
        answered at once). Failures mean what a plain call's mean (``Connection.call``)."""
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

        conn = self.connection
        conn._probe()
        client = conn._connected()
        timeout = self.timeouts.call
        params: dict[str, Any] = {
            "name": self.remote,
            "arguments": arguments,
            "task": {"ttl": ttl_ms if ttl_ms is not None else int(self.timeouts.task * 1000)},
        }
        try:
            return dict(_run(_send(client, "tools/call", params, timeout), timeout + _GRACE))
        except TimeoutError:
            raise McpOutcomeUnknown(
                f"MCP server {self.server.name!r} did not answer the task call of "
                f"{self.remote!r} in {timeout:g}s after it was sent; whether it ran is unknown",
                code="mcp.timeout",
                server=self.server.name,
            ) from None
        except MCPError as exc:
            if exc.code in (METHOD_NOT_FOUND, INVALID_PARAMS):
                raise McpRefused.of(self.server.name, self.remote, exc.message) from None
            raise self._unknown(exc) from None
        except Exception as exc:
            raise self._unknown(exc) from None

    def _unknown(self, exc: BaseException) -> McpOutcomeUnknown:
        if _connection_failed(exc):
            self.connection.close()
        return McpOutcomeUnknown(
            f"the connection to MCP server {self.server.name!r} failed after the task call of "
            f"{self.remote!r} was sent ({_describe(exc)}); whether it ran is unknown",
            server=self.server.name,
        )

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, handle: dict[str, Any], notes: Any = None) -> dict[str, Any]:
        """Poll the task ``handle`` names until it ends; the call's ``CallToolResult`` as
        JSON. Raises ``ToolResultError`` (an error result) or ``McpOutcomeUnknown``."""
        task_id = task_of(handle)
        if task_id is None:
            raise McpOutcomeUnknown(
                f"the journaled handle of this call is not an MCP task's: {handle!r}",
                server=self.server.name,
            )
        started = handle.get("started_at")
        limit = self.timeouts.task
        deadline = (started if isinstance(started, int | float) else time.time()) + limit
        failpoints.hit(f"mcp-task-kept:{self.ctx.call_id}")
        while True:
            task = self._request("tasks/get", task_id, deadline, limit)
            status = task.get("status")
            if notes is not None:
                note = {"task": task_id, "status": status}
                if task.get("statusMessage"):
                    note["message"] = str(task["statusMessage"])[:500]
                notes.offer(note)
                notes.flush()
            if status in TERMINAL:
                break
            failpoints.hit(f"mcp-task-polled:{self.ctx.call_id}")
            time.sleep(poll_delay(task, deadline - time.time()))
        return self._result(task_id, task, deadline, limit)

    def _result(
        self, task_id: str, task: dict[str, Any], deadline: float, limit: float
    ) -> dict[str, Any]:
        import pydantic
        from mcp.types import CallToolResult

        status = task.get("status")
        said = task.get("statusMessage")
        where = f"task {task_id} of MCP tool {self.remote!r} (server {self.server.name!r})"
        if status == "cancelled":
            raise ToolResultError(
                f"{where} was cancelled", error_result(f"{where} was cancelled: {said or ''}")
            )
        try:
            raw = self._request("tasks/result", task_id, deadline, limit, failing=status)
        except _TaskFailed as failed:
            raw = None
            said = said or failed.message
        data = None
        if raw is not None:
            try:
                data = CallToolResult.model_validate(raw, by_name=False).model_dump(
                    mode="json", by_alias=True, exclude_none=True
                )
            except pydantic.ValidationError:
                if status == "completed":
                    raise McpOutcomeUnknown(
                        f"{where} completed, but its result could not be read",
                        server=self.server.name,
                    ) from None
        if status == "failed":
            data = data or error_result(f"{where} failed: {said or 'no reason given'}")
            data["isError"] = True
        assert data is not None
        if data.get("isError"):
            raise ToolResultError(
                f"MCP tool {self.remote!r} ({where}) answered with an error", data
            )
        return data

    def _request(
        self,
        method: str,
        task_id: str,
        deadline: float,
        limit: float,
        failing: str | None = None,
    ) -> dict[str, Any]:
        """``method`` for the task, tried again on any failure but "invalid params" until
        ``deadline``. A failed task's ``tasks/result`` may answer with an error: that is
        the failure's reason (``_TaskFailed``), not a transport problem."""
        from mcp import MCPError

        per_request = self.timeouts.list if method == "tasks/get" else self.timeouts.call
        last = "no answer yet"
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise McpOutcomeUnknown(
                    f"task {task_id} of MCP tool {self.remote!r} (server "
                    f"{self.server.name!r}) did not finish in {limit:g}s ({last}); whether "
                    "it ran is unknown — raise MCP_TIMEOUTS['TASK'] or the server's "
                    "task_timeout if it is just slow",
                    code="mcp.timeout",
                    server=self.server.name,
                )
            timeout = max(0.1, min(per_request, left))
            try:
                client = self.connection._connected()
                return dict(
                    _run(_send(client, method, {"taskId": task_id}, timeout), timeout + _GRACE)
                )
            except McpUnavailable as exc:
                last = str(exc)
            except TimeoutError:
                last = f"{method} timed out"
            except Exception as exc:
                if _is_invalid_params(exc):
                    raise McpOutcomeUnknown(
                        f"MCP server {self.server.name!r} no longer knows task {task_id} of "
                        f"{self.remote!r} ({_describe(exc)}): it expired or the server lost "
                        "it; whether it ran is unknown",
                        code="mcp.task_unknown",
                        server=self.server.name,
                    ) from None
                if failing == "failed" and isinstance(exc, MCPError):
                    raise _TaskFailed(exc.message) from None
                if _connection_failed(exc):
                    self.connection.close()
                last = _describe(exc)
            time.sleep(min(1.0, max(0.0, deadline - time.time())))


class _TaskFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def call(
    connection: Connection, remote: str, arguments: dict[str, Any], ctx: Any, notes: Any = None
) -> dict[str, Any]:
    """Call ``remote`` as a task, or resume waiting on the task this call journaled."""
    run = TaskCall(connection, remote, ctx)
    handle = ctx.handle()
    if handle is None:
        answer = run.start(arguments)
        task = answer.get("task")
        if not isinstance(task, dict) or not isinstance(task.get("taskId"), str):
            return _direct_result(run, answer)
        handle = ctx.keep_handle(handle_for(connection.server.name, remote, task))
    return run.wait(handle, notes)


def _direct_result(run: TaskCall, answer: dict[str, Any]) -> dict[str, Any]:
    """A server that answered a task call at once (a tool whose support is "optional")."""
    import pydantic
    from mcp.types import CallToolResult

    try:
        data = CallToolResult.model_validate(answer, by_name=False).model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    except pydantic.ValidationError:
        raise McpOutcomeUnknown(
            f"MCP server {run.server.name!r} answered the task call of {run.remote!r} with "
            "neither a task nor a result; whether it ran is unknown",
            server=run.server.name,
        ) from None
    if data.get("isError"):
        raise ToolResultError(f"MCP tool {run.remote!r} answered with an error", data)
    return data
