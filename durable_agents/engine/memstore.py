"""InMemoryStore: the Store port in one process, for tests and local experiments.

It is a product, not a mock: it passes the same conformance suite as the database stores
(first writer wins under threads, commit order, byte fidelity, leases, fencing). What it
cannot do is coordinate processes: everything lives in this process's memory.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from . import retention
from .audit import ACTION_NAME, Link, action_content, action_hash, chain_hash
from .deadlines import first_after
from .errors import ApprovalNotFound, ConfigError, LeaseLost
from .limits import continued
from .ports import (
    APPROVAL_PENDING,
    HALT_OPEN,
    HALT_ORPHANED,
    HALT_RESOLVED,
    KIND_AGENT,
    RUN_FIELDS,
    TERMINAL_STATUSES,
    THROTTLED,
    Acquired,
    ActionInfo,
    ApprovalRequestInfo,
    DecisionInfo,
    DelegationInfo,
    Entry,
    Existing,
    HaltInfo,
    LeaseInfo,
    RunInfo,
    ThrottleInfo,
    asked_again,
    changed_under,
    closed_request,
    closed_under,
    same_request,
)
from .records import encode
from .spent import DELETED, PRUNED, refusal


@functools.lru_cache(maxsize=256)
def _dt(ts: float) -> datetime:
    # (a virtual clock reads the same instant many times over; datetimes are immutable)
    return datetime.fromtimestamp(ts, tz=UTC)


def _action_fields(action: ActionInfo) -> dict[str, Any]:
    return {
        "action": action.action,
        "actor": action.actor,
        "actor_id": action.actor_id,
        "channel": action.channel,
        "payload": dict(action.payload),
        "run_id": action.run_id,
        "target": action.target,
    }


class InMemoryStore:
    """A thread-safe Store kept in memory. ``clock`` stands in for the database clock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._runs: dict[str, RunInfo] = {}
        self._spent: dict[str, str] = {}  # run id -> why (engine.spent)
        self._tombstones: dict[str, dict[str, Any]] = {}  # a pruned run -> what it was
        self._entries: dict[str, dict[str, Entry]] = {}
        self._ordered: dict[str, list[Entry]] = {}
        self._leases: dict[str, tuple[str, str, float, float]] = {}  # holder, token, exp, renewed
        self._seq = 0
        self._halts: dict[tuple[str, str, str], HaltInfo] = {}  # run, op, attempt
        self._requests: dict[tuple[str, str], ApprovalRequestInfo] = {}
        self._decisions: dict[tuple[str, str], list[DecisionInfo]] = {}
        self._actions: list[ActionInfo] = []
        self._delegations: list[DelegationInfo] = []  # in the order they were recorded
        # The audit chains (engine/audit.py): each record's hash by (run, name), each run's
        # head, and the action log's hashes beside its rows.
        self._hashes: dict[tuple[str, str], str] = {}
        self._heads: dict[str, str] = {}
        self._action_hashes: list[str] = []
        # Limits (engine.limits): slots by key and holder (run, lease token), GCRA buckets'
        # theoretical arrival times, and one throttle row per waiting run.
        self._slots: dict[str, dict[str, tuple[str, str]]] = {}
        self._buckets: dict[str, float] = {}
        self._throttles: dict[str, ThrottleInfo] = {}
        # ``list_unfinished``'s copy of each row it listed: (the row, lease_expired, the copy).
        # Rows are frozen and replaced on every change, so a copy serves until then.
        self._listed: dict[str, tuple[RunInfo, bool, RunInfo]] = {}

    def now(self) -> datetime:
        """This store's clock (what stands in for the database clock)."""
        return _dt(self._clock())

    # -- runs -------------------------------------------------------------------------

    def create_run(self, run: RunInfo) -> bool:
        with self._lock:
            if run.run_id in self._runs:
                return False
            if run.run_id in self._spent:
                raise refusal(run.run_id, self._spent[run.run_id])
            now = _dt(self._clock())
            finished = now if run.status in TERMINAL_STATUSES else None
            self._runs[run.run_id] = replace(
                run, created_at=now, updated_at=now, finished_at=finished, dispatched_at=None
            )
            return True

    def run_held(self, run_id: str) -> bool:
        return self.get_run(run_id) is not None

    def get_run(self, run_id: str) -> RunInfo | None:
        with self._lock:
            return self._runs.get(run_id)

    def mark_dispatched(self, run_id: str, *, seen: datetime | None) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return False
            if run.dispatched_at is not None and (seen is None or run.dispatched_at > seen):
                return False
            self._runs[run_id] = replace(run, dispatched_at=_dt(self._clock()))
            return True

    def update_run(
        self,
        run_id: str,
        changes: Mapping[str, Any],
        *,
        fence: str | None = None,
        if_status: Sequence[str] | None = None,
    ) -> bool:
        unknown = set(changes) - RUN_FIELDS
        if unknown:
            raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        with self._lock:
            if fence is not None and not self._holds(run_id, fence):
                raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")
            run = self._runs.get(run_id)
            if run is None or (if_status is not None and run.status not in if_status):
                return False
            now = _dt(self._clock())
            finished_at = run.finished_at
            if "status" in changes:
                finished_at = now if changes["status"] in TERMINAL_STATUSES else None
            self._runs[run_id] = replace(run, **changes, updated_at=now, finished_at=finished_at)
            return True

    def delete_run(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._runs:
                self._spent.setdefault(run_id, DELETED)
            self._drop(run_id)

    def prune(self, *, finished_before: datetime, by: str) -> retention.Pruned:
        """Delete, in one write, every tree of runs ``engine.retention`` lets go (each run of
        it ended before ``finished_before``, by this store's clock), as ``retention.prune``
        does on the database: ids spent as pruned, a tombstone each (``tombstone``), one
        action-log row. Nothing is exported here: export the runs first to keep them. A
        tree with a lease row on any of its runs is busy, as there."""
        if finished_before.tzinfo is None:
            raise ConfigError("the cutoff must carry a time zone", code="prune.cutoff")
        with self._lock:
            now = _dt(self._clock())
            if finished_before > now:
                raise ConfigError(
                    f"the cutoff {finished_before.isoformat()} is in the future: prune "
                    "deletes runs finished before it, so it would delete runs that have not "
                    "aged at all",
                    code="prune.cutoff",
                )
            report = retention.Pruned(finished_before)
            # Judged against the runs as they stood before this prune deleted any, as one
            # batch of the database's prune is: a fork's source goes the next time.
            runs = list(self._runs.values())
            candidates = [
                r for r in runs if retention.is_candidate(retention.fields_of(r), finished_before)
            ]
            roots = sorted(candidates, key=lambda r: (r.finished_at or now, r.run_id))
            for root in roots:
                tree = [root, *(r for r in runs if r.root_run_id == root.run_id and r is not root)]
                ids = [r.run_id for r in tree]
                why = retention.why_kept(
                    [retention.fields_of(r) for r in tree],
                    finished_before,
                    retention.referrers(runs, ids),
                )
                if not why and any(rid in self._leases for rid in ids):
                    why = retention.KEPT_BUSY
                if why:
                    report.kept[root.run_id] = why
                    continue
                for run in tree:
                    records = self._ordered.get(run.run_id, [])
                    self._tombstones[run.run_id] = {
                        "agent": run.agent,
                        "status": run.status,
                        "root_run_id": run.root_run_id,
                        "finished_at": run.finished_at,
                        "head": self._heads.get(run.run_id),
                        "records": len(records),
                        "unchained": sum(
                            1 for e in records if (run.run_id, e.name) not in self._hashes
                        ),
                        "pruned_at": now,
                        "pruned_by": by,
                    }
                    self._spent.setdefault(run.run_id, PRUNED)
                    self._drop(run.run_id)
                report.pruned.extend(ids)
            if report.pruned:
                self.log_action(
                    ActionInfo(
                        by,
                        "prune",
                        "",
                        payload={
                            "finished_before": finished_before.isoformat(),
                            "runs": list(report.pruned),
                            "trees": len(roots) - len(report.kept),
                        },
                        channel="python",
                    )
                )
            return report

    def tombstone(self, run_id: str) -> dict[str, Any] | None:
        """What a pruned run was (its agent, status, head, record count, who pruned it
        when), or None if ``prune`` never deleted it."""
        with self._lock:
            stone = self._tombstones.get(run_id)
            return dict(stone) if stone is not None else None

    def _drop(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            self._entries.pop(run_id, None)
            for entry in self._ordered.pop(run_id, ()):
                self._hashes.pop((run_id, entry.name), None)
            self._heads.pop(run_id, None)
            self._leases.pop(run_id, None)
            self._throttles.pop(run_id, None)
            # Its approval requests, their decisions and its halts go with it, as the
            # database's rows do (they hang off the run's row).
            for key in [k for k in self._requests if k[0] == run_id]:
                del self._requests[key]
                self._decisions.pop(key, None)
            for halt in [k for k in self._halts if k[0] == run_id]:
                del self._halts[halt]
            for slots in self._slots.values():
                for holder in [h for h, (rid, _) in slots.items() if rid == run_id]:
                    del slots[holder]

    def _inert(self, run_id: str) -> bool:
        run = self._runs.get(run_id)
        return run is not None and run.inert

    def _require_run(self, run_id: str, doing: str) -> None:
        if run_id not in self._runs:
            raise ConfigError(
                f"run {run_id!r} does not exist; create it before {doing}",
                code="config.run_missing",
            )

    # -- journal ----------------------------------------------------------------------

    def insert(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str | None = None,
        run_changes: Mapping[str, Any] | None = None,
        sync: bool = True,  # the durability dial: nothing here is on a disk either way
    ) -> tuple[Entry, bool]:
        if run_changes:
            unknown = set(run_changes) - RUN_FIELDS
            if unknown:  # before the record: both are stored, or neither
                raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        with self._lock:
            entry, inserted = self._insert(run_id, name, data, fence)
            if inserted and run_changes:
                self.update_run(run_id, run_changes, fence=fence)
            return entry, inserted

    def _insert(self, run_id: str, name: str, data: str, fence: str | None) -> tuple[Entry, bool]:
        with self._lock:
            self._require_run(run_id, "writing to its journal")
            entries = self._entries.setdefault(run_id, {})
            existing = entries.get(name)
            if fence is not None and not self._holds(run_id, fence):
                raise LeaseLost(
                    f"lease on run {run_id!r} is no longer held by this driver; "
                    f"step {name!r} was not recorded"
                )
            if existing is not None:
                return existing, False
            self._seq += 1
            entry = Entry(run_id, name, self._seq, str(data), _dt(self._clock()))
            entries[name] = entry
            self._ordered.setdefault(run_id, []).append(entry)
            head = self._hashes[(run_id, name)] = chain_hash(
                self._heads.get(run_id), name, entry.data
            )
            self._heads[run_id] = head
            return entry, True

    def start_run(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> list[Entry] | None:
        if not records:
            raise ConfigError("start_run needs at least one record", code="config.records")
        with self._lock:
            if not self.create_run(run):
                return None
            if token is not None:
                self.acquire_lease(run.run_id, str(holder), token, float(ttl or 0))
            return [self._insert(run.run_id, n, d, token)[0] for n, d in records]

    def start_or_load(
        self,
        run: RunInfo,
        *,
        holder: str | None,
        token: str | None,
        ttl: float | None,
        records: Sequence[tuple[str, str]],
    ) -> tuple[list[Entry] | None, Existing | None]:
        with self._lock:
            entries = self.start_run(run, holder=holder, token=token, ttl=ttl, records=records)
            if entries is not None:
                return entries, None
            row = self._runs[run.run_id]
            existing = Existing(
                list(self.load(run.run_id)), row.status, row.answer, row.turns, row.imported
            )
            return None, existing

    def finish_run(
        self,
        run_id: str,
        name: str,
        data: str,
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> tuple[Entry, bool]:
        with self._lock:
            entry, inserted = self.insert(run_id, name, data, fence=fence, run_changes=run_changes)
            if inserted:
                self.release_lease(run_id, fence)
            return entry, inserted

    def finish_run_with(
        self,
        run_id: str,
        records: Sequence[tuple[str, str]],
        *,
        fence: str,
        run_changes: Mapping[str, Any] | None = None,
    ) -> list[Entry] | None:
        if not records:
            raise ConfigError("finish_run_with needs at least one record", code="config.records")
        if run_changes:
            unknown = set(run_changes) - RUN_FIELDS
            if unknown:
                raise ConfigError(f"unknown run fields {sorted(unknown)}", code="config.run_field")
        with self._lock:
            self._require_run(run_id, "writing to its journal")
            entries = self._entries.get(run_id, {})
            if not self._holds(run_id, fence) or any(n in entries for n, _ in records):
                return None
            written = [self._insert(run_id, n, d, fence)[0] for n, d in records]
            if run_changes:
                self.update_run(run_id, run_changes, fence=fence)
            self.release_lease(run_id, fence)
            return written

    def get(self, run_id: str, name: str) -> Entry | None:
        with self._lock:
            return self._entries.get(run_id, {}).get(name)

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]:
        with self._lock:
            return [e for e in self._ordered.get(run_id, ()) if e.seq > after]

    def find(self, run_ids: Sequence[str], names: Sequence[str]) -> list[Entry]:
        """The entries called any of ``names`` in any of ``run_ids``' journals, in one read."""
        with self._lock:
            return [
                entry
                for run_id in run_ids
                for name in names
                if (entry := self._entries.get(run_id, {}).get(name)) is not None
            ]

    def journal_heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The seq of each run's last record (runs without one are left out)."""
        with self._lock:
            return {r: entries[-1].seq for r in run_ids if (entries := self._ordered.get(r))}

    # -- leases -----------------------------------------------------------------------

    def _check_fence(self, run_id: str, fence: str | None) -> None:
        """Raise ``LeaseLost`` if ``fence`` no longer holds the (existing) run; call locked."""
        if fence is not None and run_id in self._runs and not self._holds(run_id, fence):
            raise LeaseLost(f"lease on run {run_id!r} is no longer held by this driver")

    def _holds(self, run_id: str, token: str) -> bool:
        lease = self._leases.get(run_id)
        return lease is not None and lease[1] == token and lease[2] > self._clock()

    def acquire_lease(self, run_id: str, holder: str, token: str, ttl: float) -> Acquired | None:
        with self._lock:
            self._require_run(run_id, "leasing it")
            if self._runs[run_id].inert:
                return None  # an inert import is never driven
            now = self._clock()
            lease = self._leases.get(run_id)
            if lease is not None and lease[2] > now and lease[1] != token:
                return None
            self._leases[run_id] = (holder, token, now + ttl, now)
            if lease is None or lease[1] == token:
                return Acquired()
            old_holder, old_token, expires, renewed = lease
            return Acquired(
                LeaseInfo(run_id, old_holder, old_token, _dt(expires), _dt(renewed), False)
            )

    def renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        with self._lock:
            if not self._holds(run_id, token):
                return False
            holder = self._leases[run_id][0]
            now = self._clock()
            self._leases[run_id] = (holder, token, now + ttl, now)
            return True

    def release_lease(self, run_id: str, token: str) -> None:
        with self._lock:
            lease = self._leases.get(run_id)
            if lease is not None and lease[1] == token:
                del self._leases[run_id]

    def get_lease(self, run_id: str) -> LeaseInfo | None:
        with self._lock:
            lease = self._leases.get(run_id)
            if lease is None:
                return None
            holder, token, expires, renewed = lease
            return LeaseInfo(
                run_id, holder, token, _dt(expires), _dt(renewed), expires > self._clock()
            )

    # -- halts ------------------------------------------------------------------------

    def save_halt(self, halt: HaltInfo, *, fence: str | None = None) -> bool:
        with self._lock:
            self._check_fence(halt.run_id, fence)
            key = (halt.run_id, halt.op_id, halt.attempt)
            if key in self._halts:
                return False
            self._halts[key] = replace(
                halt,
                status=HALT_OPEN,
                resolution=None,
                resolved_by=None,
                resolved_at=None,
                created_at=_dt(self._clock()),
            )
            return True

    def resolve_halt_row(
        self, run_id: str, op_id: str, resolution: Mapping[str, Any], by: str | None
    ) -> None:
        with self._lock:
            for key, halt in self._halts.items():
                if key[:2] == (run_id, op_id) and halt.status == HALT_OPEN:
                    self._halts[key] = replace(
                        halt,
                        status=HALT_RESOLVED,
                        resolution=dict(resolution),
                        resolved_by=by,
                        resolved_at=_dt(self._clock()),
                    )

    def orphan_halts(self, run_id: str) -> int:
        with self._lock:
            open_ = [k for k, h in self._halts.items() if k[0] == run_id and h.status == HALT_OPEN]
            for key in open_:
                self._halts[key] = replace(
                    self._halts[key], status=HALT_ORPHANED, resolved_at=_dt(self._clock())
                )
            return len(open_)

    def list_halts(
        self, *, run_id: str | None = None, status: str | None = HALT_OPEN
    ) -> Sequence[HaltInfo]:
        with self._lock:
            return [
                h
                for (rid, _, _), h in sorted(self._halts.items())
                if (rid == run_id if run_id is not None else not self._inert(rid))
                and (status is None or h.status == status)
            ]

    # -- approvals and history --------------------------------------------------------

    def save_approval_request(
        self, request: ApprovalRequestInfo, *, fence: str | None = None
    ) -> bool:
        with self._lock:
            self._check_fence(request.run_id, fence)
            key = (request.run_id, request.call_id)
            existing = self._requests.get(key)
            if existing is not None and same_request(existing, request):
                return False
            now = self._clock()
            first = first_after(request.policy)
            self._requests[key] = replace(
                request,
                created_at=_dt(now),
                decided_at=None,
                due_at=_dt(now + first) if first is not None else None,
            )
            self._decisions.pop(key, None)  # decisions belonged to the earlier incarnation
            return True

    def get_approval_request(self, run_id: str, call_id: str) -> ApprovalRequestInfo | None:
        with self._lock:
            return self._requests.get((run_id, call_id))

    def update_approval_request(
        self, run_id: str, call_id: str, *, policy: Mapping[str, Any], if_arguments: Any
    ) -> bool:
        with self._lock:
            request = self._requests.get((run_id, call_id))
            if request is None or request.status != APPROVAL_PENDING:
                return False
            if encode(request.arguments) != encode(if_arguments):
                return False
            self._requests[(run_id, call_id)] = replace(request, policy=dict(policy))
            return True

    def list_due_approval_requests(self, *, limit: int = 100) -> Sequence[ApprovalRequestInfo]:
        with self._lock:
            now = _dt(self._clock())
            due = [
                r
                for r in self._requests.values()
                if r.status == APPROVAL_PENDING and r.due_at is not None and r.due_at <= now
            ]
            return sorted(due, key=lambda r: (r.due_at, r.run_id, r.call_id))[:limit]

    def advance_deadline(
        self,
        run_id: str,
        call_id: str,
        *,
        next_after: float | None,
        merge: Mapping[str, Any] | None = None,
        if_arguments: Any,
    ) -> bool:
        with self._lock:
            request = self._requests.get((run_id, call_id))
            if request is None or request.status != APPROVAL_PENDING:
                return False
            if encode(request.arguments) != encode(if_arguments):
                return False
            asked = request.created_at or _dt(self._clock())
            due = None if next_after is None else asked + timedelta(seconds=next_after)
            policy = {**request.policy, **(merge or {})}
            self._requests[(run_id, call_id)] = replace(request, policy=policy, due_at=due)
            return True

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
        with self._lock:
            request = self._requests.get((run_id, call_id))
            if request is None or (if_status is not None and request.status not in if_status):
                return False
            if if_tool_digest is not None and request.tool_digest != if_tool_digest:
                return False
            if if_arguments is not None and encode(request.arguments) != encode(if_arguments):
                return False
            again = request.previous_arguments is not None
            if if_asked_again is not None and again != if_asked_again:
                return False
            decided = None if status == APPROVAL_PENDING else _dt(self._clock())
            due = request.due_at if status == APPROVAL_PENDING else None
            self._requests[(run_id, call_id)] = replace(
                request, status=status, decided_at=decided, due_at=due
            )
            return True

    def list_approval_requests(
        self, *, status: str | None = APPROVAL_PENDING, run_id: str | None = None
    ) -> Sequence[ApprovalRequestInfo]:
        with self._lock:
            requests = self._requests
            if run_id is not None:
                keys = sorted(key for key in requests if key[0] == run_id)
            else:
                keys = [key for key in sorted(requests) if not self._inert(key[0])]
            return [
                requests[key] for key in keys if status is None or requests[key].status == status
            ]

    def save_decision(self, decision: DecisionInfo) -> bool:
        with self._lock:
            current = self._requests.get((decision.run_id, decision.call_id))
            if current is None:
                # As the database store: a vote is a row of its request (its run deleted or
                # pruned meanwhile, there is none).
                raise ApprovalNotFound(
                    f"no approval request for call {decision.call_id!r} of run {decision.run_id!r}"
                )
            if changed_under(decision, current):
                raise asked_again(decision, current)
            decisions = self._decisions.setdefault((decision.run_id, decision.call_id), [])
            if any(d.approver == decision.approver for d in decisions):
                return False
            if closed_under(decision, current):
                raise closed_request(decision, current)
            decisions.append(replace(decision, created_at=_dt(self._clock())))
            return True

    def list_decisions(self, run_id: str, call_id: str) -> Sequence[DecisionInfo]:
        with self._lock:
            return list(self._decisions.get((run_id, call_id), ()))

    def log_action(self, action: ActionInfo) -> None:
        with self._lock:
            prev = self._action_hashes[-1] if self._action_hashes else None
            self._action_hashes.append(action_hash(prev, _action_fields(action)))
            self._actions.append(replace(action, created_at=_dt(self._clock())))

    def list_actions(self, *, run_id: str | None = None) -> Sequence[ActionInfo]:
        with self._lock:
            return [a for a in self._actions if run_id is None or a.run_id == run_id]

    # -- delegations ------------------------------------------------------------------

    def save_delegation(
        self, delegation: DelegationInfo, *, log: ActionInfo
    ) -> tuple[DelegationInfo, bool]:
        with self._lock:
            for standing in self._delegations:
                if standing.overlaps(delegation):
                    return standing, False
            number = len(self._delegations) + 1
            stored = replace(delegation, id=number, created_at=_dt(self._clock()))
            self._delegations.append(stored)
            payload = {**log.payload, "delegation": number}
            self.log_action(replace(log, target=f"delegation:{number}", payload=payload))
            return stored, True

    def get_delegation(self, delegation_id: int) -> DelegationInfo | None:
        with self._lock:
            found = [d for d in self._delegations if d.id == delegation_id]
            return found[0] if found else None

    def revoke_delegation(self, delegation_id: int, by: str, *, log: ActionInfo) -> bool:
        with self._lock:
            for i, d in enumerate(self._delegations):
                if d.id == delegation_id and d.revoked_at is None:
                    now = _dt(self._clock())
                    self._delegations[i] = replace(d, revoked_at=now, revoked_by=by)
                    self.log_action(log)
                    return True
            return False

    def list_delegations(
        self,
        *,
        approver: str | None = None,
        deputy: str | None = None,
        in_force: bool = False,
    ) -> Sequence[DelegationInfo]:
        with self._lock:
            now = _dt(self._clock())
            found = [
                d
                for d in self._delegations
                if (approver is None or d.approver == approver)
                and (deputy is None or d.deputy == deputy)
                and (not in_force or d.in_force(now))
            ]
        return sorted(found, key=lambda d: (d.starts_at, d.id or 0), reverse=True)

    # -- audit chains (engine/audit.py) -------------------------------------------------

    def chain(self, run_id: str) -> Sequence[Link]:
        with self._lock:
            return [
                Link(e.seq, e.name, e.data, self._hashes.get((run_id, e.name)))
                for e in self._ordered.get(run_id, ())
            ]

    def action_chain(self) -> Sequence[Link]:
        with self._lock:
            return [
                Link(i, ACTION_NAME, action_content(_action_fields(a)), h)
                for i, (a, h) in enumerate(zip(self._actions, self._action_hashes, strict=True), 1)
            ]

    # -- listing ----------------------------------------------------------------------

    def list_unfinished(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        statuses: Sequence[str] | None = None,
        lease_free: bool = False,
    ) -> Sequence[RunInfo]:
        with self._lock:
            now = self._clock()
            found: list[RunInfo] = []
            for run_id in sorted(self._runs):
                run = self._runs[run_id]
                if run.status in TERMINAL_STATUSES or (after is not None and run_id <= after):
                    continue
                if run.kind != KIND_AGENT or run.inert:
                    continue
                if statuses is not None and run.status not in statuses:
                    continue
                lease = self._leases.get(run_id)
                free = lease is None or lease[2] <= now
                if lease_free and not free:
                    continue
                listed = self._listed.get(run_id)
                if listed is None or listed[0] is not run or listed[1] != free:
                    listed = self._listed[run_id] = (run, free, replace(run, lease_expired=free))
                found.append(listed[2])
                if len(found) >= limit:
                    break
            return found

    # -- limits ---------------------------------------------------------------------------

    def claim_slot(self, key: str, holder: str, run_id: str, token: str, limit: int) -> bool:
        with self._lock:
            slots = self._slots.setdefault(key, {})
            for other, (rid, tok) in list(slots.items()):
                if not self._holds(rid, tok):
                    del slots[other]  # its lease is gone: so is the slot
            if not self._holds(run_id, token):
                return False
            if holder not in slots and len(slots) >= limit:
                return False
            slots[holder] = (run_id, token)
            return True

    def release_slot(self, key: str, holder: str, token: str) -> str | None:
        with self._lock:
            slots = self._slots.get(key, {})
            if holder in slots and slots[holder][1] == token:
                del slots[holder]
            waiting = self.list_throttled(key=key, limit=1)
            return waiting[0].run_id if waiting else None

    def take_permit(self, key: str, count: int, period: float) -> float:
        with self._lock:
            now = self._clock()
            tat = max(self._buckets.get(key, now), now) + period / count
            if tat - now > period + 1e-9:
                return tat - now - period
            self._buckets[key] = tat
            return 0.0

    def throttle(self, info: ThrottleInfo) -> int:
        with self._lock:
            old = self._throttles.get(info.run_id)
            tries, since = continued(old, info)
            self._throttles[info.run_id] = replace(info, tries=tries, since=since)
            return tries

    def list_throttled(
        self,
        *,
        key: str | None = None,
        due: bool = False,
        run_id: str | None = None,
        limit: int = 100,
    ) -> Sequence[ThrottleInfo]:
        with self._lock:
            now = self.now()
            found = [
                t
                for t in self._throttles.values()
                if (run := self._runs.get(t.run_id)) is not None
                and run.status == THROTTLED
                and (key is None or t.key == key)
                and (run_id is None or t.run_id == run_id)
                and (not due or t.retry_at <= now)
            ]
            return sorted(found, key=lambda t: (t.since, t.run_id))[:limit]
