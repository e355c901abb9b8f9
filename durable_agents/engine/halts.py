"""Halts: a side effect whose outcome is unknown stops its run until a person (or a
reconciler) records what really happened.

``resolve_halt`` records the verified outcome as the call's result, marked ``reconciled``
with its evidence, and hands the run back to a driver. It refuses while a driver holds the
run's live lease (``HaltInFlight``: that driver may be running the effect right now), before
``min_age`` has passed since the attempt (``HaltTooYoung``: give the provider's records time
to settle), and when another outcome already stands (``HaltAlreadyResolved``). The first
outcome wins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import identity, runtime
from .errors import ConfigError, RunBusy
from .journal import Journal
from .leases import HeldLease
from .ports import QUEUED, Store
from .records import Record, encode, refuse_nul


class HaltError(ConfigError):
    code = "halt.invalid"


class HaltInFlight(HaltError):
    code = "halt.in_flight"


class HaltTooYoung(HaltError):
    code = "halt.too_young"


class HaltAlreadyResolved(HaltError):
    code = "halt.already_resolved"


class NoLiveAttempt(HaltError):
    code = "halt.no_live_attempt"


@dataclass(frozen=True)
class LiveAttempt:
    marker: Record
    tool_name: str
    age_seconds: float


def live_attempt(journal: Journal, run_id: str, call_id: str) -> LiveAttempt | None:
    """The call's claimed attempt that has neither a result nor a not-started record."""
    live = None
    k = 1
    while (marker := journal.get(run_id, f"attempt:{call_id}:{k}")) is not None:
        if journal.get(run_id, f"not-started:{call_id}:{k}") is None:
            live = marker
        k += 1
    if live is None:
        return None
    store_now = getattr(journal.store, "now", None)
    if store_now is not None and live.created_at is not None:
        # Both ends by the database's clock, like leases: no worker clock is trusted.
        age = (store_now() - live.created_at).total_seconds()
    else:
        age = time.time() - (live.get("attempted_at") or 0) / 1000
    return LiveAttempt(live, str(live.get("tool") or ""), age)


def resolve_halt(
    run_id: str,
    call_id: str,
    result: Any,
    *,
    is_error: bool = False,
    evidence: Any = None,
    by: Any,
    min_age: float | None = None,
    store: Store | None = None,
) -> Record:
    """Record what really happened to a halted call, and continue the run. ``by`` (a user
    object, a username or an ``identity.Actor``) must name an active user holding
    ``resolve_halt``."""
    actor = identity.resolve(by)
    identity.require(actor, identity.RESOLVE_HALT, "resolve a halt")
    by = actor.username
    if not isinstance(is_error, bool):
        raise HaltError("is_error must be True or False")
    refuse_nul({"result": result, "evidence": evidence}, "the resolution")  # before any write
    store = store or runtime.store()
    journal = Journal(store)
    if store.get_run(run_id) is None:
        raise HaltError(f"no run {run_id!r}", code="run.not_found")
    name = f"tool:{call_id}"
    standing = journal.get(run_id, name)
    if standing is not None:
        return _same_or_refuse(standing, result, is_error)
    attempt = live_attempt(journal, run_id, call_id)
    if attempt is None:
        raise NoLiveAttempt(
            f"call {call_id!r} of run {run_id!r} has no attempt whose outcome is unknown; "
            "there is nothing to resolve"
        )
    if min_age is not None and attempt.age_seconds < min_age:
        raise HaltTooYoung(
            f"the attempt of call {call_id!r} is {attempt.age_seconds:.0f}s old; wait until "
            f"it is {min_age:.0f}s old so the provider's records have settled",
            age=attempt.age_seconds,
            min_age=min_age,
        )
    try:
        lease = HeldLease(store, run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        raise HaltInFlight(
            f"a driver holds run {run_id!r} right now and may be running call {call_id!r}; "
            "resolve it once that driver has finished (its lease released or expired)"
        ) from None
    try:
        record, inserted = journal.write(
            run_id,
            name,
            {
                "kind": "tool",
                "call_id": call_id,
                "name": attempt.tool_name,
                "result": result,
                "is_error": is_error,
                "read_only": False,
                "reconciled": True,
                "evidence": evidence,
                "by": by,
            },
            fence=lease.token,
        )
        if not inserted:
            return _same_or_refuse(record, result, is_error)
        store.resolve_halt_row(
            run_id,
            call_id,
            {"result": result, "is_error": is_error, "evidence": evidence},
            by,
        )
        store.update_run(run_id, {"status": QUEUED}, fence=lease.token)
    finally:
        lease.release()
    store.log_action(
        identity.logged(
            actor, "resolve", run_id, call_id, {"is_error": is_error, "evidence": evidence}
        )
    )
    runtime.dispatch(run_id)
    return record


def _same_or_refuse(standing: Record, result: Any, is_error: bool) -> Record:
    if encode(standing.get("result")) == encode(result) and bool(standing.get("is_error")) == (
        is_error
    ):
        return standing
    raise HaltAlreadyResolved(
        f"call {standing.get('call_id')!r} already has an outcome: "
        f"{encode(standing.get('result'))} (is_error={bool(standing.get('is_error'))}); the "
        "first outcome stands",
        result=standing.get("result"),
        is_error=bool(standing.get("is_error")),
    )
