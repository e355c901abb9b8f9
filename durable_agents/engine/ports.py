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
  written; there is no update or delete of an entry. The one exception to "durable before
  return" is an insert the engine marks ``sync=False`` (the durability dial): it may be lost
  by a power loss, but only together with every relaxed write after it — a later durable
  write makes every earlier write durable (commit order is log order).
* **Fencing.** An insert, run update, halt or approval request given ``fence=token``
  succeeds only while ``token`` holds the run's live lease, checked atomically with the
  write; otherwise it raises ``LeaseLost`` and stores nothing — also when the name is
  already recorded, so a driver that lost its lease never reads on past the point where
  another driver took over.
* **Leases on the store's clock.** Expiry is judged by the database's clock, never the
  caller's; ``now()`` reads that clock, and every age the engine judges (a halt's) uses it.
* **A record and its run-row changes are stored together** (``insert(..., run_changes=)``):
  both or neither, on every backend.
* **Runs created in a final state** (a session's journal) are finished in that one write.
* **Spent ids** (``engine.spent``). ``delete_run`` (and a database store's ``prune``) spends
  the id of the run it deletes, in the same write; ``create_run``, ``start_run`` and
  ``start_or_load`` never create a row under a spent id: they raise ``spent.refusal``
  (``run.spent``, ``run.pruned``) and store nothing.
* **Only agent runs are work**: ``list_unfinished`` lists runs of kind ``agent`` only; a
  session's journal (``session``) or a plain journal (``journal``) is never driven.
* **Halts are written once per attempt** (run, op, attempt); a resolved or orphaned halt
  never reopens.
* **Dispatch stamps.** ``mark_dispatched`` records when recovery handed a run over, on the
  store's clock, without touching ``updated_at``; of concurrent stamps that saw the same
  earlier one, exactly one succeeds (two recovery passes never both re-send a run).
* **One-write start and finish.** ``start_run`` creates a new run already leased, with its
  first records, all or nothing (nothing at all when the run exists); ``finish_run`` is a
  fenced ``insert`` that also releases the lease when it stores the record;
  ``finish_run_with`` stores a run's last records together (its final turn and its end),
  all or nothing, and releases the lease with them.
* **Conditional writes.** ``update_run`` and ``set_approval_status`` given ``if_status``
  change the row only while its status is one of those, atomically, and say whether they did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .errors import ApprovalArgumentsChanged, ApprovalOrphaned
from .records import encode


class RunStatus(StrEnum):
    """Statuses a run can be in, in the order the docs list them. The journal is the truth;
    the run row is a projection of it, and only ``engine.lifecycle`` changes it. Each
    member is its value (``RunStatus.QUEUED == "queued"``): the strings a row holds."""

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    SLEEPING = "sleeping"
    # A limit is full (engine.limits): waits for a slot or a rate permit, tried again at a
    # time.
    THROTTLED = "throttled"
    HALTED = "halted"
    COMPENSATING = "compensating"  # a saga aborted and is undoing its completed calls
    FINISHED = "finished"
    COMPENSATED = "compensated"  # a saga aborted and undid what it had done
    FAILED = "failed"
    CANCELLED = "cancelled"


QUEUED = RunStatus.QUEUED
RUNNING = RunStatus.RUNNING
AWAITING_APPROVAL = RunStatus.AWAITING_APPROVAL
AWAITING_INPUT = RunStatus.AWAITING_INPUT
SLEEPING = RunStatus.SLEEPING
THROTTLED = RunStatus.THROTTLED
HALTED = RunStatus.HALTED
COMPENSATING = RunStatus.COMPENSATING
FINISHED = RunStatus.FINISHED
COMPENSATED = RunStatus.COMPENSATED
FAILED = RunStatus.FAILED
CANCELLED = RunStatus.CANCELLED

STATUSES = tuple(RunStatus)
TERMINAL_STATUSES = frozenset({FINISHED, CANCELLED, COMPENSATED})
# Paused on a person: recovery leaves these alone.
HUMAN_WAIT_STATUSES = frozenset({AWAITING_APPROVAL, AWAITING_INPUT, HALTED})
NOT_TERMINAL_STATUSES = tuple(s for s in STATUSES if s not in TERMINAL_STATUSES)

# What a run row is: only agent runs are ever driven. A session's own journal and a run
# written only through ``Journal`` are records, created finished.
KIND_AGENT = "agent"
KIND_SESSION = "session"
KIND_JOURNAL = "journal"
RUN_KINDS = (KIND_AGENT, KIND_SESSION, KIND_JOURNAL)

# Where a run came from (``RunInfo.imported``): made here (""), or imported from another
# site's export (docs/replay.md, "Imports"). An inert import is evidence: never driven, its
# requests never decided, left out of every listing of work. A live import had every
# decision in it verified against this site's approver keys, and is driven as any run.
NOT_IMPORTED = ""
IMPORTED_INERT = "inert"
IMPORTED_LIVE = "live"
IMPORTED_KINDS = (NOT_IMPORTED, IMPORTED_INERT, IMPORTED_LIVE)

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


class Entry(NamedTuple):
    """One stored journal entry: bytes and position, no meaning. (A named tuple: a resume
    reads thousands of them at once.)"""

    run_id: str
    name: str
    seq: int
    data: str
    created_at: datetime | None = None


class Existing(NamedTuple):
    """What ``Store.start_or_load`` read of a run that already existed: its journal and the
    row fields a finished run's re-entry checks, in the snapshot its start attempt saw."""

    entries: Sequence[Entry]
    status: str
    answer: str | None
    turns: int
    imported: str


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
class Acquired:
    """A lease ``acquire_lease`` granted (always true). ``previous`` is the lease of another
    holder it replaced (expired), None when the lease was free or already the caller's: a
    driver that took a run over from someone else journals it."""

    previous: LeaseInfo | None = None

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class ThrottleInfo:
    """A throttled run: what it waits for (a limit's key), why (``slots`` or ``rate``), the
    limit as people read it, since when, how many times in a row, and when it tries again."""

    run_id: str
    agent: str
    key: str
    reason: str
    limit: str
    retry_at: datetime
    since: datetime
    tries: int = 1


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
    kind: str = KIND_AGENT
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    # When recovery last handed the run to a driver (the store's clock); only
    # ``mark_dispatched`` sets it, and it never counts as a change of the row (updated_at).
    dispatched_at: datetime | None = None
    lease_expired: bool | None = None  # set by list_unfinished: lease absent or expired
    # Set once, by an import (never among ``RUN_FIELDS``): ``IMPORTED_INERT`` or
    # ``IMPORTED_LIVE``; ``NOT_IMPORTED`` for a run made here.
    imported: str = NOT_IMPORTED

    def __post_init__(self) -> None:
        # A row holds strings: a status written as a ``RunStatus`` reads back as its value,
        # from the in-memory store as from a database.
        if isinstance(self.status, RunStatus):
            object.__setattr__(self, "status", str(self.status))

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def inert(self) -> bool:
        """An inert import: evidence, never driven nor decided (``engine.imported``)."""
        return self.imported == IMPORTED_INERT


HALT_OPEN = "open"
HALT_RESOLVED = "resolved"
HALT_ORPHANED = "orphaned"  # its run was cancelled: nothing to resolve any more
# A halt's causes: its driver stopped inside the call; another caller holds the claim; the
# tool itself raised ``ToolOutcomeUnknown`` (what it said is the halt's ``reason``).
HALT_CRASHED = "crashed"
HALT_CONTENDED = "contended"
HALT_OUTCOME_UNKNOWN = "outcome_unknown"
# Nobody decided the call's approval request before its deadline, which says the run halts
# (``da.Deadline(on_expiry="halt")``): nothing ran, and a person records the call's result.
HALT_EXPIRED = "expired"


@dataclass(frozen=True)
class HaltInfo:
    """A run stopped on an operation whose outcome is unknown, for a person to resolve."""

    run_id: str
    op_id: str  # the tool call id, or "step:<name>" for a durable step
    tool_name: str = ""
    arguments: Any = None
    attempt: str = ""  # the journal name of the live attempt marker: one halt per attempt
    attempted_at: datetime | None = None
    # or "contended", "outcome_unknown" (the tool said so), "expired" (its approval request)
    cause: str = "crashed"
    status: str = HALT_OPEN
    resolution: Mapping[str, Any] | None = None
    resolved_by: str | None = None
    created_at: datetime | None = None
    resolved_at: datetime | None = None
    # "outcome_unknown": what the tool raised, ``{"type": ..., "message": ...}``.
    reason: Mapping[str, Any] | None = None


APPROVAL_PENDING = "pending"
APPROVAL_APPROVED = "approved"
APPROVAL_DENIED = "denied"
APPROVAL_WITHDRAWN = "withdrawn"
# Nobody decided before the request's deadline (``engine.rules.Deadline``): it can never be
# approved afterwards. The call's result says so (``on_expiry="deny"``), or the run was
# cancelled or halted.
APPROVAL_EXPIRED = "expired"
APPROVAL_STATUSES = (
    APPROVAL_PENDING,
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_WITHDRAWN,
    APPROVAL_EXPIRED,
)


@dataclass(frozen=True)
class ApprovalRequestInfo:
    """One gated tool call waiting for (or past) a staff decision."""

    run_id: str
    call_id: str
    tool_name: str
    arguments: Any
    policy: Mapping[str, Any]  # {"kind": "single"} or {"kind": "quorum", "need", "group"}
    start_seq: int  # the run's `run:start` position: which incarnation of the run asked
    status: str = APPROVAL_PENDING
    created_at: datetime | None = None
    decided_at: datetime | None = None
    # Set when arguments approved earlier would now run as ``arguments`` (a deploy changed
    # how the call validates): the call is asked about again, showing both.
    previous_arguments: Any = None
    # When its next deadline step falls due (``engine.deadlines``); None: none is left.
    due_at: datetime | None = None
    # For a tool the site did not write (an MCP server's), the digest of its definition as
    # the server declared it when the call was asked (``Tool.definition_digest``): what a
    # decision is about besides the arguments. "" for a Python tool.
    tool_digest: str = ""


def same_request(existing: ApprovalRequestInfo, request: ApprovalRequestInfo) -> bool:
    """Whether ``request`` is already asked by ``existing``, pending or decided: the same run
    start, the same arguments (and the same earlier ones, for a call asked again). A decided
    one is not asked anew: a driver that read the journal just before a person's decision
    landed asks about a call already decided, and replacing the row would drop that person's
    decision (and its signature) while the journal keeps it. A row is marked decided only
    for the arguments its journaled decision is about (``set_approval_status``'s
    ``if_arguments``), so a decided row never stands for a decision the journal lacks."""
    return existing.status != APPROVAL_WITHDRAWN and same_question(existing, request)


def same_question(a: ApprovalRequestInfo, b: ApprovalRequestInfo) -> bool:
    """Whether two requests ask the same question, whatever became of it: one run start, the
    same arguments, the same earlier ones, about the same tool (its server's definition)."""
    return (
        a.start_seq == b.start_seq
        and encode(a.arguments) == encode(b.arguments)
        and encode(a.previous_arguments) == encode(b.previous_arguments)
        and a.tool_digest == b.tool_digest
    )


def asked_again(
    decision: DecisionInfo, current: ApprovalRequestInfo | None
) -> ApprovalArgumentsChanged:
    """What a store raises for a decision ``changed_under`` its request."""
    shown = decision.request.arguments if decision.request is not None else None
    now = current.arguments if current is not None else None
    return ApprovalArgumentsChanged(
        f"call {decision.call_id!r} of run {decision.run_id!r} was asked about again while "
        f"the decision was being recorded (now {encode(now)}, shown {encode(shown)}); nothing "
        "was recorded: look at it again before deciding",
        arguments=now,
        shown=shown,
    )


def changed_under(decision: DecisionInfo, current: ApprovalRequestInfo | None) -> bool:
    """Whether the request ``decision`` was made on was asked again (or its run started
    again) before the decision was written: it must not count for a question its maker was
    never shown."""
    return decision.request is not None and (
        current is None or not same_question(current, decision.request)
    )


def closed_under(decision: DecisionInfo, current: ApprovalRequestInfo | None) -> bool:
    """Whether the request ``decision`` is about was closed (decided, withdrawn, expired)
    before the decision was written: a vote saved then would be counted by a decision on a
    request nobody may decide any more (the run cancelled or rolled back meanwhile, found by
    the simulator)."""
    return current is not None and current.status != APPROVAL_PENDING


def closed_request(decision: DecisionInfo, current: ApprovalRequestInfo) -> ApprovalOrphaned:
    """What a store raises for a decision on a request ``closed_under`` it."""
    return ApprovalOrphaned(
        f"the request of call {decision.call_id!r} in run {decision.run_id!r} was closed "
        f"({current.status}) while the decision was being recorded; nothing was recorded"
    )


@dataclass(frozen=True)
class DecisionInfo:
    """One approver's decision on one request."""

    run_id: str
    call_id: str
    approver: str
    approved: bool
    note: str = ""
    signature: str | None = None
    created_at: datetime | None = None
    # An approval's edited arguments (validated against the tool's schema): what it approves
    # running instead of the ones asked about. None: approved (or denied) as asked.
    arguments: Any = None
    # The deputy who made it for ``approver`` (a ``Delegation``); "" for the approver.
    deputy: str = ""
    # The request as its maker was shown it (a quorum's vote, when saved; None when read
    # back). A store saves the decision only while the request still asks that
    # (``changed_under``): a drive under new code may ask again, and clear the votes,
    # between the command's check and the write.
    request: ApprovalRequestInfo | None = None


@dataclass(frozen=True)
class DelegationInfo:
    """``deputy`` decides for ``approver`` from ``starts_at`` until ``ends_at`` (the store's
    clock) — or until it was revoked — the calls of ``tools`` asked of members of
    ``groups`` (empty: any). People by username, as decisions name them
    (``engine.delegation``)."""

    approver: str
    deputy: str
    starts_at: datetime
    ends_at: datetime
    groups: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    note: str = ""
    created_by: str = ""
    id: int | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    revoked_by: str = ""

    def in_force(self, at: datetime) -> bool:
        return self.starts_at <= at < self.ends_at and (
            self.revoked_at is None or at < self.revoked_at
        )

    def covers(self, tool: str, groups: Sequence[str]) -> bool:
        """Whether it covers a call of ``tool`` decided by the members of ``groups``."""
        if self.tools and tool not in self.tools:
            return False
        return not self.groups or any(g in self.groups for g in groups)

    def overlaps(self, other: DelegationInfo) -> bool:
        """Whether both stand for the same approver over some of the same time and calls
        (a revoked one stands for nothing)."""

        def meet(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
            return not a or not b or bool(set(a) & set(b))

        return (
            self.approver == other.approver
            and self.revoked_at is None
            and other.revoked_at is None
            and self.starts_at < other.ends_at
            and other.starts_at < self.ends_at
            and meet(self.groups, other.groups)
            and meet(self.tools, other.tools)
        )


@dataclass(frozen=True)
class ActionInfo:
    """A history row: who did what to which run."""

    actor: str
    action: str
    run_id: str
    target: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    # The actor's stable id (a user's primary key) and how the request came: "admin",
    # "session", "api-key:<prefix>", "signature via <relay> (<their channel>)", "command",
    # "python".
    actor_id: str = ""
    channel: str = ""


@runtime_checkable
class Store(Protocol):
    """The storage port. See the module docstring for the contract."""

    def now(self) -> datetime:
        """The store's (the database's) clock."""

    def create_run(self, run: RunInfo) -> bool:
        """Insert the run row if absent; True if this call created it. A run created in a
        terminal status is finished (``finished_at``) by this same write. A spent id (its
        row absent) is refused: ``RunIdSpent``, nothing stored."""

    def get_run(self, run_id: str) -> RunInfo | None: ...

    def run_held(self, run_id: str) -> bool:
        """Whether the run's row exists, read under a share lock (PostgreSQL): it waits for
        a transaction deleting the row (``retention.prune``) to end, and says what it did.
        A fork asks it of its source after creating its own row."""

    def delete_run(self, run_id: str) -> None:
        """Delete the run with its journal, lease, approval requests and halts (the action
        log stays), and spend its id (``engine.spent``) in the same write. The explicit
        admin action, through ``commands.runs.delete``."""

    def mark_dispatched(self, run_id: str, *, seen: datetime | None) -> bool:
        """Stamp ``dispatched_at`` with the store's clock, only while the stamp is still the
        one the caller read (``seen``, None for never) or older; ``updated_at`` stays. True
        if this call stamped it (and so should hand the run over)."""

    def update_run(
        self,
        run_id: str,
        changes: Mapping[str, Any],
        *,
        fence: str | None = None,
        if_status: Sequence[str] | None = None,
    ) -> bool:
        """Change projected fields (``RUN_FIELDS``); a terminal status stamps finished_at.
        With ``if_status``, only while the row's status is one of those. True if changed."""

    def insert(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str | None = None,
        run_changes: Mapping[str, Any] | None = None,
        sync: bool = True,
    ) -> tuple[Entry, bool]:
        """Insert if absent; return the stored entry and whether this call stored it.

        ``run_changes``, applied only if this call stored the entry, update the run row's
        projection with it (atomically where the store can). ``sync=False`` (the durability
        dial, ``engine.durability``): the record is safe to redo, so its write may return
        before it is on disk — but never become durable after a later ``sync`` write does,
        and only this one write may be relaxed. A store that cannot tell the difference
        ignores it (every write is then durable)."""

    def start_run(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> list[Entry] | None:
        """Create a brand-new run already leased: the row as ``run`` gives it, the lease for
        ``token`` (``ttl`` seconds on the store's clock) and ``records`` (name, data) in that
        order, all or nothing, in one write where the store can. The stored entries in
        commit order; None, writing nothing, if the run exists. Without a ``token`` (and
        ``holder``, ``ttl``) no lease is taken: a run created for a worker to drive."""

    def start_or_load(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> tuple[list[Entry] | None, Existing | None]:
        """``start_run``, and when the run exists, what a driver reads next, in the same
        round trip where the store can: ``(entries, None)`` for a run it started,
        ``(None, existing)`` for one that existed (``existing`` None when the store did not
        read it, e.g. the row was committed after the statement's snapshot: the driver
        reads as usual). A re-entry of a finished run (a redelivered message) is then one
        round trip."""

    def finish_run(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> tuple[Entry, bool]:
        """``insert(run_id, name, data, fence=fence, run_changes=run_changes)`` that also
        drops ``fence``'s lease in the same write when it stores the record (a driver's last
        write). Fenced like ``insert``: a lost lease raises ``LeaseLost`` and stores nothing."""

    def finish_run_with(
        self,
        run_id: str,
        records: Sequence[tuple[str, str]],
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> list[Entry] | None:
        """A driver's last records, ``records`` (name, data) in that order — its final model
        turn and ``run:complete`` — with ``run_changes`` and the release of ``fence``'s lease,
        all or nothing, in one write where the store can. The stored entries in commit order;
        None, writing nothing, if the first name is already recorded or ``fence`` no longer
        holds the lease (the driver then writes step by step, which tells the two apart)."""

    def get(self, run_id: str, name: str) -> Entry | None: ...

    def find(self, run_ids: Sequence[str], names: Sequence[str]) -> list[Entry]:
        """The entries called any of ``names`` in any of ``run_ids``' journals, in one read:
        an entry committed before the read is in it, whichever run it is in (how a sub-run
        looks for a stop above it, atomically, before each step)."""

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]:
        """Entries with ``seq > after``, in commit order, in one read."""

    def acquire_lease(self, run_id: str, holder: str, token: str, ttl: float) -> Acquired | None:
        """Take the lease if absent, expired, or already ``token``'s; None if another holder
        holds it live, or if the run is an inert import (``RunInfo.inert``: never driven).
        ``Acquired.previous`` names the other holder's lease it replaced."""

    def renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        """Extend ``token``'s own live lease; False if it is no longer held."""

    def release_lease(self, run_id: str, token: str) -> None:
        """Drop the lease if ``token`` holds it; a no-op otherwise."""

    def get_lease(self, run_id: str) -> LeaseInfo | None: ...

    def save_halt(self, halt: HaltInfo, *, fence: str | None = None) -> bool:
        """Record a halt unless one for ``(run_id, op_id, attempt)`` exists, whatever its
        status; True if this call did. Given ``fence``, fenced like ``insert``: a lost lease
        raises ``LeaseLost`` and writes nothing (a driver halting from a stale journal)."""

    def list_halts(
        self, *, run_id: str | None = None, status: str | None = HALT_OPEN
    ) -> Sequence[HaltInfo]:
        """The halts of ``run_id``; without it, the site's (those of inert imports left
        out: nothing there is anyone's to act on)."""

    def resolve_halt_row(
        self, run_id: str, op_id: str, resolution: Mapping[str, Any], by: str | None
    ) -> None:
        """Mark the open halts of ``(run_id, op_id)`` resolved."""

    def orphan_halts(self, run_id: str) -> int:
        """Mark every open halt of the run orphaned (its run was cancelled); how many."""

    def save_approval_request(
        self, request: ApprovalRequestInfo, *, fence: str | None = None
    ) -> bool:
        """Insert the request unless the same one is there, pending or decided
        (``same_request``); any other for ``(run_id, call_id)`` — from an earlier incarnation
        of the run, for other arguments, or withdrawn — is replaced, its decisions with it.
        Its ``created_at`` is the store's clock, and its ``due_at`` the first step of its
        policy's deadline after that (``engine.deadlines.first_after``), or None.
        True if written. Given ``fence``, fenced like ``insert``: a lost lease raises
        ``LeaseLost`` and writes nothing, so a stale driver never drops the live request's
        decisions."""

    def get_approval_request(self, run_id: str, call_id: str) -> ApprovalRequestInfo | None: ...

    def update_approval_request(
        self, run_id: str, call_id: str, *, policy: Mapping[str, Any], if_arguments: Any
    ) -> bool:
        """Replace a pending request's ``policy`` (an edit that moved it under a stricter
        rule), only while it is pending and asks about ``if_arguments``; its votes stay.
        True if it changed."""

    def list_due_approval_requests(self, *, limit: int = 100) -> Sequence[ApprovalRequestInfo]:
        """Pending requests whose ``due_at`` has come by the store's clock, soonest first, at
        most ``limit``: one indexed read (``da_approval_due`` on the database stores), its
        cost the same whatever the number of decided requests."""

    def advance_deadline(
        self,
        run_id: str,
        call_id: str,
        *,
        next_after: float | None,
        merge: Mapping[str, Any] | None = None,
        if_arguments: Any,
    ) -> bool:
        """Move a pending request past a deadline step: its ``due_at`` to ``next_after``
        seconds after it was asked (its ``created_at``; None: no step is left), and
        ``merge`` into its policy (an escalation's ``escalated_to``) under the row's lock,
        keeping what else the policy holds by then (an edit may have moved it). Only while
        it is pending and asks about ``if_arguments``. True if it changed."""

    def set_approval_status(
        self,
        run_id: str,
        call_id: str,
        status: str,
        *,
        if_status: Sequence[str] | None = None,
        if_arguments: Any = None,
        if_asked_again: bool | None = None,
        if_tool_digest: str | None = None,
    ) -> bool:
        """Set the request's status (with ``if_status``, only from those; with
        ``if_arguments``, only while the request asks about those arguments, with
        ``if_asked_again``, only while it is (True) or is not (False) a request asked again,
        and with ``if_tool_digest`` only while it is about that definition of its tool: a
        decision marks decided only the request it was about — its journal name says all
        three — never one a drive put in its place meanwhile, even about the same
        arguments); True if set. Any status but pending stamps ``decided_at`` and clears
        ``due_at``: a request that is not pending has no deadline step left. Only
        ``engine.lifecycle.move_request`` calls it."""

    def list_approval_requests(
        self, *, status: str | None = APPROVAL_PENDING, run_id: str | None = None
    ) -> Sequence[ApprovalRequestInfo]:
        """The requests of ``run_id``; without it, the site's (those of inert imports left
        out)."""

    def save_decision(self, decision: DecisionInfo) -> bool:
        """Insert unless this approver already decided this request; True if written.
        ``ApprovalArgumentsChanged`` (nothing written) when the request was asked again
        since ``decision.request`` was read (``changed_under``), and ``ApprovalOrphaned``
        (nothing written) when it is no longer pending (``closed_under``), both checked
        atomically with the insert."""

    def list_decisions(self, run_id: str, call_id: str) -> Sequence[DecisionInfo]: ...

    def log_action(self, action: ActionInfo) -> None: ...

    def list_actions(self, *, run_id: str | None = None) -> Sequence[ActionInfo]: ...

    # -- delegations (``engine.delegation``) -----------------------------------------------

    def save_delegation(
        self, delegation: DelegationInfo, *, log: ActionInfo
    ) -> tuple[DelegationInfo, bool]:
        """Record ``delegation`` (the store gives its ``id`` and ``created_at``) with its
        action-log row ``log``, whose ``target`` becomes ``delegation:<id>`` and whose
        payload gains ``"delegation": <id>``: both or neither. Unless a delegation of the
        same approver overlaps it (``DelegationInfo.overlaps``), checked atomically with the
        insert: then nothing is written. Returns the stored delegation, or the one in the
        way, and whether this call stored it."""
        ...

    def get_delegation(self, delegation_id: int) -> DelegationInfo | None: ...

    def revoke_delegation(self, delegation_id: int, by: str, *, log: ActionInfo) -> bool:
        """Mark the delegation revoked by ``by`` at the store's clock, with the action-log
        row ``log``, both or neither; only while it is not revoked. True if this call did."""
        ...

    def list_delegations(
        self,
        *,
        approver: str | None = None,
        deputy: str | None = None,
        in_force: bool = False,
    ) -> Sequence[DelegationInfo]:
        """The delegations of ``approver`` and/or to ``deputy``, newest start first; with
        ``in_force``, only those in force now by the store's clock (started, not ended, not
        revoked)."""
        ...

    def list_unfinished(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        statuses: Sequence[str] | None = None,
        lease_free: bool = False,
    ) -> Sequence[RunInfo]:
        """Agent runs without a terminal status, ordered by run id, after ``after``; never
        an inert import (evidence, not work).

        ``statuses`` narrows to those statuses; ``lease_free`` keeps only runs whose lease is
        absent or expired. The cost does not grow with the number of finished runs.
        """

    # -- limits (``engine.limits``) --------------------------------------------------------

    def claim_slot(self, key: str, holder: str, run_id: str, token: str, limit: int) -> bool:
        """Take a slot of ``key`` for ``holder`` (a run, or one call of it) under the run's
        lease ``token``, if fewer than ``limit`` live slots of ``key`` are held by others;
        True if held (taking it again is True). A slot is live while its run's lease has
        that token and is live; claims of one key are serialised."""
        ...

    def release_slot(self, key: str, holder: str, token: str) -> str | None:
        """Give back the slot ``holder`` took under the lease ``token`` (nothing if it is not
        held, or held under another token: a driver whose lease was taken over never gives
        back the slot its successor took for the same holder); and say which throttled run
        has waited longest on ``key`` (None: none), in the same round trip."""
        ...

    def take_permit(self, key: str, count: int, period: float) -> float:
        """One permit of a rate of ``count`` per ``period`` seconds (GCRA, bursts of
        ``count``), by the store's clock: 0.0 if granted, else the seconds until one frees
        (and nothing is taken)."""
        ...

    def throttle(self, info: ThrottleInfo) -> int:
        """Record that a run waits (one row per run, replaced); returns how many times in a
        row it has waited on the same key (``info.tries`` is ignored)."""
        ...

    def list_throttled(
        self,
        *,
        key: str | None = None,
        due: bool = False,
        run_id: str | None = None,
        limit: int = 100,
    ) -> Sequence[ThrottleInfo]:
        """Runs whose status is ``throttled``, oldest wait first: those waiting on ``key``,
        whose retry is ``due`` by the store's clock, the one ``run_id``, or all."""
        ...
