"""Progress of an MCP call, for the people following its run live.

A server reports progress of a call (``notifications/progress``, for the ``progressToken``
the SDK puts on every call) or of a task (its ``statusMessage`` when polled). Each report
is offered here, from whatever thread hears it; the thread waiting for the call writes the
latest one as a journal note (``@progress/<call>/…``, ``ToolContext.note_progress``) at
most once per ``INTERVAL`` seconds. A note is evidence beside the run's steps: it reaches
``agent.events()`` and the SSE stream like any record, is never replayed, and one that
cannot be written is dropped. The call itself never waits for a note: reports arrive on
the connection's event loop, which only stores them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

INTERVAL = 1.0


def progress_note(progress: float, total: float | None, message: str | None) -> dict[str, Any]:
    """A note's body from one ``notifications/progress``."""
    note: dict[str, Any] = {"progress": progress}
    if total is not None:
        note["total"] = total
    if message:
        note["message"] = message[:500]
    return note


class ProgressNotes:
    """The progress of one call: the latest report, written at most once per interval."""

    def __init__(self, ctx: Any, *, interval: float = INTERVAL, clock: Any = time.monotonic):
        self.ctx = ctx
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._last_written: dict[str, Any] | None = None
        self._written_at: float | None = None
        self.written = 0

    def offer(self, note: dict[str, Any]) -> None:
        """Keep ``note`` as the latest report (any thread; never blocks on the journal)."""
        with self._lock:
            if note != self._last_written:
                self._pending = dict(note)

    async def callback(self, progress: float, total: float | None, message: str | None) -> None:
        """The SDK's ``progress_callback``: runs on the connection's event loop."""
        self.offer(progress_note(progress, total, message))

    def flush(self) -> None:
        """Write the latest report if one is new and the interval has passed (the thread
        that waits for the call calls this between its waits)."""
        now = self.clock()
        with self._lock:
            note = self._pending
            if note is None:
                return
            if self._written_at is not None and now - self._written_at < self.interval:
                return
            self._pending = None
            self._last_written = note
            self._written_at = now
        if self.ctx.note_progress(note):
            self.written += 1
