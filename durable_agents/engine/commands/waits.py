"""Commands that resolve a run's waits from outside: a person's answer to an interrupt
(``answer_interrupt``) and a signal (``signal``). Each is idempotent (the first value wins),
journaled, and hands a run that waits for it to a driver after the record is written.

The rules of the waits themselves (names, records, retry safety) are ``engine.waits``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .. import answers, failpoints, identity, lifecycle, names, runtime, stops
from ..errors import (
    Conflict,
    InterruptAlreadyAnswered,
    InterruptAnswerInvalid,
    InterruptExpired,
    InterruptNotFound,
    InterruptQuestionChanged,
    NotFound,
    ProtocolError,
)
from ..imported import refuse_inert
from ..journal import Journal, now_ms
from ..ports import (
    AWAITING_INPUT,
    KIND_AGENT,
    RUNNING,
    TERMINAL_STATUSES,
    THROTTLED,
    RunInfo,
    Store,
)
from ..records import encode, refuse_nul
from ..waits import (
    INTERRUPT,
    SIGNAL,
    InboxEntry,
    KeptSignal,
    OpenWait,
    channel_waits_for,
    inbox,
    kept_signals,
    latest_question,
    open_waits,
)


@dataclass(frozen=True)
class WaitOutcome:
    """What a command did: ``recorded`` False means an equal value was already there (a
    repeated answer, a duplicate signal) and nothing new was written."""

    run_id: str
    name: str
    value: Any
    recorded: bool
    woke: bool
    key: str = ""  # a channel message's key (``enqueue``; ``name`` is the channel)


def answer_interrupt(
    run_id: str,
    name: str,
    value: Any,
    *,
    by: Any,
    prompt: str | None = None,
    store: Store | None = None,
) -> WaitOutcome:
    """Record ``by``'s answer ``value`` to the interrupt ``name`` of run ``run_id``.

    ``by`` must name one active user holding ``approve_toolcall`` (who may decide a run's
    gated calls may answer its questions). The answer is for the question the interrupt
    asks now (its last one: a tool that asks again under the same name with another prompt
    or schema asks a new question, and an answer to the one before never counts for it).
    ``prompt`` is the question its answerer was shown: if the run asks another one by now,
    the answer is refused (``interrupt.question_changed``) and nothing is written — pass it
    whenever a person read a page first. The answer is checked against the schema the tool
    asked with; an invalid one is refused (``interrupt.invalid_answer``) and nothing is
    written. The first answer wins: the same answer again is accepted and changes nothing,
    another one is refused (``interrupt.already_answered``) with the standing answer.
    """
    names.validate_wait_name(name)
    actor = identity.resolve(by)
    identity.require(actor, identity.APPROVE_TOOLCALL, "answer a run's question")
    store = store or runtime.store()
    journal = Journal(store)
    _check_acts(store, run_id, "answer a question")
    ask, request = latest_question(journal, run_id, name)
    standing = journal.get(run_id, names.interrupt_answer(name, ask))
    if standing is None:
        _check_open(store, journal, run_id)
    if request is None or request.get("kind") != INTERRUPT:
        raise InterruptNotFound(f"run {run_id!r} asked no question called {name!r}")
    if prompt is not None and prompt != request.get("prompt"):
        raise InterruptQuestionChanged(
            f"run {run_id!r} asks another question under {name!r} by now: "
            f"{request.get('prompt')!r} (shown: {prompt!r}); nothing was recorded: read it "
            "again before answering",
            prompt=request.get("prompt"),
            shown=prompt,
        )
    live = bool(request.get("live"))
    if live:
        _check_live(store, journal, run_id, name, request, standing)
    _check_json(value, f"the answer to {name!r}")
    wrong = answers.problems(request.get("schema"), value)
    if wrong:
        raise InterruptAnswerInvalid(
            f"the answer to {name!r} does not fit its schema: {'; '.join(wrong)}",
            problems=wrong,
        )
    body = {
        "kind": "input",
        "name": name,
        "value": value,
        "by": actor.username,
        "by_id": actor.id,
        "at": now_ms(),
    }
    if ask > 1:
        body.update(ask=ask, prompt=request.get("prompt"))
    rec, inserted = (
        (standing, False)
        if standing is not None
        else journal.write(run_id, names.interrupt_answer(name, ask), body)
    )
    if not inserted:
        if encode(rec.get("value")) != encode(value):
            raise InterruptAlreadyAnswered(
                f"{name!r} of run {run_id!r} was already answered by {rec.get('by')!r}; the "
                "first answer stands",
                standing={"value": rec.get("value"), "by": rec.get("by")},
            )
        # The same answer again finishes what a first one that stopped early left undone.
        woke = _wake(store, run_id, running=False)
        return WaitOutcome(run_id, name, rec.get("value"), False, woke)
    store.log_action(identity.logged(actor, "answer", run_id, name, {"value": value}))
    failpoints.hit(f"after-answer:{name}")
    # A live question's asker reads the journal itself: nothing to hand over (were it gone,
    # its run is ``running`` with a lease that expires, and recovery takes it over).
    return WaitOutcome(run_id, name, value, True, False if live else _wake(store, run_id))


def _check_live(
    store: Store,
    journal: Journal,
    run_id: str,
    name: str,
    request: Any,
    standing: Any,
) -> None:
    """Refuse an answer to a live question the call no longer waits for: given up by the
    call (its own ``input:`` record, first writer wins), past its deadline by the store's
    clock, of a call that has its result, or asked by a driver whose lease is gone (it
    died, or another driver took the run over: nobody reads the answer)."""
    holder = request.get("holder")
    deadline = request.get("deadline_ms")
    if standing is not None and standing.get("outcome") == "cancel":
        why = standing.get("reason") or "given up"
    elif standing is not None:
        return  # answered: a repeat of that answer is fine, another value is refused below
    elif journal.get(run_id, names.tool(str(request.get("call_id")))) is not None:
        why = "the call has its result"
    elif deadline is not None and store.now().timestamp() * 1000 >= deadline:
        why = "its deadline passed"
    elif holder is not None and not _holds(store, run_id, holder):
        why = "the process that asked no longer holds the run"
    else:
        return
    raise InterruptExpired(
        f"{name!r} of run {run_id!r} was asked by an MCP server during a call that no longer "
        f"waits for it ({why}); nothing was recorded: an answer now would reach nobody",
        reason=why,
    )


def lease_digest(token: str) -> str:
    """What a live question keeps of its driver's lease token (``holder``): enough to tell
    that driver's lease from another's, not the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def _holds(store: Store, run_id: str, holder: str) -> bool:
    """Whether the driver whose token digest is ``holder`` holds run ``run_id``'s lease now
    (by the store's clock)."""
    lease = store.get_lease(run_id)
    return lease is not None and lease.live and lease_digest(lease.token) == holder


def signal(
    run_id: str, name: str, payload: Any = None, *, by: Any = None, store: Store | None = None
) -> WaitOutcome:
    """Deliver the signal ``name`` with ``payload`` to run ``run_id``: kept in its journal
    whether or not the run awaits it yet (an early signal is consumed when the wait comes).
    The first payload wins; a duplicate changes nothing (``recorded`` False). A run waiting
    for it is handed to a driver. ``by`` is optional (a system sends most signals); when
    given, it must hold ``cancel_run`` (operate runs) and the signal is in the action log."""
    names.validate_wait_name(name)
    actor = None
    if by is not None:
        actor = identity.resolve(by)
        identity.require(actor, identity.OPERATE_RUNS, "send a run a signal")
    store = store or runtime.store()
    journal = Journal(store)
    _check_acts(store, run_id, "send a signal")
    standing = journal.get(run_id, names.signal(name))
    if standing is not None:  # a duplicate delivery, even after the run went on
        return WaitOutcome(run_id, name, standing.get("payload"), False, False)
    _check_open(store, journal, run_id)
    _check_json(payload, f"the payload of signal {name!r}")
    body = {"kind": "signal", "name": name, "payload": payload, "at": now_ms()}
    if actor is not None:
        body.update(by=actor.username, by_id=actor.id)
    rec, inserted = journal.write(run_id, names.signal(name), body)
    if inserted and actor is not None:
        store.log_action(identity.logged(actor, "signal", run_id, name, {"payload": payload}))
    if inserted:
        failpoints.hit(f"after-signal:{name}")
    awaited = journal.get(run_id, names.wait(name))
    woke = False
    if (
        awaited is not None
        and awaited.get("kind") == SIGNAL
        and journal.get(run_id, names.waited(name)) is None
    ):
        woke = _wake(store, run_id)
    return WaitOutcome(run_id, name, rec.get("payload"), inserted, woke)


def enqueue(
    run_id: str,
    channel: str,
    key: str,
    payload: Any = None,
    *,
    by: Any = None,
    store: Store | None = None,
) -> WaitOutcome:
    """Append ``payload`` to run ``run_id``'s ``channel`` under ``key``: an ordered inbox the
    run reads with ``ctx.receive`` / ``ctx.ack``. Deduped by key: the first payload wins and
    a redelivery changes nothing (``recorded`` False, the standing payload returned), so an
    at-least-once sender is harmless. A run waiting on the channel is handed to a driver
    after the record is written. ``by`` is optional, as for ``signal``."""
    names.validate_channel(channel)
    names.validate_channel(key)
    actor = None
    if by is not None:
        actor = identity.resolve(by)
        identity.require(actor, identity.OPERATE_RUNS, "enqueue a message for a run")
    store = store or runtime.store()
    journal = Journal(store)
    _check_acts(store, run_id, "enqueue a message")
    standing = journal.get(run_id, names.message(channel, key))
    if standing is not None:
        # A redelivery; it also finishes what a first one that stopped after its record
        # left undone (the run still waiting with the message journaled).
        woke = channel_waits_for(journal.records(run_id), channel, key) and _wake(
            store, run_id, running=False
        )
        return WaitOutcome(run_id, channel, standing.get("payload"), False, woke, key)
    _check_open(store, journal, run_id)
    _check_json(payload, f"the payload of message {key!r} on channel {channel!r}")
    body = {"kind": "message", "channel": channel, "key": key, "payload": payload, "at": now_ms()}
    if actor is not None:
        body.update(by=actor.username, by_id=actor.id)
    rec, inserted = journal.write(run_id, names.message(channel, key), body)
    if inserted and actor is not None:
        store.log_action(
            identity.logged(actor, "enqueue", run_id, f"{channel}:{key}", {"payload": payload})
        )
    if inserted:
        failpoints.hit(f"after-enqueue:{channel}:{key}")
    # Written first, then looked at: ``ctx.receive`` writes its wait, then looks again.
    woke = channel_waits_for(journal.records(run_id), channel, key) and _wake(store, run_id)
    return WaitOutcome(run_id, channel, rec.get("payload"), inserted, woke, key)


def waits_of(run_id: str, *, store: Store | None = None) -> list[OpenWait]:
    """What run ``run_id`` waits for: its questions and signals nothing resolved yet."""
    store = store or runtime.store()
    if store.get_run(run_id) is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    return open_waits(Journal(store).records(run_id))


@dataclass(frozen=True)
class RunWaits:
    """What a run waits for, read from one journal read: its open waits (questions, signals,
    timers, channels), the signals delivered that no wait consumed yet (early ones) and its
    channel messages, received or not."""

    run: RunInfo
    waits: list[OpenWait]
    signals: list[KeptSignal]
    messages: list[InboxEntry]


def run_waits(run_id: str, *, store: Store | None = None) -> RunWaits:
    """Run ``run_id``'s open waits, kept signals and channel messages (``run.not_found`` if
    there is none)."""
    store = store or runtime.store()
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    records = Journal(store).records(run_id)
    waits = open_waits(records)
    if run.status == THROTTLED:  # a limit, not the journal: its throttle row says what
        waits += [
            OpenWait("throttle", t.key, "", "", prompt=t.limit, deadline=t.retry_at)
            for t in store.list_throttled(run_id=run_id, limit=1)
        ]
    return RunWaits(run, waits, kept_signals(records), inbox(records))


def messages_of(
    run_id: str, channel: str | None = None, *, store: Store | None = None
) -> list[InboxEntry]:
    """Run ``run_id``'s channel messages (of one ``channel``, or all), in enqueue order, each
    with the call that acked it (None: not received yet) — what a run page lists."""
    if channel is not None:
        names.validate_channel(channel)
    store = store or runtime.store()
    _check_exists(store, run_id)
    return inbox(Journal(store).records(run_id), channel)


def _check_exists(store: Store, run_id: str) -> None:
    if store.get_run(run_id) is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")


def _check_acts(store: Store, run_id: str, doing: str) -> None:
    """The run exists and is no inert import: something may be written to it."""
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    refuse_inert(run, doing)


def _check_open(store: Store, journal: Journal, run_id: str) -> None:
    """Refuse a value for a run that waits for nothing any more: finished, cancelled,
    rolling back (its saga aborted: it never goes forward again), or below a run that was
    cancelled or aborted (whose stop it has not recorded yet: handed to a driver, which
    does)."""
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    if run.kind != KIND_AGENT:
        raise Conflict(
            f"run {run_id!r} is a {run.kind} journal, not an agent run", code="run.not_an_agent_run"
        )
    if run.status in TERMINAL_STATUSES or journal.get(run_id, names.RUN_CANCELLED) is not None:
        status = "cancelled" if journal.get(run_id, names.RUN_CANCELLED) else run.status
        raise Conflict(
            f"run {run_id!r} is {status}: it waits for nothing any more", code=f"run.{status}"
        )
    if journal.get(run_id, names.SAGA_ABORT) is not None:
        raise Conflict(
            f"run {run_id!r} is rolling back (its saga aborted): it waits for nothing any more",
            code="run.compensating",
        )
    stop = stops.stop_above(store, run.parent_run_id) if run.parent_run_id else None
    if stop is not None:
        if lifecycle.hand_over(store, run_id, lifecycle.PERSON, only_from=lifecycle.PAUSED):
            runtime.dispatch(run_id)  # its drive records its own stop
        code = "run.cancelled" if stop.kind == stops.CANCEL else "run.compensating"
        raise Conflict(f"run {run_id!r} waits for nothing any more: {stop.describe()}", code=code)


def _check_json(value: Any, what: str) -> None:
    try:
        # The action log keeps the value too, in a column that cannot hold U+0000.
        refuse_nul(value, what)
    except ProtocolError as exc:
        raise InterruptAnswerInvalid(f"{what} cannot be recorded: {exc}") from None


def _wake(store: Store, run_id: str, *, running: bool = True) -> bool:
    """Hand a run paused on input back to a driver (queued first: if the hand-over fails,
    recovery picks it up). A run being driven is queued too: its driver pauses only from
    ``running``, so it cannot hide the wake-up behind a pause, even if it dies right after
    (recovery hands a queued run over once its lease is free)."""
    moved = lifecycle.hand_over(
        store,
        run_id,
        lifecycle.PERSON,
        only_from=(AWAITING_INPUT, RUNNING) if running else AWAITING_INPUT,
    )
    if moved:
        runtime.dispatch(run_id)
    return bool(moved)
