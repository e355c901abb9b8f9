"""A call whose work is held elsewhere, and how far it has got.

Some tools hand their work to a system that keeps it and answers later: an MCP server that
runs a call as a *task* returns a task id at once, and the result is fetched by polling.
Such a tool journals the id (``handle:<call>``, first writer wins, fenced by the driver's
lease) **before** it waits. A resume that finds a call with a handle and no result does not
run the call again and, for a side effect, does not halt: it gives the handle back to the
tool (``ToolContext.handle()``), which waits on the same work. A tool opts in with
``Tool.resumes = True``; a call whose tool does not (or no longer does) is halted as any
other live attempt.

Scope: the handle is what the tool says it is; the engine keeps it, never reads it. A tool
that finds its handle useless (the remote system forgot it) raises ``ToolOutcomeUnknown``:
a side effect halts then, for good (a person records the outcome), and a retry-safe call
reads it as an error.

Progress notes (``@progress/<call>/<nonce>/<n>``) are evidence for people following the
run live: never read back, never replayed, best effort (a note that cannot be written is
dropped, the call goes on).
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

from . import names
from .journal import Journal
from .ports import Store
from .records import Record

log = logging.getLogger("durable_agents")

HANDLE_KIND = "handle"
PROGRESS_KIND = "progress"


def handle_body(call_id: str, tool_name: str, value: dict[str, Any]) -> dict[str, Any]:
    """The ``handle:<call>`` body: the tool's own description of where its work is."""
    return {"kind": HANDLE_KIND, "call_id": call_id, "tool": tool_name, "handle": value}


def handle_of(record: Record | None) -> dict[str, Any] | None:
    """The handle a ``handle:<call>`` record holds (None: no record, or not a handle)."""
    if record is None or record.get("kind") != HANDLE_KIND:
        return None
    value = record.get("handle")
    return dict(value) if isinstance(value, dict) else None


def progress_body(call_id: str, tool_name: str, note: dict[str, Any]) -> dict[str, Any]:
    return {"kind": PROGRESS_KIND, "call_id": call_id, "tool": tool_name, **note}


class CallRecords:
    """The records one tool call may write about itself in one drive: its handle and its
    progress notes. Every write is fenced by the driver's lease."""

    def __init__(
        self, store: Store, run_id: str, call_id: str, tool_name: str, *, fence: str | None
    ) -> None:
        self.journal = Journal(store)
        self.run_id = run_id
        self.call_id = call_id
        self.tool_name = tool_name
        self.fence = fence
        self._nonce = secrets.token_hex(4)
        self._notes = 0
        self._lock = threading.Lock()

    def handle(self) -> dict[str, Any] | None:
        """The handle journaled for this call (by this drive or one before it), or None."""
        return handle_of(self.journal.get(self.run_id, names.handle(self.call_id)))

    def keep_handle(self, value: dict[str, Any]) -> dict[str, Any]:
        """Journal ``value`` as this call's handle; the handle the journal holds (another
        writer's, if one came first). Raises what the store raises (``LeaseLost``…): a tool
        that could not keep its handle must not wait on it."""
        rec, _ = self.journal.write(
            self.run_id,
            names.handle(self.call_id),
            handle_body(self.call_id, self.tool_name, value),
            fence=self.fence,
        )
        kept = handle_of(rec)
        return kept if kept is not None else value

    def note_progress(self, note: dict[str, Any]) -> bool:
        """Journal one progress note (best effort: False if it could not be written)."""
        with self._lock:
            self._notes += 1
            n = self._notes
        try:
            self.journal.write(
                self.run_id,
                names.progress(self.call_id, self._nonce, n),
                progress_body(self.call_id, self.tool_name, note),
                fence=self.fence,
                sync=False,
            )
        except Exception:
            log.warning(
                "run %s: could not note the progress of call %s",
                self.run_id,
                self.call_id,
                exc_info=True,
            )
            return False
        return True
