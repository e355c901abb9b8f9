"""The storage port: what the engine needs from a database, and nothing more.

A store holds three things per run: a row of projected state (``RunInfo``), an append-only
set of named journal entries, and at most one lease. Every backend passes the same
conformance suite (``tests/conformance``): InMemoryStore, DjangoStore on PostgreSQL and on
SQLite.

Requirements every store meets:

* **First writer wins.** ``insert`` stores ``data`` under ``(run_id, name)`` only if no entry
  has that name; concurrent inserts of one name, from any number of threads or processes,
  have exactly one winner, and every caller gets the winner's bytes back.
* **Commit order.** ``seq`` grows in commit order within a run; ``load`` returns a prefix of
  the final order, never an entry before one with a lower ``seq`` that is not yet visible.
* **Durable before return, byte fidelity, append-only.** An entry comes back exactly as
  written; there is no update or delete of an entry.
* **Fencing.** An insert or run update given ``fence=token`` succeeds only while ``token``
  holds the run's live lease, checked atomically with the write; otherwise it raises
  ``LeaseLost`` and stores nothing.
* **Leases on the store's clock.** Expiry is judged by the database's clock, never the
  caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

# Statuses a run can be in. The journal is the truth; the run row is a projection of it.
QUEUED = "queued"
RUNNING = "running"
AWAITING_APPROVAL = "awaiting_approval"
AWAITING_INPUT = "awaiting_input"
SLEEPING = "sleeping"
HALTED = "halted"
FINISHED = "finished"
FAILED = "failed"
CANCELLED = "cancelled"

STATUSES = (
    QUEUED,
    RUNNING,
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    SLEEPING,
    HALTED,
    FINISHED,
    FAILED,
    CANCELLED,
)
TERMINAL_STATUSES = frozenset({FINISHED, CANCELLED})
# Paused on a person: recovery leaves these alone.
HUMAN_WAIT_STATUSES = frozenset({AWAITING_APPROVAL, AWAITING_INPUT, HALTED})

# Run-row fields the engine may change after creation.
RUN_FIELDS = frozenset(
    {
        "agent",
        "status",
        "input",
        "answer",
        "usage",
        "spend",
        "turns",
        "last_error",
        "attempts",
        "fingerprint",
        "session_id",
        "parent_run_id",
        "root_run_id",
        "forked_from",
        "forked_step",
    }
)


@dataclass(frozen=True)
class Entry:
    """One stored journal entry: bytes and position, no meaning."""

    run_id: str
    name: str
    seq: int
    data: str
    created_at: datetime | None = None


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a run's lease and until when; ``live`` is judged by the store's clock."""

    run_id: str
    holder: str
    token: str
    expires_at: datetime
    renewed_at: datetime
    live: bool


@dataclass(frozen=True)
class RunInfo:
    """The projected state of a run, as the run row holds it."""

    run_id: str
    agent: str = ""
    status: str = QUEUED
    input: Any = None
    answer: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    spend: Mapping[str, int] = field(default_factory=dict)
    turns: int = 0
    last_error: Mapping[str, Any] | None = None
    attempts: int = 0
    fingerprint: Mapping[str, Any] | None = None
    session_id: str | None = None
    parent_run_id: str | None = None
    root_run_id: str | None = None
    forked_from: str | None = None
    forked_step: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    lease_expired: bool | None = None  # set by list_unfinished: lease absent or expired

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


HALT_OPEN = "open"
HALT_RESOLVED = "resolved"


@dataclass(frozen=True)
class HaltInfo:
    """A run stopped on an operation whose outcome is unknown, for a person to resolve."""

    run_id: str
    op_id: str  # the tool call id, or the step name
    tool_name: str = ""
    arguments: Any = None
    attempt: str = ""  # the journal name of the live attempt marker
    attempted_at: datetime | None = None
    cause: str = "crashed"  # or "contended"
    status: str = HALT_OPEN
    resolution: Mapping[str, Any] | None = None
    resolved_by: str | None = None
    created_at: datetime | None = None
    resolved_at: datetime | None = None


@runtime_checkable
class Store(Protocol):
    """The storage port. See the module docstring for the contract."""

    def create_run(self, run: RunInfo) -> bool:
        """Insert the run row if absent; True if this call created it."""

    def get_run(self, run_id: str) -> RunInfo | None: ...

    def update_run(
        self, run_id: str, changes: Mapping[str, Any], *, fence: str | None = None
    ) -> None:
        """Change projected fields (``RUN_FIELDS``); a terminal status stamps finished_at."""

    def insert(
        self, run_id: str, name: str, data: str, *, fence: str | None = None
    ) -> tuple[Entry, bool]:
        """Insert if absent; return the stored entry and whether this call stored it."""

    def get(self, run_id: str, name: str) -> Entry | None: ...

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]:
        """Entries with ``seq > after``, in commit order, in one read."""

    def acquire_lease(self, run_id: str, holder: str, token: str, ttl: float) -> bool:
        """Take the lease if absent, expired, or already ``token``'s; True if held now."""

    def renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        """Extend ``token``'s own live lease; False if it is no longer held."""

    def release_lease(self, run_id: str, token: str) -> None:
        """Drop the lease if ``token`` holds it; a no-op otherwise."""

    def get_lease(self, run_id: str) -> LeaseInfo | None: ...

    def save_halt(self, halt: HaltInfo) -> bool:
        """Record a halt if none is open for ``(run_id, op_id)``; True if this call did."""

    def list_halts(
        self, *, run_id: str | None = None, status: str | None = HALT_OPEN
    ) -> Sequence[HaltInfo]: ...

    def list_unfinished(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        statuses: Sequence[str] | None = None,
        lease_free: bool = False,
    ) -> Sequence[RunInfo]:
        """Runs without a terminal status, ordered by run id, after ``after``.

        ``statuses`` narrows to those statuses; ``lease_free`` keeps only runs whose lease is
        absent or expired. The cost does not grow with the number of finished runs.
        """
