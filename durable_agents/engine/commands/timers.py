"""Waking runs whose time has come: a timer (``ctx.sleep`` / ``ctx.wait_until``) that is due,
or a signal await whose deadline passed.

A sleeping run is normally woken by the hand-over its pause scheduled for its wake time (a
Celery message with an ETA). That message can be lost (a purged queue, a broker restart), so
a periodic sweep (``wake_timers``) hands over every paused run whose journal says a timed
wait is due. Handing over early is harmless: the wait reads its journaled time and pauses
again without a second record; the sweep only makes sure a wake is late by at most one sweep.

The same sweep hands over a parent paused on a sub-run (``agent.as_tool()``) that ended
without handing it over: the sub-run ended after the parent paused (its second look for a
paused parent died with its process; docs/composition.md), or, in a saga's rollback, the
rollback of the sub-run the parent undoes next ended, or nobody drives that sub-run and it
was never aborted (its lease was busy when the parent tried). Such a parent waits for
nothing any more either. So does a halted run whose resolution stopped between its record
and its rows (the process resolving it died): the sweep finishes the resolution, as asking
again would; and a run awaiting approval whose decision stopped the same way (the sweep
finishes the decision, as deciding again would), or whose quorum its votes decided before
the voter who decided it died (``_finish_stopped_quorums``).

It also takes the steps of approval requests' deadlines that are due (``commands.deadlines``:
remind, escalate, expire), and finishes an expiry that stopped half-way.

A person may also wake a timer before its time (``wake_timer``, the admin's "wake now"): that
is a staff decision, journaled as such (``waited:<name>`` with ``early`` and who decided), not a
change of the clock: the wake time stays what was journaled, and the record says it was cut
short, by whom and when.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import failpoints, identity, lifecycle, names, runtime, sagas, stops, tree
from ..approvals import decision_name, tally
from ..errors import ConfigError, Conflict, DurableAgentsError, NotFound
from ..imported import refuse_inert
from ..journal import Journal
from ..ports import (
    APPROVAL_PENDING,
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    HALTED,
    KIND_AGENT,
    RUNNING,
    SLEEPING,
    TERMINAL_STATUSES,
    THROTTLED,
    RunInfo,
    Store,
)
from ..records import Record
from ..registry import get_agent
from ..transcript import RunState
from ..waits import OUTCOME_WOKE, TIMER, all_answered, next_wake
from . import deadlines
from .approvals import approve, finish_decision
from .halts import finish_resolution

log = logging.getLogger("durable_agents.timers")

TIMED_STATUSES = (SLEEPING, AWAITING_INPUT)


@dataclass(frozen=True)
class _Quiet:
    """A paused run a sweep read and left alone: as it was seen (status, row's update time,
    the seq of its journal's last record) and when it is due (its earliest timed wait)."""

    seen: tuple[str, datetime | None, int | None]
    due: datetime | None


# Per store, the paused runs the last sweep in this process read and left alone. The journal
# is append-only and its seqs only grow, so a run whose row and last seq are what they were
# holds the same records: what the sweep concluded from them still stands, bar the clock
# (its due time is kept). This keeps a sweep from reading every paused run's journal again
# and again — runs awaiting approval or input for days — while anything written to a run
# (an answer, a decision, an outcome) changes its last seq and has it read again. A store
# without ``journal_heads`` is read in full each time.
_QUIET: weakref.WeakKeyDictionary[Any, dict[str, _Quiet]] = weakref.WeakKeyDictionary()


def _quiet_runs(store: Any) -> dict[str, _Quiet] | None:
    try:
        return _QUIET.setdefault(store, {})
    except TypeError:  # a store that cannot be weakly referenced: no memory of it
        return None


def _finish_stopped_cancels(store: Store) -> None:
    """Close what a cancel left open: a halt or a pending request of a run cancelled since
    (its canceller died, or its store failed, between its record and closing them). Nobody
    drives a cancelled run, so the sweep does: two reads of what waits on a person, and one
    for which of their runs were cancelled."""
    runs = {h.run_id for h in store.list_halts()}
    runs |= {r.run_id for r in store.list_approval_requests()}
    if not runs:
        return
    cancelled = {e.run_id for e in store.find(sorted(runs), [names.RUN_CANCELLED])}
    for run_id in sorted(cancelled):
        stops.close_cancelled(store, run_id)


def wake_timers(*, store: Store | None = None, batch: int = 500) -> list[str]:
    """One sweep; returns the run ids it handed to a driver: paused runs whose timer or
    deadline is due, and paused runs that wait for nothing any more (``all_answered``: an
    answer, signal, channel message or early wake was journaled but its sender died before
    handing the run over; or a sub-run it waits on ended without handing it over:
    ``paused_on_an_ended_sub_run``); and paused runs, throttled ones too, under an ancestor
    whose cancel or abort they have not recorded (its canceller died before reaching them).
    The cost is one read of the last seqs per batch of paused runs (sleeping, awaiting
    input, approval, halted or throttled), a few row reads per sub-run, one journal read per run
    written to, woken or due since this process's last sweep (``_QUIET``), and for a
    parent, its journal and a few reads per unsettled sub-run every time."""
    store = store or runtime.store()
    journal = Journal(store)
    # Approval deadlines first: an expiry it hands over is not read again below.
    woken: list[str] = deadlines.sweep(store, batch=batch)
    now = store.now()
    after: str | None = None
    heads_of = getattr(store, "journal_heads", None)
    quiet = _quiet_runs(store) if heads_of is not None else None
    still_quiet: dict[str, _Quiet] = {}
    while True:
        # Every paused status, throttled too: a throttled sub-run under a stopped ancestor
        # must not wait for its retry (a day, for a rate of 1/d) to learn it is stopped.
        runs = store.list_unfinished(limit=batch, after=after, statuses=lifecycle.PAUSED)
        read = [run.run_id for run in runs if run.status != THROTTLED]
        heads = heads_of(read) if heads_of is not None and read else {}
        for run in runs:
            if (
                run.parent_run_id
                and stops.unrecorded_stop(store, run.run_id, run.parent_run_id) is not None
            ):
                # A run above it was cancelled or aborted, and its own stop is not recorded
                # yet (the cancel died, or it was busy then): its drive records it.
                if lifecycle.hand_over(store, run.run_id, lifecycle.SWEEP, only_from=run.status):
                    runtime.dispatch(run.run_id)
                    woken.append(run.run_id)
                continue
            if run.status == THROTTLED:
                continue  # otherwise its retry's to hand over, when due (``_wake_throttled``)
            seen = (run.status, run.updated_at, heads.get(run.run_id))
            known = quiet.get(run.run_id) if quiet is not None else None
            if (
                known is not None
                and known.seen == seen
                and seen[2] is not None
                and (known.due is None or now < known.due)
            ):
                still_quiet[run.run_id] = known  # nothing written since: still nothing due
                continue
            records = journal.records(run.run_id)
            due = next_wake(records) if run.status in TIMED_STATUSES else None
            timed = run.status in TIMED_STATUSES and (
                (due is not None and now >= due) or all_answered(records)
            )
            if (
                _finish_stopped_resolutions(store, run, records)
                or _finish_stopped_decisions(store, run, records)
                or deadlines.finish_stopped_expiries(store, run, records)
            ):
                runtime.dispatch(run.run_id)
                woken.append(run.run_id)
                continue
            if not timed and not paused_on_an_ended_sub_run(store, run, records):
                if not RunState.of(records).children and not deadlines.unfinished_expiries(
                    run, records
                ):
                    # Read and left alone; a parent is read every time (its sub-runs move
                    # without its journal), and so is a run whose expiry is not carried
                    # out yet (its cancel found the run busy).
                    still_quiet[run.run_id] = _Quiet(seen, due)
                continue
            # Queued first (only from the status it was seen in): if the hand-over is lost,
            # recovery picks a queued run up.
            if lifecycle.hand_over(store, run.run_id, lifecycle.SWEEP, only_from=run.status):
                runtime.dispatch(run.run_id)
                woken.append(run.run_id)
        if len(runs) < batch:
            break
        after = runs[-1].run_id
    if quiet is not None:  # only the runs still paused and left alone stay
        quiet.clear()
        quiet.update(still_quiet)
    woken += [r for r in _wake_throttled(store, batch) if r not in woken]
    woken += [r for r in _finish_stopped_quorums(store) if r not in woken]
    _finish_stopped_cancels(store)
    if woken:
        log.info("woke %d run(s) whose timer or deadline was due", len(woken))
    return woken


def _wake_throttled(store: Store, batch: int) -> list[str]:
    """Throttled runs whose retry is due (``engine.limits``): their hand-over at that time
    (a Celery message with an ETA) may have been lost, or was never sent (no dispatcher)."""
    woken = []
    for waiting in store.list_throttled(due=True, limit=batch):
        if lifecycle.hand_over(store, waiting.run_id, lifecycle.SWEEP, only_from=THROTTLED):
            runtime.dispatch(waiting.run_id)
            woken.append(waiting.run_id)
    return woken


def _finish_stopped_resolutions(store: Store, run: RunInfo, records: list[Record]) -> bool:
    """A halted run whose open halt has its outcome in the journal: a resolution stopped
    between its record and its rows (its process died). Bring the rows in step, as asking
    again would (``finish_resolution``); True if the run was queued (hand it over)."""
    if run.status != HALTED:
        return False
    outcomes = {rec.name: rec for rec in records if rec.get("reconciled")}
    if not outcomes:
        return False  # only a resolution records an outcome over a halt
    queued = False
    for halt in store.list_halts(run_id=run.run_id):
        outcome = outcomes.get(names.result(halt.op_id))
        if outcome is not None:
            queued = finish_resolution(store, run, halt.op_id, outcome) or queued
    return queued


def _finish_stopped_decisions(store: Store, run: RunInfo, records: list[Record]) -> bool:
    """A run awaiting approval whose pending request has its decision in the journal: the
    decision stopped between its record and its rows (its maker died). Bring the rows in
    step, as deciding again would (``finish_decision``); True if the run was queued. A run
    awaiting approval with no request pending and a decision journaled is queued too."""
    if run.status != AWAITING_APPROVAL:
        return False
    decisions = {rec.name: rec for rec in records if rec.name.startswith(names.APPROVAL)}
    if not decisions:
        return False  # only a decision can have stopped after its record
    pending = store.list_approval_requests(run_id=run.run_id)
    settled = {rec.name for rec in records if rec.name.startswith(names.TOOL)}
    # A decision's name is ``approval:<call>``, or ``approval:<call>:<tag>`` asked again.
    unused = [
        rest
        for rest in (name[len(names.APPROVAL) :] for name in decisions)
        if names.tool(rest) not in settled and names.tool(rest.rpartition(":")[0]) not in settled
    ]
    if not pending and unused and not deadlines.unfinished_expiries(run, records):
        # Nothing left to decide, and a decision on a call without its result: it landed
        # while the drive pausing on it still held the run (its hand-over found the drive
        # busy), and that drive, taking the run again for it, died before it moved the row
        # on. Hand it over, as the drive would. (A parent paused as its sub-run is has no
        # request of its own; an expiry whose cancel is not carried out yet is the
        # expiries' to finish.)
        return lifecycle.hand_over(store, run.run_id, lifecycle.SWEEP, only_from=AWAITING_APPROVAL)
    queued = False
    for request in pending:
        name = decision_name(
            request.call_id,
            request.arguments,
            again=request.previous_arguments is not None,
            tool_digest=request.tool_digest,
        )
        decision = decisions.get(name)
        if decision is not None:
            queued = (
                finish_decision(store, run.run_id, request.call_id, decision, by=lifecycle.SWEEP)
                or queued
            )
    return queued


def _finish_stopped_quorums(store: Store) -> list[str]:
    """Pending quorum requests whose votes decide them already, with no decision recorded:
    the vote that decided one was saved, and its maker died before the decision's record (a
    vote is a row, counted after it is saved, so that the last of two voters at the same
    moment sees both). No run or journal changed, so the sweep's memory of quiet runs does
    not see it: one read of the pending requests per sweep, and one of the votes of each
    pending quorum request. Each is finished as its voter deciding again would: a repeat
    of a counted vote, by its own maker, checked as any decision is. Returns the runs whose
    request that decided."""
    finished: list[str] = []
    groups: dict[str, list[str]] = {}
    for request in store.list_approval_requests():
        policy = dict(request.policy)
        if policy.get("kind") != "quorum":
            continue
        votes = store.list_decisions(request.run_id, request.call_id)
        if not votes:
            continue
        group = str(policy.get("group"))
        if group not in groups:
            groups[group] = list(runtime.eligible_approvers(group))
        count = tally(policy, votes, groups[group])
        if not (count.passed or count.unreachable):
            continue
        # The latest counted vote that agrees with the outcome first: the one that decided.
        agree = set(count.approved_by if count.passed else (*count.denied_by, *count.disagreed_by))
        counted = agree or set(count.approved_by)
        for vote in reversed(votes):
            if vote.approver not in counted:
                continue
            # A deputy's vote is repeated by the deputy, for the approver it was made for.
            maker = vote.deputy or vote.approver
            try:
                outcome = approve(
                    request.run_id,
                    request.call_id,
                    vote.approved,
                    by=maker,
                    note=vote.note,
                    edit=vote.arguments,
                    for_approver=vote.approver if vote.deputy else None,
                    store=store,
                )
            except DurableAgentsError as exc:  # refused for this maker: try the next
                log.warning(
                    "could not finish the quorum on call %s of run %s as %s: %s",
                    request.call_id,
                    request.run_id,
                    maker,
                    exc,
                )
                continue
            if outcome.status != APPROVAL_PENDING:
                finished.append(request.run_id)
            break
    return finished


def paused_on_an_ended_sub_run(store: Store, run: RunInfo, records: list[Record]) -> bool:
    """Whether paused run ``run`` (its journal: ``records``) waits on a sub-run that will not
    hand it over: going forward, a call's sub-run ended after the run paused (one that ended
    before was seen by the drive that paused: the run waits on something else too, a halt
    or a decision of its own); rolling back, likewise for the rollback of the sub-run it
    undoes next, or that sub-run is driven by nobody and was never aborted."""
    state = RunState.of(records)
    if not state.children:
        return False
    if state.complete is not None and state.saga_abort is None:
        return False
    if state.compensated is not None or state.cancelled is not None:
        return False
    if state.saga_abort is None:
        unsettled = [child for call, child in state.children.items() if call not in state.results]
        return any(_after(tree.ended_at(store, child), run.updated_at) for child in unsettled)
    if state.live_attempts():
        return False  # the rollback halts on an unknown outcome first: a person's to resolve
    try:
        agent = get_agent(run.agent)
    except ConfigError:  # an agent no longer loaded: its rollback's order is unknown here
        return False
    by_name = {rec.name: rec for rec in records}
    undo = sagas.next_undo(state, agent, by_name.get)
    if undo is None or undo[1].subagent_def is None:
        return False  # it paused on an undo of its own (a halt), not on a sub-run
    child = sagas.sub_run_of(state, run.run_id, undo[0])
    ended = tree.ended_at(store, child, rollback=True)
    if ended is not None:
        return _after(ended, run.updated_at)
    return tree.rollback_may_go_on(store, child)


def _after(ended: datetime | None, paused: datetime | None) -> bool:
    return ended is not None and (paused is None or ended >= paused)


@dataclass(frozen=True)
class WakeOutcome:
    """What ``wake_timer`` did: ``recorded`` False means the timer had already woken (by
    its time or by an earlier wake) and nothing new was written."""

    run_id: str
    name: str
    wake_ms: int
    woke_ms: int
    early: bool
    by: str | None
    recorded: bool
    woke: bool


def wake_timer(run_id: str, name: str, *, by: Any, store: Store | None = None) -> WakeOutcome:
    """Wake the timer ``name`` of run ``run_id`` now, before its journaled time: a staff
    decision (``by`` needs ``cancel_run``, operate runs), journaled as ``waited:<name>``
    (``outcome: woke``, ``early: True``, who and when) and in the action log (``wake``); the
    run is handed to a driver. The tool's ``ctx.sleep`` then returns (still the journaled
    wake time: the record, not the clock, says it was cut short). A timer that already woke
    changes nothing (``recorded`` False)."""
    names.validate_wait_name(name)
    actor = identity.resolve(by)
    identity.require(actor, identity.OPERATE_RUNS, "wake a sleeping run")
    store = store or runtime.store()
    journal = Journal(store)
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    refuse_inert(run, "wake a timer")
    request = journal.get(run_id, names.wait(name))
    if request is None or request.get("kind") != TIMER:
        raise NotFound(
            f"run {run_id!r} has no timer called {name!r}; its open waits are in pending() "
            "and on its page in the admin",
            code="timer.not_found",
        )
    wake_ms = int(request.get("wake_ms"))
    standing = journal.get(run_id, names.waited(name))
    if standing is not None:
        return _outcome(run_id, name, wake_ms, standing.body, recorded=False, woke=False)
    cancelled = journal.get(run_id, names.RUN_CANCELLED) is not None
    if run.kind != KIND_AGENT or run.status in TERMINAL_STATUSES or cancelled:
        status = "cancelled" if cancelled else run.status
        raise Conflict(
            f"run {run_id!r} is {status}: it waits for nothing any more", code=f"run.{status}"
        )
    at = int(store.now().timestamp() * 1000)  # the store's clock, as the timer's own
    body = {
        "kind": "waited",
        "name": name,
        "call_id": request.get("call_id"),
        "outcome": OUTCOME_WOKE,
        "woke_ms": at,
        "early": at < wake_ms,
        "by": actor.username,
        "by_id": actor.id,
    }
    rec, inserted = journal.write(run_id, names.waited(name), body)
    if not inserted:  # the driver woke it meanwhile: its record stands
        return _outcome(run_id, name, wake_ms, rec.body, recorded=False, woke=False)
    failpoints.hit(f"after-wake:{name}")
    store.log_action(
        identity.logged(actor, "wake", run_id, name, {"wake_ms": wake_ms, "woke_ms": at})
    )
    # Queued first (from a paused or running status): if the hand-over is lost, recovery
    # picks a queued run up; a running driver pauses only from running, so it cannot hide it.
    woke = lifecycle.hand_over(
        store, run_id, lifecycle.PERSON, only_from=(SLEEPING, AWAITING_INPUT, RUNNING)
    )
    if woke:
        runtime.dispatch(run_id)
    return _outcome(run_id, name, wake_ms, body, recorded=True, woke=woke)


def _outcome(
    run_id: str, name: str, wake_ms: int, body: Any, *, recorded: bool, woke: bool
) -> WakeOutcome:
    body = body if isinstance(body, dict) else {}
    woke_ms = int(body.get("woke_ms") or wake_ms)
    return WakeOutcome(
        run_id,
        name,
        wake_ms,
        woke_ms,
        bool(body.get("early")),
        body.get("by"),
        recorded,
        woke,
    )
