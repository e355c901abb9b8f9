"""One connection per MCP server per process, held open on a background event loop.

The ``mcp`` SDK is asynchronous; the engine calls tools from plain threads. Every server's
connection lives as one task on a single daemon thread's event loop (opened by the first
call that needs it, reused by every drive of the process, closed at worker shutdown or
exit). A caller waits for its answer with a deadline, so a server that is down or slow is
a coded error, never a hang.

What a failure means for a call's outcome is decided here, once:

* nothing was sent (the server could not be reached, or a fresh probe of an idle
  connection failed twice): ``McpUnavailable`` — the call provably did not run;
* the server refused the request as malformed (JSON-RPC "method not found" or "invalid
  params"): a plain ``ToolError`` — it did not run;
* anything after the request was sent (the connection dropped, the answer timed out or
  could not be read): ``McpOutcomeUnknown``, a ``ToolOutcomeUnknown`` — a side-effect tool
  halts, a retry-safe one reads it as an error.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import elicitation
from .errors import McpOutcomeUnknown, McpRefused, McpTimeout, McpUnavailable, require_sdk

if TYPE_CHECKING:
    from .elicitation import Asker
    from .progress import ProgressNotes
    from .server import Server

T = TypeVar("T")

# Extra seconds a caller waits beyond a deadline the event loop enforces itself.
_GRACE = 2.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_connections: weakref.WeakSet[Connection] = weakref.WeakSet()
_hooked = False


def _event_loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop (a new one in a forked child: threads do not survive
    ``fork``, and neither do the parent's connections)."""
    global _loop, _loop_pid, _hooked
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="durable-agents-mcp", daemon=True
            )
            thread.start()
            _loop, _loop_pid = loop, os.getpid()
            for conn in list(_connections):
                conn._forget()
        if not _hooked:
            _hooked = True
            atexit.register(close_all)
            try:
                from celery.signals import worker_shutdown

                worker_shutdown.connect(_on_worker_shutdown, weak=False)
            except ImportError:  # pragma: no cover - celery is a dependency
                pass
        return _loop


def _on_worker_shutdown(sender: Any = None, **kwargs: Any) -> None:
    close_all()


def close_all(timeout: float = 5.0) -> None:
    """Close every MCP connection of this process (a stdio server's process ends)."""
    for conn in list(_connections):
        conn.close(timeout)


def _run(
    coro: Awaitable[T],
    wait: float,
    tick: Callable[[], None] | None = None,
    asker: Asker | None = None,
) -> T:
    """Run ``coro`` on the MCP loop and wait for it at most ``wait`` seconds; with
    ``tick``, call it about once a second while waiting (in this thread); with ``asker``,
    answer the server's elicitations meanwhile."""
    future = asyncio.run_coroutine_threadsafe(_as_coroutine(coro), _event_loop())
    deadline = time.monotonic() + wait
    try:
        if asker is not None:
            return cast(T, asker.serve(future, wait, tick))
        while True:
            left = deadline - time.monotonic()
            try:
                return future.result(max(0.0, min(left, 1.0)) if tick is not None else wait)
            except concurrent.futures.TimeoutError:
                # The builtin TimeoutError too: the coroutine's own timeout ends the wait.
                if tick is None or future.done() or time.monotonic() >= deadline:
                    raise
                tick()
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError from None


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the exception groups the SDK's task groups raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _connection_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself is gone (then it is opened again), not
    that one answer was bad (an error the server sent, a result that did not parse)."""
    import pydantic
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return bool(leaf.code == CONNECTION_CLOSED)
    return not isinstance(leaf, pydantic.ValidationError)


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__


class Connection:
    """The live session with one server in this process."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._open_lock = threading.Lock()
        _connections.add(self)

    def _forget(self) -> None:
        self._client = self._stop = self._task = None

    # -- opening and closing -------------------------------------------------------------

    def _connected(self) -> Any:
        """The open client, opened now if there is none (``McpUnavailable``/``McpTimeout``
        if the server cannot be reached in the connect timeout)."""
        _event_loop()  # in a forked child, forgets the parent's connections first
        with self._open_lock:
            if self._client is not None and self._task is not None and not self._task.done():
                return self._client
            self._close_now()
            timeout = self.server.timeouts().connect
            try:
                self._client, self._stop, self._task = _run(self._open(timeout), timeout + _GRACE)
            except TimeoutError:
                raise McpTimeout(
                    f"MCP server {self.server.name!r} did not finish connecting in {timeout:g}s "
                    f"({self.server.where()}); check that it is running, or raise "
                    "DURABLE_AGENTS['MCP_TIMEOUTS']['CONNECT']",
                    server=self.server.name,
                ) from None
            except Exception as exc:
                raise McpUnavailable(
                    f"MCP server {self.server.name!r} cannot be reached "
                    f"({self.server.where()}): {_describe(exc)}",
                    server=self.server.name,
                ) from None
            return self._client

    async def _open(self, timeout: float) -> tuple[Any, asyncio.Event, asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()
        stop = asyncio.Event()
        # Retrieved even when nobody waits for it any more (a connect that timed out).
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        task = loop.create_task(self._hold(ready, stop))
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), timeout)
        except BaseException:
            stop.set()
            task.cancel()
            raise
        return client, stop, task

    async def _hold(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        """The connection's whole life, in one task (the SDK's contexts are entered and
        left in the same task)."""
        try:
            async with self.server.client() as client:
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(_leaf(exc))
        except BaseException:
            if not ready.done():
                ready.cancel()
            raise

    def close(self, timeout: float = 5.0) -> None:
        with self._open_lock:
            self._close_now(timeout)

    def _close_now(self, timeout: float = 5.0) -> None:
        stop, task, loop = self._stop, self._task, _loop
        self._forget()
        if stop is None or task is None or loop is None or _loop_pid != os.getpid():
            return
        if task.done() or loop.is_closed():
            return

        async def finish() -> None:
            stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, timeout)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(finish(), loop).result(timeout + _GRACE)

    # -- listing and calling ------------------------------------------------------------

    def capabilities(self) -> Any:
        """The capabilities the server declared when this connection opened."""
        return getattr(self._connected(), "server_capabilities", None)

    def list_tools(self) -> list[Any]:
        """Every tool the server lists (all pages)."""
        timeout = self.server.timeouts().list
        client = self._connected()
        try:
            return _run(self._list(client, timeout), timeout + _GRACE)
        except TimeoutError:
            self.close()
            raise McpTimeout(
                f"MCP server {self.server.name!r} did not list its tools in {timeout:g}s; "
                "raise DURABLE_AGENTS['MCP_TIMEOUTS']['LIST'] if it is just slow",
                server=self.server.name,
            ) from None
        except Exception as exc:
            self.close()
            raise McpUnavailable(
                f"MCP server {self.server.name!r} failed to list its tools: {_describe(exc)}",
                server=self.server.name,
            ) from None

    async def _list(self, client: Any, timeout: float) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        async with asyncio.timeout(timeout):
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

    def call(
        self,
        remote: str,
        arguments: dict[str, Any],
        progress: ProgressNotes | None = None,
        asker: Asker | None = None,
    ) -> Any:
        """``tools/call`` on the server; its ``CallToolResult``. With ``progress``, the
        server's progress reports are offered to it and written while the call runs; the
        server's elicitations during the call go to ``asker`` (None: declined)."""
        self._probe()
        client = self._connected()
        timeout = self.server.timeouts().call
        try:
            return _run(
                self._call(client, remote, arguments, timeout, progress, asker),
                timeout + _GRACE,
                progress.flush if progress is not None else None,
                asker,
            )
        except TimeoutError:
            # The connection stays: other calls on it are fine, and the next call's probe
            # reconnects if the server hangs altogether.
            raise McpOutcomeUnknown(
                f"MCP server {self.server.name!r} did not answer the call of {remote!r} in "
                f"{timeout:g}s after it was sent; whether it ran is unknown",
                code="mcp.timeout",
                server=self.server.name,
            ) from None
        except McpRefused:
            raise
        except Exception as exc:
            if _connection_failed(exc):
                self.close()
            raise McpOutcomeUnknown(
                f"the connection to MCP server {self.server.name!r} failed after the call of "
                f"{remote!r} was sent ({_describe(exc)}); whether it ran is unknown",
                server=self.server.name,
            ) from None

    async def _call(
        self,
        client: Any,
        remote: str,
        arguments: dict[str, Any],
        timeout: float,
        progress: ProgressNotes | None = None,
        asker: Asker | None = None,
    ) -> Any:
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

        async with asyncio.timeout(timeout):
            try:
                with elicitation.calling(self.server, asker):
                    return await client.call_tool(
                        remote,
                        arguments,
                        progress_callback=progress.callback if progress is not None else None,
                    )
            except MCPError as exc:
                # JSON-RPC's own refusals: the request was turned down before anything ran.
                if exc.code in (METHOD_NOT_FOUND, INVALID_PARAMS):
                    raise McpRefused.of(self.server.name, remote, exc.message) from None
                raise

    def _probe(self) -> None:
        """Make sure the connection is alive before a call is sent: a connection whose
        server went away since (restarted between turns) would fail the call in a way
        that cannot be told from a failure after sending. A failed probe reconnects once;
        failing again, the call is ``McpUnavailable`` (it was never sent)."""
        timeout = self.server.timeouts().list
        for attempt in (1, 2):
            client = self._connected()
            try:
                _run(self._ping(client, timeout), timeout + _GRACE)
                return
            except Exception as exc:
                self.close()
                if attempt == 2:
                    raise McpUnavailable(
                        f"MCP server {self.server.name!r} does not answer "
                        f"({self.server.where()}): {_describe(exc)}",
                        server=self.server.name,
                    ) from None

    async def _ping(self, client: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            await client.list_tools()


@contextlib.asynccontextmanager
async def http_transport(
    url: str, headers: dict[str, str], connect_timeout: float, read_timeout: float
) -> AsyncIterator[Any]:
    """The streamable HTTP transport with the server's headers and our timeouts."""
    require_sdk()
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(connect_timeout, read=read_timeout)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams
