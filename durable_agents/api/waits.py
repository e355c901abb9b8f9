"""Waits: what a run waits for, and resolving it from outside.

* ``GET /runs/{run_id}/waits``: its open questions, signals, timers and channel waits, the
  signals delivered that no wait consumed yet, and its channel messages (received or not).
* ``POST .../interrupts/{name}/answer``: a person's answer (``durable_agents.answer_interrupt``).
* ``POST .../signals/{name}``: a signal (``durable_agents.signal``), sent as the caller.
* ``POST .../channels/{channel}/messages``: a message on a channel (``durable_agents.enqueue``),
  deduped by its key, sent as the caller.
* ``POST .../timers/{name}/wake``: wake a sleeping timer now (``durable_agents.wake_timer``),
  a staff decision journaled as such.

Each write is journaled once (the first value wins), lands in the action log and hands the
run to a driver after it committed; the views only call the engine's commands.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import HttpRequest
from ninja import Router

from ..engine.commands.timers import WakeOutcome, wake_timer
from ..engine.commands.waits import WaitOutcome, answer_interrupt, enqueue, run_waits, signal
from ..engine.views import validate_wait_name
from .auth import check, require
from .schemas import (
    ERRORS,
    AnswerIn,
    ChannelMessageOut,
    EnqueueIn,
    EnqueueResult,
    KeptSignalOut,
    SignalIn,
    WaitOut,
    WaitResult,
    WaitsOut,
    WakeOut,
    checked_run_id,
)

router = Router(tags=["waits"])


def _name(name: str) -> str:
    return validate_wait_name(name)


def _at(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms is not None else None


def _result(outcome: WaitOutcome) -> WaitResult:
    return WaitResult(
        run_id=outcome.run_id,
        name=outcome.name,
        value=outcome.value,
        recorded=outcome.recorded,
        woke=outcome.woke,
    )


@router.get("/runs/{path:run_id}/waits", response={200: WaitsOut, **ERRORS})
def list_waits(request: HttpRequest, run_id: str) -> WaitsOut:
    """What the run waits for (needs ``view_run``): each open question with its prompt and
    schema, each awaited signal (with its deadline), each timer with its wake time, each
    channel it waits on for a message; the signals delivered that no wait consumed yet; and
    its channel messages in enqueue order, each with the call that acked it (null: not
    received yet)."""
    check(request, "view_runs")
    found = run_waits(checked_run_id(run_id))
    return WaitsOut(
        run_id=found.run.run_id,
        status=found.run.status,
        waits=[
            WaitOut(
                kind=w.kind,
                name=w.name,
                call_id=w.call_id,
                tool=w.tool,
                prompt=w.prompt,
                answer_schema=w.schema,
                deadline=w.deadline,
                signal_delivered=w.signal_delivered,
            )
            for w in found.waits
        ],
        signals=[
            KeptSignalOut(name=s.name, payload=s.payload, at=_at(s.at_ms), by=s.by)
            for s in found.signals
        ],
        messages=[
            ChannelMessageOut(
                channel=m.channel,
                key=m.key,
                payload=m.payload,
                enqueued_at=m.enqueued_at,
                by=m.by,
                acked_by=m.acked_by,
            )
            for m in found.messages
        ],
    )


@router.post("/runs/{path:run_id}/interrupts/{name}/answer", response={200: WaitResult, **ERRORS})
def answer(request: HttpRequest, run_id: str, name: str, payload: AnswerIn) -> WaitResult:
    """Answer the run's question ``name`` as the caller (needs ``approve_toolcall``).

    The value is checked against the question's schema: 400 ``interrupt.invalid_answer``
    (``details.problems``), nothing recorded. The first answer wins: the same value again is
    200 with ``recorded`` false; another value is 409 ``interrupt.already_answered`` with
    the standing answer in ``details``. 404 ``interrupt.not_found`` for a question the run
    never asked. With ``prompt`` (the question shown), 409 ``interrupt.question_changed`` if
    the run asks another one by now (the tool ran again and asked in other words): an answer
    is for the question it was given to."""
    by = require(request, "answer")
    run_id, name = checked_run_id(run_id), _name(name)
    return _result(answer_interrupt(run_id, name, payload.value, by=by, prompt=payload.prompt))


@router.post("/runs/{path:run_id}/signals/{name}", response={200: WaitResult, **ERRORS})
def send_signal(request: HttpRequest, run_id: str, name: str, payload: SignalIn) -> WaitResult:
    """Send the run the signal ``name`` as the caller (needs ``cancel_run``, operate runs).
    Kept whether or not the run awaits it yet; the first payload wins (a duplicate is 200
    with ``recorded`` false and the standing payload)."""
    by = require(request, "signal")
    run_id, name = checked_run_id(run_id), _name(name)
    return _result(signal(run_id, name, payload.payload, by=by))


@router.post(
    "/runs/{path:run_id}/channels/{channel}/messages", response={200: EnqueueResult, **ERRORS}
)
def send_message(
    request: HttpRequest, run_id: str, channel: str, payload: EnqueueIn
) -> EnqueueResult:
    """Enqueue ``payload`` on the run's ``channel`` under ``key``, as the caller (needs
    ``cancel_run``, operate runs, as a signal does). Kept whether or not the run waits on the
    channel yet; a run waiting on it is handed to a driver. Deduped by key: the first payload
    wins (a redelivery is 200 with ``recorded`` false and the standing payload). 400
    ``config.channel_name`` for a bad channel or key, nothing written."""
    by = require(request, "enqueue")
    run_id = checked_run_id(run_id)
    outcome = enqueue(run_id, channel, payload.key, payload.payload, by=by)
    return EnqueueResult(
        run_id=outcome.run_id,
        channel=outcome.name,
        key=outcome.key,
        value=outcome.value,
        recorded=outcome.recorded,
        woke=outcome.woke,
    )


def _wake(outcome: WakeOutcome) -> WakeOut:
    return WakeOut(
        run_id=outcome.run_id,
        name=outcome.name,
        wake_at=_at(outcome.wake_ms),  # type: ignore[arg-type]
        woke_at=_at(outcome.woke_ms),  # type: ignore[arg-type]
        early=outcome.early,
        by=outcome.by,
        recorded=outcome.recorded,
        woke=outcome.woke,
    )


@router.post("/runs/{path:run_id}/timers/{name}/wake", response={200: WakeOut, **ERRORS})
def wake(request: HttpRequest, run_id: str, name: str) -> WakeOut:
    """Wake the run's timer ``name`` now (needs ``cancel_run``): a staff decision, journaled
    with who made it; the timer's wake time is not changed. A timer that already woke is 200
    with ``recorded`` false. 404 ``timer.not_found`` for a timer the run never set."""
    by = require(request, "wake")
    run_id, name = checked_run_id(run_id), _name(name)
    return _wake(wake_timer(run_id, name, by=by))
