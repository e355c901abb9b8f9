"""Waits inside a tool: a question for a person (``ctx.interrupt``) and a signal from outside
(``ctx.await_signal``).

A tool that waits does not block a worker: it raises a pause, the run stops durably
(``awaiting_input``), and when the answer or the signal is journaled the run is handed to a
driver, which runs the tool again from the top. This time the wait finds its resolution in
the journal and returns it. That is why a wait is allowed only in a retry-safe tool
(read-only, idempotent or keyed): whatever the tool did before the wait runs again.

Each wait has a name, unique in its run, and is resolved once:

* ``wait:<name>`` — the request (first encounter): kind, call, prompt and schema, or the
  signal's deadline. A second call of the run waiting under the same name is refused.
* ``input:<name>`` — a person's answer (``commands.waits.answer_interrupt``): first wins.
* ``signal:<name>`` — a delivered signal (``commands.waits.signal``), kept whether or not
  anything awaits it yet: first payload wins.
* ``waited:<name>`` — how an await of a signal resolved (the payload, or the timeout):
  written once, so a signal arriving after the timeout cannot flip it, and the signal is
  consumed by one call only. For a timer (``ctx.sleep`` / ``ctx.wait_until``): that it woke.

A timer's wake time is journaled in its ``wait:<name>`` on first encounter, so a run that is
recovered, redeployed or driven early waits to that same instant, never to a new one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic

from . import answers, failpoints, names
from .errors import (
    ChannelPending,
    InterruptPending,
    SignalPending,
    TimerPending,
    WaitError,
    WaitNameTaken,
    WaitNotRetrySafe,
)
from .journal import Journal
from .ports import Store
from .records import Record, encode, refuse_nul

INTERRUPT = "interrupt"
SIGNAL = "signal"
TIMER = "timer"
CHANNEL = "channel"
OUTCOME_SIGNAL = "signal"
OUTCOME_TIMEOUT = "timeout"
OUTCOME_WOKE = "woke"


@dataclass(frozen=True)
class TimedOut:
    """What ``ctx.await_signal(name, timeout=...)`` returns when the timeout won."""

    name: str
    deadline: datetime


@dataclass(frozen=True)
class ChannelMessage:
    """What ``ctx.receive(channel)`` returns: the oldest message nothing acked yet."""

    channel: str
    key: str
    payload: Any


def channel_messages(records: list[Record], channel: str) -> list[Record]:
    """The messages of ``channel`` in ``records`` (a run's journal), in enqueue order."""
    return [r for r in records if names.message_key(channel, r.name) is not None]


def _first_unacked(records: list[Record], channel: str) -> ChannelMessage | None:
    have = {r.name for r in records}
    for rec in channel_messages(records, channel):
        key = str(names.message_key(channel, rec.name))
        if names.ack(channel, key) not in have:
            return ChannelMessage(channel, key, rec.get("payload"))
    return None


@dataclass(frozen=True)
class InboxEntry:
    """One message of a run's channel as staff see it: whether and by which call it was
    consumed (``acked_by``, None while it waits to be received)."""

    channel: str
    key: str
    payload: Any
    enqueued_at: datetime | None
    by: str | None
    acked_by: str | None


def inbox(records: list[Record], channel: str | None = None) -> list[InboxEntry]:
    """Every channel message in ``records`` (a run's journal), in enqueue order, optionally
    of one ``channel`` only."""
    acks = {r.name: r for r in records if r.name.startswith(names.ACK)}
    out = []
    for rec in records:
        if not rec.name.startswith(names.MESSAGE):
            continue
        ch, key = str(rec.get("channel")), str(rec.get("key"))
        if channel is not None and ch != channel:
            continue
        ack = acks.get(names.ack(ch, key))
        at = rec.get("at")
        out.append(
            InboxEntry(
                channel=ch,
                key=key,
                payload=rec.get("payload"),
                enqueued_at=_at(at) if at is not None else None,
                by=rec.get("by"),
                acked_by=str(ack.get("call_id")) if ack is not None else None,
            )
        )
    return out


def channel_has_message(records: list[Record], channels: Any) -> bool:
    """Whether any of ``channels`` holds a message nothing acked yet."""
    return any(_first_unacked(records, c) is not None for c in channels)


def channel_waits_for(records: list[Record], channel: str, key: str) -> bool:
    """Whether the run whose journal is ``records`` waits on ``channel`` for the message
    ``key`` (journaled, not acked): a ``receiving:`` record found the channel empty before
    it came. Commit order decides: the message that is number k of the channel resolves the
    receive that saw k - 1 messages."""
    have = {r.name for r in records}
    if names.ack(channel, key) in have:
        return False
    keys = [names.message_key(channel, r.name) for r in channel_messages(records, channel)]
    if key not in keys:
        return False
    number = keys.index(key) + 1
    for rec in records:
        parsed = names.parse_receiving(rec.name)
        if parsed is not None and parsed[0] == channel and parsed[1] >= number - 1:
            return True
    return False


class CallWaits:
    """The waits of one tool call in one drive (what a ``ToolContext`` delegates to)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        call_id: str,
        tool_name: str,
        *,
        retry_safe: bool,
        fence: str | None,
    ) -> None:
        self.store = store
        self.journal = Journal(store)
        self.run_id = run_id
        self.call_id = call_id
        self.tool_name = tool_name
        self.retry_safe = retry_safe
        self.fence = fence

    def interrupt(self, name: str, prompt: str, schema: Any = None) -> Any:
        self._check(name, "ctx.interrupt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise WaitError(f"interrupt {name!r}: the prompt is a non-empty string")
        json_schema = answers.schema_of(schema)
        question = {"kind": INTERRUPT, "prompt": prompt, "schema": json_schema}
        rec = self._request(name, question)
        ask, latest = latest_question(self.journal, self.run_id, name, rec)
        if not same_question(latest, prompt, json_schema):
            # Asked under the same name with another prompt or schema (the tool runs again
            # on other data, or under new code): a new question. The answer given to the
            # one before was for that one, never for this.
            ask += 1
            full = {**question, "name": name, "call_id": self.call_id, "tool": self.tool_name}
            refuse_nul(full, f"wait {name!r}")
            self.journal.write(
                self.run_id, names.wait(name, ask), {**full, "ask": ask}, fence=self.fence
            )
        answer = self.journal.get(self.run_id, names.interrupt_answer(name, ask))
        if answer is None:
            raise InterruptPending(
                f"run {self.run_id!r} waits for an answer to {name!r}: {prompt}",
                run_id=self.run_id,
                waits=[name],
                wakes=[names.interrupt_answer(name, ask)],
            )
        value = answer.get("value")
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            return schema.model_validate(value)
        return value

    def await_signal(self, name: str, timeout: float | None = None) -> Any:
        self._check(name, "ctx.await_signal")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise WaitError(f"await_signal {name!r}: timeout is a positive number of seconds")
        now_ms = int(self.store.now().timestamp() * 1000)
        deadline = now_ms + int(timeout * 1000) if timeout is not None else None
        request = self._request(name, {"kind": SIGNAL, "deadline_ms": deadline})
        deadline = request.get("deadline_ms")
        outcome = self.journal.get(self.run_id, names.waited(name))
        if outcome is None:
            delivered = self.journal.get(self.run_id, names.signal(name))
            if delivered is not None:
                outcome = self._resolve(
                    name, {"outcome": OUTCOME_SIGNAL, "payload": delivered.get("payload")}
                )
            elif deadline is not None and now_ms >= deadline:
                outcome = self._resolve(name, {"outcome": OUTCOME_TIMEOUT})
        if outcome is None:
            raise SignalPending(
                f"run {self.run_id!r} waits for signal {name!r}",
                run_id=self.run_id,
                waits=[name],
                wakes=[names.signal(name)],
                deadline_ms=deadline,
            )
        if outcome.get("call_id") != self.call_id:
            raise WaitNameTaken(
                f"signal {name!r} of run {self.run_id!r} was consumed by call "
                f"{outcome.get('call_id')!r}; a signal is consumed once: await another name"
            )
        if outcome.get("outcome") == OUTCOME_TIMEOUT:
            return TimedOut(name, _at(deadline))
        return outcome.get("payload")

    def receive(self, channel: str) -> ChannelMessage:
        names.validate_channel(channel)
        self._check(channel, "ctx.receive")
        records = self.journal.records(self.run_id)
        found = _first_unacked(records, channel)
        if found is not None:
            return found
        count = len(channel_messages(records, channel))
        name = names.receiving(channel, count)
        if self.journal.get(self.run_id, name) is None:
            body = {"kind": CHANNEL, "channel": channel, "count": count}
            _, inserted = self.journal.write(
                self.run_id,
                name,
                {**body, "call_id": self.call_id, "tool": self.tool_name},
                fence=self.fence,
            )
            if inserted:
                failpoints.hit(f"after-receiving:{channel}")
        # Written first, then looked at again: an enqueue writes its message, then looks for
        # this record, so one of the two sees the other and a message never goes unnoticed.
        found = _first_unacked(self.journal.records(self.run_id), channel)
        if found is not None:
            return found
        raise ChannelPending(
            f"run {self.run_id!r} waits for a message on channel {channel!r}",
            run_id=self.run_id,
            waits=[channel],
            wakes=[],
            channel=channel,
        )

    def ack(self, channel: str, key: str) -> bool:
        names.validate_channel(channel)
        names.validate_channel(key)
        if self.journal.get(self.run_id, names.message(channel, key)) is None:
            raise WaitError(
                f"ack {key!r} on channel {channel!r}: run {self.run_id!r} has no such message"
            )
        body = {"kind": "ack", "channel": channel, "key": key, "call_id": self.call_id}
        rec, inserted = self.journal.write(
            self.run_id, names.ack(channel, key), body, fence=self.fence
        )
        return inserted or rec.get("call_id") == self.call_id

    def sleep(self, name: str, seconds: float) -> datetime:
        self._check(name, "ctx.sleep")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise WaitError(f"sleep {name!r}: seconds is a non-negative number")
        now_ms = _ms(self.store.now())
        return self._timer(name, now_ms, now_ms + int(seconds * 1000))

    def wait_until(self, name: str, when: datetime) -> datetime:
        self._check(name, "ctx.wait_until")
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise WaitError(f"wait_until {name!r}: when is a timezone-aware datetime")
        return self._timer(name, _ms(self.store.now()), _ms(when))

    def _timer(self, name: str, now_ms: int, wake_ms: int) -> datetime:
        # The first encounter fixes the wake time; later ones read it back.
        request = self._request(name, {"kind": TIMER, "wake_ms": wake_ms})
        wake_ms = int(request.get("wake_ms"))
        if self.journal.get(self.run_id, names.waited(name)) is None:
            if now_ms < wake_ms:
                raise TimerPending(
                    f"run {self.run_id!r} sleeps on {name!r} until {_at(wake_ms).isoformat()}",
                    run_id=self.run_id,
                    waits=[name],
                    wakes=[],
                    wake_ms=wake_ms,
                )
            self._resolve(name, {"outcome": OUTCOME_WOKE, "woke_ms": now_ms})
        return _at(wake_ms)

    # -- the journal ----------------------------------------------------------------------

    def _check(self, name: str, what: str) -> None:
        names.validate_wait_name(name)
        if not self.retry_safe:
            raise WaitNotRetrySafe(
                f"tool {self.tool_name!r} calls {what}({name!r}) but is not retry-safe: a "
                "waiting tool runs again from the top once the wait resolves, so its side "
                "effects would repeat. Put the wait in its own tool marked read_only=True, "
                "idempotent=True or idempotency_key=...",
            )

    def _request(self, name: str, body: dict[str, Any]) -> Record:
        rec = self.journal.get(self.run_id, names.wait(name))
        if rec is None:
            full = {**body, "name": name, "call_id": self.call_id, "tool": self.tool_name}
            refuse_nul(full, f"wait {name!r}")
            rec, inserted = self.journal.write(
                self.run_id, names.wait(name), full, fence=self.fence
            )
            if inserted:
                failpoints.hit(f"after-wait:{name}")
        if rec.get("call_id") != self.call_id or rec.get("kind") != body["kind"]:
            raise WaitNameTaken(
                f"run {self.run_id!r} already has a wait called {name!r} ({rec.get('kind')} "
                f"of call {rec.get('call_id')!r}, tool {rec.get('tool')!r}); a wait name is "
                "one wait in its run: use another name"
            )
        return rec

    def _resolve(self, name: str, body: dict[str, Any]) -> Record:
        full = {"kind": "waited", "name": name, "call_id": self.call_id, **body}
        rec, _ = self.journal.write(self.run_id, names.waited(name), full, fence=self.fence)
        return rec


def latest_question(
    journal: Journal, run_id: str, name: str, first: Record | None = None
) -> tuple[int, Record | None]:
    """The question the interrupt ``name`` asks last (its number and ``wait:`` record; the
    first one's is ``first`` if already read), or ``(1, None)`` if it asked none."""
    rec = first if first is not None else journal.get(run_id, names.wait(name))
    ask = 1
    while rec is not None and rec.get("kind") == INTERRUPT:
        later = journal.get(run_id, names.wait(name, ask + 1))
        if later is None:
            break
        ask, rec = ask + 1, later
    return ask, rec


def same_question(rec: Record | None, prompt: str, schema: Any) -> bool:
    """Whether a question's ``wait:`` record asks ``prompt`` with answer ``schema``."""
    return (
        rec is not None
        and rec.get("prompt") == prompt
        and encode(rec.get("schema")) == encode(schema)
    )


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _at(ms: Any) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)


@dataclass(frozen=True)
class OpenWait:
    """A wait of a paused run that nothing resolved yet."""

    kind: str
    name: str
    call_id: str
    tool: str
    prompt: str = ""
    schema: Any = None
    deadline: datetime | None = None
    signal_delivered: bool = False


def open_waits(records: list[Record]) -> list[OpenWait]:
    """The waits in ``records`` (a run's journal) with no resolution yet; of an interrupt
    asked again with another question, the last question only."""
    by_name = {r.name: r for r in records}
    asked: dict[str, int] = {}
    for rec in records:
        if rec.name.startswith(names.WAIT) and rec.get("kind") == INTERRUPT:
            name = str(rec.get("name"))
            asked[name] = max(asked.get(name, 1), int(rec.get("ask") or 1))
    out = []
    waiting: set[str] = set()
    for rec in records:
        parsed = names.parse_receiving(rec.name)
        if parsed is not None:
            channel, count = parsed
            if len(channel_messages(records, channel)) <= count and channel not in waiting:
                waiting.add(channel)
                out.append(
                    OpenWait(
                        kind=CHANNEL,
                        name=channel,
                        call_id=str(rec.get("call_id")),
                        tool=str(rec.get("tool") or ""),
                    )
                )
            continue
        if not rec.name.startswith(names.WAIT):
            continue
        name = str(rec.get("name"))
        if rec.get("kind") == INTERRUPT:
            ask = int(rec.get("ask") or 1)
            if ask < asked[name] or names.interrupt_answer(name, ask) in by_name:
                continue  # asked again since with another question, or answered
            if rec.get("live") and names.tool(str(rec.get("call_id"))) in by_name:
                continue  # an MCP server's question whose call has its result: nobody asks
        elif names.waited(name) in by_name:
            continue
        deadline = rec.get("wake_ms") if rec.get("kind") == TIMER else rec.get("deadline_ms")
        out.append(
            OpenWait(
                kind=str(rec.get("kind")),
                name=name,
                call_id=str(rec.get("call_id")),
                tool=str(rec.get("tool") or ""),
                prompt=str(rec.get("prompt") or ""),
                schema=rec.get("schema"),
                deadline=_at(deadline) if deadline is not None else None,
                signal_delivered=names.signal(name) in by_name,
            )
        )
    return out


@dataclass(frozen=True)
class KeptSignal:
    """A delivered signal no wait consumed yet (it arrived early, or nothing awaits it)."""

    name: str
    payload: Any
    at_ms: int | None
    by: str | None


def kept_signals(records: list[Record]) -> list[KeptSignal]:
    """The signals in ``records`` (a run's journal) that no ``waited:<name>`` consumed."""
    resolved = {r.name for r in records if r.name.startswith(names.WAITED)}
    out = []
    for rec in records:
        if not rec.name.startswith(names.SIGNAL):
            continue
        name = str(rec.get("name"))
        if names.waited(name) in resolved:
            continue
        at = rec.get("at")
        by = rec.get("by")
        out.append(
            KeptSignal(
                name,
                rec.get("payload"),
                int(at) if at is not None else None,
                str(by) if by is not None else None,
            )
        )
    return out


def all_answered(records: list[Record]) -> bool:
    """True when a paused run's journal holds waits and every one of them is answered: each
    question has its answer, each awaited signal was delivered, each channel a call reads
    has a message for it — and no sub-run of its own is unsettled (a parent paused on its
    child waits for the child, not for the outside). Such a run waits for nothing: whoever
    recorded the last answer died before handing the run over (the record commits first,
    the hand-over follows), and the run must be driven now."""
    if not any(r.name.startswith(names.WAIT) or names.parse_receiving(r.name) for r in records):
        return False
    if any(not (w.kind == SIGNAL and w.signal_delivered) for w in open_waits(records)):
        return False
    recorded = {r.name for r in records}
    return not any(
        r.name.startswith(names.CHILD) and names.tool(str(r.get("call_id"))) not in recorded
        for r in records
    )


def next_wake(records: list[Record]) -> datetime | None:
    """The earliest instant a paused run's journal says it should be driven again: a timer's
    wake time or a signal's deadline (None: nothing timed is open)."""
    times = [w.deadline for w in open_waits(records) if w.deadline is not None]
    return min(times, default=None)
