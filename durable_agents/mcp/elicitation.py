"""Elicitation: an MCP server asking for input in the middle of a tool call (docs/mcp.md).

A server asks in one of two ways, and both reach the client's elicitation callback:

* a server on protocol 2026-07-28 (the mcp SDK's ``MCPServer`` with ``Resolve(Elicit)``)
  answers the ``tools/call`` with an ``InputRequiredResult``; the SDK's client calls the
  callback for each input request and sends the call again with the answers and the
  server's ``request_state`` (SEP-2322), all inside the one ``call_tool``;
* an older server (2025-11-25 and before) sends ``elicitation/create`` while the call is
  open.

Either way the question comes while a request is open, so the worker cannot pause durably
there: the question is journaled as an interrupt of the run (``wait:mcp.<call>.<n>``, with
``live`` and its ``deadline_ms``), staff answer it as any other (``answer_interrupt``: the
inbox, the answer form, the API, with the same permission), and the thread driving the call
reads the journal for the answer until the call's deadline. No answer in time: the thread
records the question as given up (an ``input:`` record of its own, first writer wins, so a
late answer is refused: ``interrupt.expired``) and answers the server ``cancel``.

What the server was told is journaled too (``waited:<name>``: ``accept`` / ``cancel``, or
``undelivered`` when the call ended before a recorded answer could be sent). A call whose
tool or server does not opt in (``elicitation=True``) declines at once, journaling nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..engine import answers, names
from ..engine.commands.waits import lease_digest
from ..engine.errors import ConfigError, ProtocolError, WaitError
from ..engine.journal import Journal, now_ms
from ..engine.records import Record, refuse_nul
from ..engine.waits import INTERRUPT

log = logging.getLogger(__name__)

PREFIX = "mcp."  # the wait names of elicitations: mcp.<call>.<n>
Action = Literal["accept", "decline", "cancel"]
ACCEPT: Action = "accept"
DECLINE: Action = "decline"
CANCEL: Action = "cancel"
UNDELIVERED = "undelivered"
POLL = 0.25  # seconds between reads of the journal while a question is open
_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,60}")


def question_prefix(call_id: str) -> str:
    """The wait-name prefix of call ``call_id``'s elicitations (``mcp.<call>.``; a call id
    a wait name cannot hold is named by a digest)."""
    if not _CALL_ID.fullmatch(call_id):
        call_id = hashlib.sha256(call_id.encode()).hexdigest()[:32]
    return f"{PREFIX}{call_id}."


def answer_window(call_timeout: float) -> float:
    """Seconds a call waits for staff, from its start: its timeout less a reserve for the
    server to finish after the answer (a fifth of the timeout, at most 10 seconds)."""
    return call_timeout - min(10.0, call_timeout / 5)


def check_option(what: str, value: Any) -> None:
    """``elicitation=`` is True or False (``config.mcp_elicitation``)."""
    if not isinstance(value, bool):
        raise ConfigError(
            f"{what}: elicitation must be True or False (whether staff answer the server's "
            f"questions during a call), not {value!r}",
            code="config.mcp_elicitation",
        )


def form_schema(requested: Any) -> dict[str, Any]:
    """The answer schema of a form elicitation: the server's ``requestedSchema`` as an
    interrupt's schema (``WaitError`` if it uses a keyword the answer check does not cover).
    ``enumNames`` (labels of a legacy titled enum) only names the choices: dropped."""
    if not isinstance(requested, dict):
        raise WaitError("requestedSchema is not an object", code="config.wait_schema")
    schema = dict(requested)
    props = {
        k: {kk: vv for kk, vv in v.items() if kk != "enumNames"} if isinstance(v, dict) else v
        for k, v in (schema.get("properties") or {}).items()
    }
    if props:
        schema["properties"] = props
    out = answers.schema_of(schema)
    assert out is not None
    return out


@dataclass
class _Ask:
    """One question of the server, between the MCP loop and the thread driving the call."""

    message: str
    requested: Any
    mode: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[Action, Any]]
    name: str = ""

    def reply(self, action: Action, content: Any = None) -> None:
        def settle() -> None:
            if not self.future.done():
                self.future.set_result((action, content))

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(settle)


class Asker:
    """The elicitations of one tool call.

    The MCP loop hands each question over (``elicit``); the thread that sent the call —
    it holds the run's fence and its database connection — journals it and reads the
    journal for the answer (``serve``) until the call's answer window closes."""

    def __init__(
        self,
        *,
        allowed: bool,
        what: str,
        waits: Any = None,
        call_timeout: float = 60.0,
        poll: float = POLL,
    ) -> None:
        self.allowed = allowed and waits is not None
        self.what = what
        self.waits = waits
        self.call_timeout = call_timeout
        self.poll = poll
        self._lock = threading.Lock()
        self._new: list[_Ask] = []
        self._wake = threading.Event()
        self._next: int | None = None

    # -- on the MCP loop -------------------------------------------------------------------

    async def elicit(self, params: Any) -> Any:
        """The client's answer to one ``elicitation/create`` (or one input request of an
        ``InputRequiredResult``): decline at once when not allowed or not a form; else wait
        for the thread serving the call to settle it."""
        from mcp.types import ElicitResult

        mode = getattr(params, "mode", None) or "form"
        if not self.allowed or mode != "form":
            if self.allowed:
                log.info(
                    "%s: declined a %s-mode elicitation (only forms go to staff)", self.what, mode
                )
            return ElicitResult(action=DECLINE)
        loop = asyncio.get_running_loop()
        ask = _Ask(str(params.message), params.requested_schema, mode, loop, loop.create_future())
        with self._lock:
            self._new.append(ask)
        self._wake.set()
        action, content = await ask.future
        try:
            return ElicitResult(action=action, content=content if action == ACCEPT else None)
        except ValueError:  # pydantic's: an answer the server's schema allowed, MCP does not
            log.warning("%s: an answer MCP cannot carry (not flat): cancelled", self.what)
            return ElicitResult(action=CANCEL)

    # -- on the thread that sent the call ---------------------------------------------------

    def serve(
        self,
        call: concurrent.futures.Future[Any],
        wait: float,
        tick: Callable[[], None] | None = None,
    ) -> Any:
        """The call's result, as ``call.result(wait)`` — answering its questions meanwhile,
        and with ``tick`` calling it about once a second (in this thread).
        Whatever ends the wait (the result, an error, the timeout, this thread's own
        error), every question still open is given up first."""
        call.add_done_callback(lambda _: self._wake.set())
        start = time.monotonic()
        window_end = start + answer_window(self.call_timeout)
        end = start + wait
        open_: list[_Ask] = []
        try:
            while not call.done():
                now = time.monotonic()
                if now >= end:
                    raise concurrent.futures.TimeoutError
                pause = min(self.poll, end - now) if open_ else end - now
                self._wake.wait(min(pause, 1.0) if tick is not None else pause)
                self._wake.clear()
                if tick is not None:
                    tick()
                with self._lock:
                    new, self._new = self._new, []
                for ask in new:
                    if self._ask(ask, window_end):
                        open_.append(ask)
                open_ = [a for a in open_ if not self._answered(a, time.monotonic() >= window_end)]
        except BaseException:
            call.cancel()  # nobody will answer its questions: the call must not go on
            raise
        finally:
            for ask in open_:
                with contextlib.suppress(Exception):
                    self._give_up(ask, delivered=False)
            with self._lock:
                late, self._new = self._new, []
            for ask in late:
                ask.reply(CANCEL)
        return call.result(0)

    def _first_number(self) -> int:
        """The number of the call's next question: after every one an earlier run of this
        call asked (a re-run after a crash). One of those still open was asked by a process
        that is gone: given up here, so nobody answers a question no one reads."""
        assert self.waits is not None
        prefix = question_prefix(self.waits.call_id)
        journal: Journal = self.waits.journal
        n = 1
        while True:
            rec = journal.get(self.waits.run_id, names.wait(prefix + str(n)))
            if rec is None:
                return n
            name = prefix + str(n)
            if journal.get(self.waits.run_id, names.waited(name)) is None:
                self._write_given_up(name, "abandoned")  # kept if an answer came first
                self._write_waited(name, UNDELIVERED)
            n += 1

    def _ask(self, ask: _Ask, window_end: float) -> bool:
        """Journal ``ask`` as an open question; False (and declined) if it cannot be."""
        waits = self.waits
        try:
            schema = form_schema(ask.requested)
        except WaitError as exc:
            log.warning(
                "%s: declined an elicitation whose schema is not checkable: %s", self.what, exc
            )
            ask.reply(DECLINE)
            return False
        if self._next is None:
            self._next = self._first_number()
        ask.name = question_prefix(waits.call_id) + str(self._next)
        self._next += 1
        remaining = max(0.0, window_end - time.monotonic())
        body = {
            "kind": INTERRUPT,
            "name": ask.name,
            "call_id": waits.call_id,
            "tool": waits.tool_name,
            "prompt": ask.message if ask.message.strip() else "(the server gave no message)",
            "schema": schema,
            "live": True,
            "deadline_ms": int(waits.store.now().timestamp() * 1000 + remaining * 1000),
            "mcp": {"via": self.what},
        }
        if waits.fence is not None:
            body["holder"] = lease_digest(waits.fence)
        try:
            refuse_nul(body, f"elicitation {ask.name!r}")
        except ProtocolError:
            ask.reply(DECLINE)
            return False
        waits.journal.write(waits.run_id, names.wait(ask.name), body, fence=waits.fence)
        return True

    def _answered(self, ask: _Ask, give_up: bool) -> bool:
        """Settle ``ask`` if the journal holds its answer, or give it up when ``give_up``;
        True when it is settled."""
        if ask.future.done():  # cancelled on the loop: the call gave up on it
            self._give_up(ask, delivered=False)
            return True
        rec = self.waits.journal.get(self.waits.run_id, names.interrupt_answer(ask.name))
        if rec is None and not give_up:
            return False
        if rec is None:
            self._give_up(ask, delivered=True)
            return True
        self._deliver(ask, rec)
        return True

    def _deliver(self, ask: _Ask, rec: Record) -> None:
        action: Action = CANCEL if rec.get("outcome") == CANCEL else ACCEPT
        self._write_waited(ask.name, action)
        ask.reply(action, rec.get("value") if action == ACCEPT else None)

    def _give_up(self, ask: _Ask, *, delivered: bool) -> None:
        """Close ``ask``: the thread's own ``input:`` record says it was given up, unless an
        answer got there first (first writer wins) — then that answer is sent, if the call
        still waits for it, or recorded as undelivered."""
        rec = self._write_given_up(ask.name, "timeout" if delivered else "call ended")
        if rec.get("outcome") == CANCEL:
            self._write_waited(ask.name, CANCEL if delivered else UNDELIVERED)
            ask.reply(CANCEL)
        elif delivered and not ask.future.done():
            self._deliver(ask, rec)
        else:
            self._write_waited(ask.name, UNDELIVERED)
            ask.reply(CANCEL)

    def _write_given_up(self, name: str, reason: str) -> Record:
        body = {
            "kind": "input",
            "name": name,
            "value": None,
            "outcome": CANCEL,
            "reason": reason,
            "by": None,
            "at": now_ms(),
        }
        rec: Record = self.waits.journal.write(
            self.waits.run_id, names.interrupt_answer(name), body, fence=self.waits.fence
        )[0]
        return rec

    def _write_waited(self, name: str, outcome: str) -> None:
        body = {"kind": "waited", "name": name, "call_id": self.waits.call_id, "outcome": outcome}
        self.waits.journal.write(
            self.waits.run_id, names.waited(name), body, fence=self.waits.fence
        )


# -- routing a question to its call ---------------------------------------------------------

_UNSET = object()
# The call a question belongs to, set in the task that sends the call: an SEP-2322 input
# request is answered inside that task, so it sees its own call here.
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("da_mcp_asker", default=_UNSET)
_inflight_lock = threading.Lock()
_inflight: dict[int, list[Asker | None]] = {}


@contextlib.contextmanager
def calling(connection: Any, asker: Asker | None) -> Iterator[None]:
    """Inside ``connection``'s call of a tool: questions go to ``asker`` (None: declined)."""
    token = _current.set(asker)
    with _inflight_lock:
        _inflight.setdefault(id(connection), []).append(asker)
    try:
        yield
    finally:
        with _inflight_lock:
            calls = _inflight.get(id(connection), [])
            calls.remove(asker)
            if not calls:
                _inflight.pop(id(connection), None)
        _current.reset(token)


def callback(connection: Any) -> Any:
    """The ``elicitation_callback`` of ``connection``'s client."""

    async def elicitation(context: Any, params: Any) -> Any:
        from mcp.types import ElicitResult

        asker = _current.get()
        if asker is _UNSET:
            # An ``elicitation/create`` of an older server comes on the session's own task:
            # it belongs to the one call in flight; with several, nobody can tell which.
            with _inflight_lock:
                calls = list(_inflight.get(id(connection), []))
            asker = calls[0] if len(calls) == 1 else None
        if asker is None:
            return ElicitResult(action=DECLINE)
        return await asker.elicit(params)

    return elicitation
