"""Following a run: its journal records as they are committed, until it ends or pauses.

``follow(store, run_id, after)`` works on any ``Store`` by polling; a store that can be told
when a run changes (PostgreSQL ``LISTEN``, in ``durable_agents.database.events``) passes a ``wait``
that returns as soon as something was committed, so the same loop follows with no delay.

Scope: it reports what the journal holds, in ``seq`` order, each record once; it ends when
the run's status is neither queued nor running (finished, failed, cancelled, or paused on a
person, a signal or a timer) after reading every record committed before that status. It
does not keep a run alive or drive it: follow again after a pause is resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from . import runtime
from .errors import NotFound
from .journal import to_record
from .ports import FAILED, QUEUED, RUNNING, TERMINAL_STATUSES, Entry, RunInfo
from .records import Record

# A run in one of these may still write records; any other status ends a stream.
LIVE_STATUSES = frozenset({QUEUED, RUNNING})
POLL_SECONDS = 0.2


class Readable(Protocol):
    """What following reads: a ``Store`` is one."""

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]: ...

    def get_run(self, run_id: str) -> RunInfo | None: ...


# Blocks up to ``timeout`` seconds; True when the run may have changed (a notification),
# False when the time ran out quietly.
Wait = Callable[[float], bool]


def polling(seconds: float) -> Wait:
    """A ``wait`` that just sleeps ``seconds`` (stores that cannot notify)."""

    def wait(timeout: float) -> bool:
        runtime.sleep(min(seconds, timeout))
        return True

    return wait


def pauses_or_ends(status: str) -> bool:
    """Whether a stream ends on ``status``: the run ended or paused (the default)."""
    return status not in LIVE_STATUSES


def ends(status: str) -> bool:
    """Whether a stream that watches through pauses ends on ``status``: the run ended."""
    return status in TERMINAL_STATUSES or status == FAILED


def ticks(
    store: Readable,
    run_id: str,
    after: int = 0,
    *,
    wait: Wait | None = None,
    idle: float = 15.0,
    stop: Callable[[str], bool] = pauses_or_ends,
) -> Iterator[Record | str | None]:
    """The records of ``run_id`` with ``seq > after`` as they commit; the run's status (a
    ``str``) first and whenever it changes; ``None`` whenever ``idle`` seconds passed with
    nothing new (a stream sends a keep-alive then). Ends after the status ``stop`` accepts.

    Whoever passes ``wait`` must have started listening before calling this: the backlog
    is read after, so nothing committed in between is missed; records are never repeated
    because each read starts after the last ``seq`` seen. Raises ``NotFound``
    (``run.not_found``) for a run that does not exist.
    """
    wait = wait or polling(POLL_SECONDS)
    quiet = 0.0
    status: str | None = None
    while True:
        for entry in store.load(run_id, after):
            after = entry.seq
            quiet = 0.0
            yield to_record(entry)
        run = store.get_run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}", code="run.not_found")
        ending = stop(run.status)
        if ending:
            # Whatever was committed before the status changed is visible now.
            for entry in store.load(run_id, after):
                after = entry.seq
                yield to_record(entry)
        if run.status != status:
            status = run.status
            quiet = 0.0
            yield status
        if ending:
            return
        started = runtime.monotonic()
        woken = wait(max(idle - quiet, 0.0))
        quiet += runtime.monotonic() - started
        if not woken or quiet >= idle:
            quiet = 0.0
            yield None


def follow(
    store: Readable, run_id: str, after: int = 0, *, wait: Wait | None = None
) -> Iterator[Record]:
    """The records of ``run_id`` after ``after`` as they are committed (see ``ticks``)."""
    for item in ticks(store, run_id, after, wait=wait):
        if isinstance(item, Record):
            yield item
