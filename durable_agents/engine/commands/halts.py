"""Halts: a side effect whose outcome is unknown stops its run until a person (or a
reconciler) records what really happened.

``resolve_halt`` records the verified outcome as the call's result, marked ``reconciled``
with its evidence, and hands the run back to a driver. It is refused

* before the halt is old enough (``HaltTooYoung``, naming when it can be resolved): at least
  ``HALT_MIN_AGE`` (by default twice ``LEASE_TTL``) by the database's clock since the attempt
  was claimed, so a driver that only stalled has long lost its lease, and the provider's
  records have had time to settle. A ``min_age`` passed in can only raise that floor;
* while a driver holds the run's live lease (``HaltInFlight``: it may be running the effect);
* when the run was cancelled (``HaltOrphaned``: there is nothing left to continue);
* when another outcome already stands (``HaltAlreadyResolved``). The first outcome wins.

Resolving first takes the call's next attempt claim (``attempt:<call>:<k+1>``, marked as a
resolution): from then on the call belongs to the resolution. A driver that comes back from
a stall finds its lease gone and the attempt taken — it can neither record its result nor
claim the call again; what its tool returned is kept as ``@late/<call>/<k>`` evidence.

Durable steps (``Journal.step``) halt the same way; their op id is ``step:<name>`` and the
outcome recorded is the step's value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .. import failpoints, identity, lifecycle, names, runtime
from ..errors import (
    HaltAlreadyResolved,
    HaltError,
    HaltInFlight,
    HaltOrphaned,
    HaltTooYoung,
    NoLiveAttempt,
    NotFound,
    RunBusy,
)
from ..imported import refuse_inert
from ..journal import Journal
from ..leases import HeldLease
from ..ports import (
    CANCELLED,
    COMPENSATING,
    HALT_EXPIRED,
    HALTED,
    KIND_AGENT,
    QUEUED,
    RunInfo,
    Store,
)
from ..records import Record, encode, refuse_nul
from ..transcript import outcome_of


@dataclass(frozen=True)
class LiveAttempt:
    """The attempt a resolution records the outcome of: ``marker`` None for a call that
    never ran because its approval request expired (``number``: the attempts it has, 0)."""

    marker: Record | None
    tool_name: str
    age_seconds: float
    number: int


def live_attempt(journal: Journal, run_id: str, call_id: str) -> LiveAttempt | None:
    """The call's claimed attempt that has no not-started record."""
    live = None
    k = number = 1
    while (marker := journal.get(run_id, names.attempt(call_id, k))) is not None:
        if journal.get(run_id, names.not_started(call_id, k)) is None:
            live, number = marker, k
        k += 1
    if live is None:
        return None
    store_now = getattr(journal.store, "now", None)
    if store_now is not None and live.created_at is not None:
        # Both ends by the database's clock, like leases: no worker clock is trusted.
        age = (store_now() - live.created_at).total_seconds()
    else:
        age = time.time() - (live.get("attempted_at") or 0) / 1000
    return LiveAttempt(live, str(live.get("tool") or ""), age, number)


def _expired(store: Store, journal: Journal, run_id: str, call_id: str) -> LiveAttempt | None:
    """An open halt of a call whose approval request expired (``on_expiry="halt"``): what a
    resolution records its result over. Its next claim is the call's first attempt number
    free (a call that never ran has none)."""
    halt = next(
        (
            h
            for h in store.list_halts(run_id=run_id)
            if h.op_id == call_id and h.cause == HALT_EXPIRED
        ),
        None,
    )
    if halt is None:
        return None
    k = 0
    while journal.get(run_id, names.attempt(call_id, k + 1)) is not None:
        k += 1
    return LiveAttempt(None, halt.tool_name, 0.0, k)


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
    step = names.is_step(call_id)
    if step and is_error:
        raise HaltError("a step's outcome is its value: record what it returned, not an error")
    refuse_nul({"result": result, "evidence": evidence}, "the resolution")  # before any write
    store = store or runtime.store()
    journal = Journal(store)
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    refuse_inert(run, "resolve a halt")
    name = names.result(call_id)
    standing = journal.get(run_id, name)
    if standing is not None:
        # The journal is the truth: a resolution that stopped after its record (a crash)
        # is finished by asking again, whatever is asked — then the same outcome is
        # returned, another refused.
        if finish_resolution(store, run, call_id, standing):
            runtime.dispatch(run_id)
        return _same_or_refuse(standing, result, is_error)
    _refuse_if_cancelled(store, journal, run_id, call_id, run.status)
    attempt = live_attempt(journal, run_id, call_id) or _expired(store, journal, run_id, call_id)
    if attempt is None:
        raise NoLiveAttempt(
            f"call {call_id!r} of run {run_id!r} has no attempt whose outcome is unknown; "
            "there is nothing to resolve"
        )
    _refuse_if_too_young(attempt, call_id, min_age)
    lease = _lease_or_in_flight(store, run_id, call_id)
    agent_run = run.kind == KIND_AGENT
    try:
        # Under the lease nobody else writes: cancel and drivers take it too.
        _refuse_if_cancelled(store, journal, run_id, call_id, None)
        won, _ = journal.claim_attempt(
            run_id,
            names.attempt(call_id, attempt.number + 1),
            fence=lease.token,
            extra={"tool": attempt.tool_name, "resolution": True, "by": by},
        )
        if not won:
            standing = journal.get(run_id, name)
            if standing is not None:
                return _same_or_refuse(standing, result, is_error)
            raise HaltInFlight(
                f"call {call_id!r} of run {run_id!r} was claimed again meanwhile; look at the "
                "run again before resolving it"
            )
        body: dict[str, Any] = (
            {"kind": "step", "value": result}
            if step
            else names.tool_body(call_id, attempt.tool_name, result, is_error=is_error)
        )
        body.update(reconciled=True, evidence=evidence, by=by)
        record, inserted = journal.write(run_id, name, body, fence=lease.token)
        if not inserted:
            return _same_or_refuse(record, result, is_error)
        failpoints.hit(f"after-resolution:{call_id}")
        # The run queued before its halt row closes: a crash between leaves a run recovery
        # drives, and the drive closes the row (never a closed halt on a run that stays
        # halted with nothing to resolve).
        if agent_run:
            _continue_run(store, journal, run_id, lease.token)
        store.resolve_halt_row(run_id, call_id, outcome_of(record), by)
    finally:
        lease.release()
    store.log_action(
        identity.logged(
            actor, "resolve", run_id, call_id, {"is_error": is_error, "evidence": evidence}
        )
    )
    if agent_run:  # a plain journal's step is read by its caller, not driven
        runtime.dispatch(run_id)
    return record


def _refuse_if_too_young(attempt: LiveAttempt, call_id: str, min_age: float | None) -> None:
    """Refuse a resolution before the attempt is old enough (``HaltTooYoung``)."""
    required = max(runtime.halt_min_age(), float(min_age or 0))
    # A resolution's own claim ran no effect (a resolution that stopped half-way), nor did
    # a call whose request expired: no wait.
    if attempt.marker is not None and (
        not attempt.marker.get("resolution") and attempt.age_seconds < required
    ):
        claimed = attempt.marker.created_at
        if claimed is None:
            when = "in " + f"{required - attempt.age_seconds:.0f}s"
        else:
            when = (claimed + timedelta(seconds=required)).isoformat(timespec="seconds")
        raise HaltTooYoung(
            f"the attempt of call {call_id!r} is {attempt.age_seconds:.0f}s old; it can be "
            f"resolved from {when} ({required:.0f}s after it was claimed: by then a driver "
            "that only stalled has lost the run, and the provider's records have settled)",
            age=attempt.age_seconds,
            min_age=required,
            resolvable_at=when,
        )


def _lease_or_in_flight(store: Store, run_id: str, call_id: str) -> HeldLease:
    """The run's lease, or ``HaltInFlight`` while a driver holds it."""
    try:
        return HeldLease(store, run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        raise HaltInFlight(
            f"a driver holds run {run_id!r} right now and may be running call {call_id!r}; "
            "resolve it once that driver has finished (its lease released or expired)"
        ) from None


def _continue_run(store: Store, journal: Journal, run_id: str, fence: str) -> None:
    """Hand a resolved agent run on, under the resolution's lease."""
    # A rollback's halt (a saga that aborted) goes on rolling back: never queued as if
    # it went forward; recovery hands a compensating run over like a queued one.
    if journal.get(run_id, names.SAGA_ABORT) is not None:
        lifecycle.hold(
            store,
            run_id,
            COMPENSATING,
            lifecycle.PERSON,
            changes={"attempts": 0},
            fence=fence,
        )
    else:
        lifecycle.hold(
            store,
            run_id,
            QUEUED,
            lifecycle.PERSON,
            changes={"attempts": 0, "last_error": None},
            fence=fence,
        )


def finish_resolution(store: Store, run: RunInfo, op_id: str, outcome: Record) -> bool:
    """Bring the rows in step with an outcome the journal holds for ``op_id``: its open
    halts resolved with it, and a run still halted queued again. Idempotent; True if the
    run was queued (hand it to a driver)."""
    queued = False
    if run.kind == KIND_AGENT and run.status == HALTED:
        # Queued first, as ``resolve_halt`` does: then a crash leaves the row for the drive.
        if Journal(store).get(run.run_id, names.SAGA_ABORT) is not None:
            queued = lifecycle.move(
                store,
                run.run_id,
                COMPENSATING,
                lifecycle.PERSON,
                changes={"attempts": 0},
                only_from=HALTED,
            )
        else:
            queued = lifecycle.hand_over(store, run.run_id, lifecycle.PERSON, only_from=HALTED)
    by = outcome.get("by")
    store.resolve_halt_row(run.run_id, op_id, outcome_of(outcome), str(by) if by else None)
    return queued


def _refuse_if_cancelled(
    store: Store, journal: Journal, run_id: str, call_id: str, status: str | None
) -> None:
    if status != CANCELLED and journal.get(run_id, names.RUN_CANCELLED) is None:
        return
    store.orphan_halts(run_id)
    raise HaltOrphaned(
        f"run {run_id!r} was cancelled, so call {call_id!r} will never continue: there is "
        "nothing to resolve; nothing was recorded"
    )


def _same_or_refuse(standing: Record, result: Any, is_error: bool) -> Record:
    recorded = standing.get("value") if standing.kind == "step" else standing.get("result")
    if encode(recorded) == encode(result) and bool(standing.get("is_error")) == is_error:
        return standing
    raise HaltAlreadyResolved(
        f"call {standing.get('call_id')!r} already has an outcome: "
        f"{encode(recorded)} (is_error={bool(standing.get('is_error'))}); the "
        "first outcome stands",
        result=recorded,
        is_error=bool(standing.get("is_error")),
    )
