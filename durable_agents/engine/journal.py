"""The journal: named steps recorded at most once, over any ``Store``.

``Journal.do(run, name, fn)`` is the whole idea: if ``name`` is recorded, its record comes
back and ``fn`` is not called; otherwise ``fn`` runs once and its record is inserted, and
the record the journal holds afterwards is returned — another driver's, if it won the race.
A step whose ``fn`` raises records nothing.

Before its first write to a run the journal writes the ``@journal`` header naming the
format; every read checks it, so a run written in another format is refused before
anything is read from or written to it.

Scope: a record is made around a call, not inside it. If the process dies while ``do``'s
``fn`` runs, nothing is recorded and the next caller runs ``fn`` again. ``step`` is the safe
way to run user code: like a tool, it is **at most once** unless declared retry-safe — an
attempt claim (``attempt:step:<name>:<k>``) is written before ``fn`` runs, and a claim with
no value (a crash, or another caller in flight) raises ``OutcomeUnknown`` instead of running
``fn`` again.
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import lifecycle, names
from .errors import (
    ConfigError,
    JournalVersionError,
    OutcomeUnknown,
    ProtocolError,
    ToolOutcomeUnknown,
)
from .ports import FINISHED, KIND_JOURNAL, Entry, Store
from .records import (
    HEADER_NAME,
    JOURNAL_FORMAT,
    SUPPORTED_FORMATS,
    Record,
    encode,
    is_reserved_name,
    validate_run_id,
    validate_step_name,
)

_CHECKED_RUNS_LIMIT = 65536


def to_record(entry: Entry) -> Record:
    return Record(*entry)


def header() -> tuple[str, str]:
    """The ``@journal`` header every run's journal starts with: (name, data)."""
    return HEADER_NAME, encode({"kind": "header", "format": JOURNAL_FORMAT})


# The header's text as this version writes it: a journal that starts with it needs no decoding
# to be read (``Journal._check_header``).
_HEADER_TEXT = header()[1]


def now_ms() -> int:
    return int(time.time() * 1000)


class Journal:
    """Records and reads a run's steps. Safe to share between threads."""

    def __init__(self, store: Store) -> None:
        if store is None:
            raise ConfigError("Journal needs a store", code="config.store")
        self.store = store
        self._checked: OrderedDict[str, None] = OrderedDict()
        self._checked_lock = threading.Lock()

    # -- the header -------------------------------------------------------------------

    def _remember(self, run_id: str) -> None:
        with self._checked_lock:
            self._checked[run_id] = None
            self._checked.move_to_end(run_id)
            while len(self._checked) > _CHECKED_RUNS_LIMIT:
                self._checked.popitem(last=False)

    def _is_checked(self, run_id: str) -> bool:
        with self._checked_lock:
            return run_id in self._checked

    def forget(self, run_id: str) -> None:
        """Drop what this journal remembers of a run (after the run was deleted)."""
        with self._checked_lock:
            self._checked.pop(run_id, None)

    @staticmethod
    def _check_header(run_id: str, first: Entry | None) -> None:
        if first is None or (first.name == HEADER_NAME and first.data == _HEADER_TEXT):
            return
        if first.name != HEADER_NAME:
            raise JournalVersionError(
                f"run {run_id!r} has no journal header first (found {first.name!r}); it was "
                "not written by durable_agents and cannot be resumed",
                found="",
                supported=list(SUPPORTED_FORMATS),
            )
        fmt = to_record(first).get("format")
        if fmt not in SUPPORTED_FORMATS:
            raise JournalVersionError(
                f"run {run_id!r} is in journal format {fmt!r}; this version reads "
                f"{', '.join(SUPPORTED_FORMATS)}. Resume it with the version that wrote it",
                found=fmt,
                supported=list(SUPPORTED_FORMATS),
            )

    def check(self, run_id: str) -> None:
        """Refuse a run whose journal this version cannot read (once per process per run)."""
        if self._is_checked(run_id):
            return
        header = self.store.get(run_id, HEADER_NAME)
        if header is None:
            entries = self.store.load(run_id)
            if entries:
                self._check_header(run_id, entries[0])
            return  # an empty run: the first write adds the header
        self._check_header(run_id, header)
        self._remember(run_id)

    def _ensure_header(self, run_id: str, fence: str | None) -> None:
        if self._is_checked(run_id):
            return
        self.check(run_id)
        if self._is_checked(run_id):
            return
        if self.store.get_run(run_id) is None:
            # A run written only through the journal is a record, not work: finished, and
            # of a kind recovery never hands to a driver.
            self.store.create_run(lifecycle.created(FINISHED, run_id=run_id, kind=KIND_JOURNAL))
        entry, _ = self.store.insert(run_id, *header(), fence=fence)
        self._check_header(run_id, entry)
        self._remember(run_id)

    # -- writes -----------------------------------------------------------------------

    def write(
        self,
        run_id: str,
        name: str,
        body: dict[str, Any],
        *,
        fence: str | None = None,
        run_changes: dict[str, Any] | None = None,
        release: bool = False,
        sync: bool = True,
    ) -> tuple[Record, bool]:
        """Insert ``body`` as step ``name`` if absent; the engine's own write path.

        Returns the record the journal holds and whether this call stored it. ``release``
        (with ``fence``): the driver's last write, which also drops its lease if it stores.
        ``sync=False``: the record is safe to redo and may commit without waiting for the
        disk (``engine.durability``); a last write (``release``) always waits.
        """
        validate_run_id(run_id, derived=True)
        validate_step_name(name)
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            raise ProtocolError(
                f"record for step {name!r} must be a dict with a string 'kind'",
                code="protocol.record",
            )
        data = encode(body)  # before the header: bad input writes nothing at all
        self._ensure_header(run_id, fence)
        if release and fence is not None:
            entry, inserted = self.store.finish_run(
                run_id, name, data, fence=fence, run_changes=run_changes
            )
        else:
            # Passed only when it says something: a store without the dial still works.
            lag = {} if sync else {"sync": False}
            entry, inserted = self.store.insert(
                run_id, name, data, fence=fence, run_changes=run_changes, **lag
            )
        return to_record(entry), inserted

    def finish_with(
        self,
        run_id: str,
        records: Sequence[tuple[str, dict[str, Any]]],
        *,
        fence: str,
        run_changes: dict[str, Any] | None = None,
    ) -> list[Record] | None:
        """A driver's last records in one write with its row and its lease's release
        (``Store.finish_run_with``). None, having written nothing, if the first name is
        recorded or the lease is lost: the caller writes them one by one instead."""
        validate_run_id(run_id, derived=True)
        encoded = []
        for name, body in records:
            validate_step_name(name)
            if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
                raise ProtocolError(
                    f"record for step {name!r} must be a dict with a string 'kind'",
                    code="protocol.record",
                )
            encoded.append((name, encode(body)))  # all before any write
        self._ensure_header(run_id, fence)
        entries = self.store.finish_run_with(run_id, encoded, fence=fence, run_changes=run_changes)
        return None if entries is None else [to_record(e) for e in entries]

    def do(
        self,
        run_id: str,
        name: str,
        fn: Callable[[], dict[str, Any]],
        *,
        fence: str | None = None,
    ) -> Record:
        """Run ``fn`` as step ``name`` at most once and return the recorded record."""
        validate_run_id(run_id, derived=True)
        validate_step_name(name)
        if is_reserved_name(name):
            raise ConfigError(
                f"step name {name!r} is reserved for the engine (names starting with '@'); "
                "choose another name",
                code="config.step_name",
            )
        existing = self.get(run_id, name)
        if existing is not None:
            return existing
        body = fn()
        record, _ = self.write(run_id, name, body, fence=fence)
        return record

    def step(
        self,
        run_id: str,
        name: str,
        fn: Callable[[], Any],
        *,
        fence: str | None = None,
        retry_safe: bool = False,
    ) -> Any:
        """A user durable step: ``fn()``'s JSON value, recorded once as ``step:<name>``.

        At most once by default, like a tool with no safety flag: ``fn`` runs under an
        attempt claim, and a claim without a recorded value — the process died inside
        ``fn``, or another caller is running it — raises ``OutcomeUnknown`` (``halts`` names
        the op ``step:<name>``; record what happened with ``resolve_halt(run_id,
        "step:<name>", value, by=...)``). If ``fn`` raises, its claim is released (taken as
        not having happened, as a raising tool's call is) and the error propagates; raise
        ``ToolOutcomeUnknown`` instead to keep the claim. ``retry_safe=True`` declares that
        ``fn`` may run again (a read, an idempotent write): no claim, first value wins.
        """
        op = names.step(validate_step_name(name))
        if retry_safe:
            record = self.do(run_id, op, lambda: {"kind": "step", "value": fn()}, fence=fence)
            return record.get("value")
        existing = self.get(run_id, op)
        if existing is not None:
            return existing.get("value")
        k, live = self.attempt_state(run_id, op)
        if live is None:
            won, live = self.claim_attempt(
                run_id, names.attempt(op, k), fence=fence, extra={"step": name}
            )
            cause = "contended"
        else:
            won, cause = False, "crashed"
        if not won:
            done = self.get(run_id, op)  # the other caller may have just finished
            if done is not None:
                return done.get("value")
            raise OutcomeUnknown(
                f"step {name!r} of run {run_id!r} was started before (attempt {k}) and has no "
                "recorded value: it may have done its work, or may still be running in another "
                "caller. Check what really happened, then record it (the step's value, as "
                f"JSON) in the admin, with durable_agents.resolve_halt({run_id!r}, {op!r}, "
                "<value>, by=<username>) in Python, or with: python manage.py durable_agents "
                f"resolve {shlex.quote(run_id)} {shlex.quote(op)} --result '<json>' --by '<you>'",
                run_id=run_id,
                halts=[op],
                cause=cause,
                attempt=live.name,
            )
        try:
            value = fn()
        except ToolOutcomeUnknown:
            raise  # the claim stays: the next call halts until a person records the outcome
        except Exception:
            self.mark_not_started(run_id, names.not_started(op, k), live.get("claim"), fence=fence)
            raise
        record, _ = self.write(run_id, op, {"kind": "step", "value": value}, fence=fence)
        return record.get("value")

    def attempt_state(self, run_id: str, op: str) -> tuple[int, Record | None]:
        """The next attempt number of ``op`` (a call id or ``step:<name>``), and its live
        attempt marker if it has one: a claim with no not-started record."""
        k = 1
        while True:
            marker = self.get(run_id, names.attempt(op, k))
            if marker is None:
                return k, None
            if self.get(run_id, names.not_started(op, k)) is None:
                return k, marker
            k += 1

    def claim_attempt(
        self,
        run_id: str,
        name: str,
        *,
        fence: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> tuple[bool, Record]:
        """Write the attempt marker ``name`` as an exclusive claim with a fresh claim id.

        Won only if the stored marker carries this call's claim id: exactly one of any
        number of racing drivers wins, whatever their leases say.
        """
        claim = uuid.uuid4().hex
        body: dict[str, Any] = {"kind": "attempt", "claim": claim, "attempted_at": now_ms()}
        if extra:
            body.update(extra)
        record, _ = self.write(run_id, name, body, fence=fence)
        return record.get("claim") == claim, record

    def mark_not_started(
        self, run_id: str, name: str, claim: str, *, fence: str | None = None
    ) -> Record:
        """Record that the claimed attempt ``claim`` provably never called its effect."""
        record, _ = self.write(run_id, name, {"kind": "not-started", "claim": claim}, fence=fence)
        return record

    # -- reads ------------------------------------------------------------------------

    def get(self, run_id: str, name: str) -> Record | None:
        entry = self.store.get(run_id, name)
        if entry is None:
            return None
        self.check(run_id)
        return to_record(entry)

    def records(self, run_id: str) -> list[Record]:
        """Every record of the run in commit order, the header first, in one read."""
        entries = self.store.load(run_id)
        if entries:
            self._check_header(run_id, entries[0])
            self._remember(run_id)
        return [to_record(e) for e in entries]

    def history(self, run_id: str) -> list[Record]:
        """Deprecated name of ``records`` ("history" now means a run's steps only)."""
        warnings.warn(
            "Journal.history() is now Journal.records()", DeprecationWarning, stacklevel=2
        )
        return self.records(run_id)

    def open(
        self, run_id: str, *, fence: str | None = None, loaded: Sequence[Entry] | None = None
    ) -> RunLog:
        """Load a run once and keep a view of it for a driver (see ``RunLog``); ``loaded``:
        its entries as already read (``Store.start_or_load``), so not read again."""
        return RunLog(self, run_id, fence=fence, loaded=loaded)


class RunLog:
    """A driver's view of one run: loaded in one read, then kept current by its own writes.

    Writes go through the store's insert-if-absent, so a name another writer recorded
    meanwhile comes back as theirs; ``refresh`` reads entries added by others.
    """

    def __init__(
        self,
        journal: Journal,
        run_id: str,
        *,
        fence: str | None = None,
        entries: Sequence[Entry] | None = None,
        loaded: Sequence[Entry] | None = None,
    ) -> None:
        self.journal = journal
        self.run_id = run_id
        self.fence = fence
        self._records: dict[str, Record] = {}
        self._order: list[Record] = []
        # The first read's entries by name, made Records one by one as they are asked for: a
        # finished run's resume looks up three names in a journal of thousands. Every path
        # that needs them all (order, length, a later write) makes the rest first.
        self._unread: dict[str, Entry] | None = None
        self._first: Sequence[Entry] = ()
        if loaded is not None:
            self._first_read(loaded)
            return
        if entries is None:
            self.refresh()
            return
        # A run this driver just created with these entries (``Store.start_run``): all
        # there is, nothing to read.
        journal._check_header(run_id, entries[0] if entries else None)
        journal._remember(run_id)
        for entry in entries:
            self._add(to_record(entry))

    def refresh(self, *, since_last: bool = False) -> None:
        """Read entries added by others. A full read by default: an entry another writer
        committed late may carry a lower seq than one already seen (sequences are drawn at
        insert, not at commit). ``since_last`` reads only later entries: right after taking
        the lease that is complete for fenced writes, since a fenced insert holds a share
        lock on the lease row until it commits, so the lease could not be taken before."""
        self._read_all()
        after = max((r.seq for r in self._order), default=0) if since_last else 0
        entries = self.journal.store.load(self.run_id, after=after)
        if not entries:
            return
        if not self._order:  # the first read: one batch, no duplicates possible
            self._first_read(entries)
            return
        for entry in entries:
            self._add(to_record(entry))

    def _first_read(self, entries: Sequence[Entry]) -> None:
        """Take the first read of a journal (empty: nothing yet, as a read finding none)."""
        if not entries:
            return
        self.journal._check_header(self.run_id, entries[0])
        self.journal._remember(self.run_id)
        self._first = entries
        self._unread = {e.name: e for e in entries}

    def _read_all(self) -> None:
        """Make Records of the first read's entries not asked for yet, in journal order."""
        if self._unread is None:
            return
        made = self._records
        self._order = [made.get(e.name) or Record(*e) for e in self._first]
        self._records = {r.name: r for r in self._order}
        self._unread, self._first = None, ()

    def _add(self, record: Record) -> None:
        self._read_all()
        if record.name in self._records:
            return
        self._records[record.name] = record
        self._order.append(record)

    def __iter__(self) -> Iterator[Record]:
        self._read_all()
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._first) if self._unread is not None else len(self._order)

    def get(self, name: str) -> Record | None:
        record = self._records.get(name)
        if record is None and self._unread is not None:
            entry = self._unread.get(name)
            if entry is not None:
                record = self._records[name] = to_record(entry)
        return record

    def has(self, name: str) -> bool:
        return name in self._records or (self._unread is not None and name in self._unread)

    def reread(self, name: str) -> Record | None:
        """Read one name from the store (for entries other writers may have added)."""
        record = self.get(name)
        if record is not None:
            return record
        record = self.journal.get(self.run_id, name)
        if record is not None:
            self._add(record)
        return record

    def write(
        self,
        name: str,
        body: dict[str, Any],
        run_changes: dict[str, Any] | None = None,
        *,
        release: bool = False,
        sync: bool = True,
    ) -> tuple[Record, bool]:
        existing = self.get(name)
        if existing is not None:
            return existing, False
        record, inserted = self.journal.write(
            self.run_id,
            name,
            body,
            fence=self.fence,
            run_changes=run_changes,
            release=release,
            sync=sync,
        )
        self._add(record)
        return record, inserted

    def finish_with(
        self, records: Sequence[tuple[str, dict[str, Any]]], run_changes: dict[str, Any]
    ) -> list[Record] | None:
        """The driver's last records and its lease's release in one write (see
        ``Journal.finish_with``); None, having written nothing, when one is recorded."""
        if self.fence is None or any(self.has(name) for name, _ in records):
            return None
        written = self.journal.finish_with(
            self.run_id, records, fence=self.fence, run_changes=run_changes
        )
        for record in written or ():
            self._add(record)
        return written

    def claim_attempt(self, name: str, extra: dict[str, Any] | None = None) -> tuple[bool, Record]:
        existing = self.get(name)
        if existing is not None:
            return False, existing
        won, record = self.journal.claim_attempt(self.run_id, name, fence=self.fence, extra=extra)
        self._add(record)
        return won, record
