"""The journal's vocabulary: every record name, and the bodies more than one module writes.

This module is the bottom of the engine (it imports only ``errors``), so every other
module, ``records`` included, may use it.

A record's name is its identity (unique per run, first writer wins), so a name spelled two
ways would be two records. Every module builds names and shared bodies here; none spells a
journal name as a string literal. The table in docs/journal.md ("Journal names") lists
what each record holds.

Also here: the ids the engine derives from a session (``<session>>turn/<n>``,
``<session>>event/<key>``, ``<session>>session``) — names too, of runs.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any
from urllib.parse import quote

from .errors import ConfigError

# -- a run's journal ---------------------------------------------------------------------

HEADER = "@journal"  # the journal's format version, first record of every run
RUN_START = "run:start"
RUN_COMPLETE = "run:complete"
RUN_CANCELLED = "run:cancelled"
RUN_COMPENSATED = "run:compensated"  # terminal: a saga's rollback is over (its cause, undos)
SAGA_ABORT = "saga:abort"  # a saga run failed for good: from now on it only rolls back
FORK = "fork"  # a fork's source, origin, step and patch (a forked session's too)
FORK_DONE = "fork:done"  # the fork is completely copied: from now on it may be driven

MODEL = "model:"
TOOL = "tool:"
ATTEMPT = "attempt:"
NOT_STARTED = "not-started:"
APPROVAL = "approval:"
RULE = "rule:"  # which approval rule asked about a call's arguments (``engine.rules``), once
DEADLINE = "deadline:"  # a pending request's deadline step: remind, escalate, expire (once each)
STEP = "step:"
USER = "user:"
WAIT = "wait:"  # a tool asked a question or awaits a signal (its request, first writer wins)
INPUT = "input:"  # a person's answer to an interrupt (first answer wins)
SIGNAL = "signal:"  # a signal delivered to the run (first payload wins), awaited or not yet
WAITED = "waited:"  # how an awaited signal resolved: its payload, or the timeout (once)
MESSAGE = "message:"  # a message enqueued on one of the run's channels (first payload per key)
ACK = "ack:"  # a channel's message consumed, by which call (once)
RECEIVING = "receiving:"  # a receive found its channel empty: the run waits for a message
COMPENSATE = "compensate:"  # a saga undid a call (``undo``'s outcome), at most once
CHILD = "child:"  # a call started a sub-run (``agent.as_tool()``): its id and agent
HANDLE = "handle:"  # a call's work is held elsewhere (an MCP task id): resume waits on it
# "@..." records are evidence beside the run's steps, never replayed into its transcript.
SPEND = "@spend/"
LATE = "@late/"
DRIFT = "@drift/"
TAKEOVER = "@takeover/"  # a driver took the run's lease over from another holder
UNKNOWN = "@unknown/"  # what a tool said when it could not tell whether its effect happened
PROGRESS = "@progress/"  # how far a call in flight had got, for people following the run


def child(call_id: str) -> str:
    """The sub-run a call started."""
    return f"{CHILD}{call_id}"


def handle(call_id: str) -> str:
    """Where a call's work is held while it runs elsewhere (``engine.handles``)."""
    return f"{HANDLE}{call_id}"


def progress(call_id: str, nonce: str, n: int) -> str:
    """The ``n``-th progress note of one run of a call (``nonce``: that run's, so a call
    run again after a crash writes notes of its own)."""
    return f"{PROGRESS}{call_id}/{nonce}/{n}"


def model(n: int) -> str:
    """The n-th model response."""
    return f"{MODEL}{n}"


def tool(call_id: str) -> str:
    """A call's outcome."""
    return f"{TOOL}{call_id}"


def step(name: str) -> str:
    """A durable step's value (``Journal.step``); also the step's op id in halts."""
    return f"{STEP}{name}"


def is_step(op_id: str) -> bool:
    return op_id.startswith(STEP)


def compensate(call_id: str) -> str:
    """The undo of a saga's call: its op id (attempts, halts) and where its outcome is."""
    return f"{COMPENSATE}{call_id}"


def is_compensation(op_id: str) -> bool:
    return op_id.startswith(COMPENSATE)


def result(op_id: str) -> str:
    """Where an op's outcome is recorded: ``tool:<call>``, or the op's own name (a step's,
    an undo's)."""
    return op_id if is_step(op_id) or is_compensation(op_id) else tool(op_id)


def attempt(op_id: str, k: int) -> str:
    """The k-th claim of a non-retry-safe op, written just before it runs."""
    return f"{ATTEMPT}{op_id}:{k}"


def not_started(op_id: str, k: int) -> str:
    """The k-th claim provably never ran its effect (a durable step whose function raised):
    the claim is released and the next attempt is ``k + 1``."""
    return f"{NOT_STARTED}{op_id}:{k}"


def parse_attempt(name: str) -> tuple[str, int] | None:
    """``(op_id, k)`` of an attempt name, or None for any other name."""
    if not name.startswith(ATTEMPT):
        return None
    op, _, number = name[len(ATTEMPT) :].rpartition(":")
    return (op, int(number)) if number.isdigit() else None


def user(step_number: int) -> str:
    """A user message a fork appended after step ``step_number``."""
    return f"{USER}{step_number}"


_WAIT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def validate_wait_name(name: object) -> str:
    """A wait's name (an interrupt's or a signal's): the caller's own, unique in its run."""
    if not isinstance(name, str) or not _WAIT_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid wait name {name!r}: a wait name is 1-100 characters of A-Za-z0-9_.- "
            "(e.g. 'warehouse' or 'payment.confirmed')",
            code="config.wait_name",
        )
    return name


def wait(name: str, ask: int = 1) -> str:
    """The request of the wait called ``name``: what it asks, by which call. An interrupt
    whose tool asks under the same name with another prompt or schema asks a new question,
    the ``ask``-th (``wait:<name>#<ask>``): an answer is for the question it was given to."""
    return f"{WAIT}{name}" if ask == 1 else f"{WAIT}{name}#{ask}"


def interrupt_answer(name: str, ask: int = 1) -> str:
    """The answer a person gave to the ``ask``-th question of the interrupt ``name``."""
    return f"{INPUT}{name}" if ask == 1 else f"{INPUT}{name}#{ask}"


def signal(name: str) -> str:
    """The signal called ``name`` as delivered (before or after anyone awaits it)."""
    return f"{SIGNAL}{name}"


def waited(name: str) -> str:
    """How the await of signal ``name`` resolved: delivered or timed out, decided once."""
    return f"{WAITED}{name}"


def validate_channel(channel: object) -> str:
    """A channel's name, or a message's key on it: same alphabet as a wait's name."""
    if not isinstance(channel, str) or not _WAIT_NAME.fullmatch(channel):
        raise ConfigError(
            f"invalid channel or message key {channel!r}: 1-100 characters of A-Za-z0-9_.- "
            "(e.g. 'replies' or 'evt_123')",
            code="config.channel_name",
        )
    return channel


def message(channel: str, key: str) -> str:
    """The message ``key`` enqueued on ``channel`` (first payload wins)."""
    return f"{MESSAGE}{channel}:{key}"


def message_key(channel: str, name: str) -> str | None:
    """The key of a ``message:`` record name on ``channel`` (None: another record)."""
    prefix = f"{MESSAGE}{channel}:"
    return name[len(prefix) :] if name.startswith(prefix) else None


def ack(channel: str, key: str) -> str:
    """The message ``key`` of ``channel`` was consumed (by the call the record names)."""
    return f"{ACK}{channel}:{key}"


def receiving(channel: str, count: int) -> str:
    """A receive on ``channel`` found its ``count`` messages all acked: the run waits for
    message number ``count + 1``."""
    return f"{RECEIVING}{channel}:{count}"


def parse_receiving(name: str) -> tuple[str, int] | None:
    """``(channel, count)`` of a ``receiving:`` name, or None for any other name."""
    if not name.startswith(RECEIVING):
        return None
    channel, _, count = name[len(RECEIVING) :].rpartition(":")
    return (channel, int(count)) if count.isdigit() else None


def drift(fingerprint_hash: str) -> str:
    """The agent changed under the run (fingerprint ``fingerprint_hash`` took over)."""
    return f"{DRIFT}{fingerprint_hash}"


def takeover(nonce: str) -> str:
    """A driver took the lease over from another holder (whose lease had expired)."""
    return f"{TAKEOVER}{nonce}"


def spend(n: int, nonce: str) -> str:
    """What a discarded model response cost (each billed response is recorded once)."""
    return f"{SPEND}{n}/{nonce}"


def late(call_id: str, attempt: int) -> str:
    """A call's result that arrived after its driver lost the run: kept as evidence."""
    return f"{LATE}{call_id}/{attempt}"


def unknown(attempt_name: str) -> str:
    """Why the attempt ``attempt_name``'s outcome is unknown, in the tool's words (it raised
    ``ToolOutcomeUnknown``): evidence for the person resolving the halt, never a result."""
    return f"{UNKNOWN}{attempt_name}"


def decision(call_id: str, arguments_tag: str | None = None) -> str:
    """The decision on a gated call: ``approval:<call>`` the first time it is asked; when it
    is asked again for other arguments, one name per argument set (``arguments_tag``)."""
    if arguments_tag is None:
        return f"{APPROVAL}{call_id}"
    return f"{APPROVAL}{call_id}:{arguments_tag}"


def rule(call_id: str, arguments_tag: str | None = None) -> str:
    """Which rule asked about a gated call: ``rule:<call>`` for the arguments it was first
    asked about; ``rule:<call>:<tag>`` for others (an approver's edit, a deploy's change)."""
    if arguments_tag is None:
        return f"{RULE}{call_id}"
    return f"{RULE}{call_id}:{arguments_tag}"


DEADLINE_STEPS = ("remind", "escalate", "expire")


def deadline(call_id: str, step: str, arguments_tag: str | None = None) -> str:
    """A pending request's deadline ``step``: ``deadline:<call>:<step>``, or for a call
    asked again about other arguments ``deadline:<call>:<tag>:<step>``."""
    middle = f"{call_id}:{arguments_tag}" if arguments_tag else call_id
    return f"{DEADLINE}{middle}:{step}"


# -- record bodies written in more than one place ----------------------------------------


def new_incarnation() -> str:
    """A random nonce naming one start of a run, recorded in its ``run:start``: signed
    decisions bind it, so a signature made for a run that was deleted and started again
    under the same id (or forked) does not verify for the new one."""
    return secrets.token_hex(16)


def start_body(
    agent: str,
    input: Any,
    fingerprint: dict[str, Any],
    seed: list[dict[str, Any]] | None,
    tree: dict[str, Any] | None = None,
    *,
    saga: bool = False,
    requester: str | None = None,
) -> dict[str, Any]:
    """The ``run:start`` body: agent, input, fingerprint, and which start of the run id; a
    sub-run's also its ``parent`` and ``root`` run ids; a run started as a saga
    (``agent.run_saga``) ``saga: true``; a run a person started (``start(by=...)``, a
    session message they sent) ``requester``: their username, which an approval rule that
    separates duties reads (``engine.rules``)."""
    body: dict[str, Any] = {
        "kind": "start",
        "agent": agent,
        "input": input,
        "fingerprint": fingerprint,
        "incarnation": new_incarnation(),
    }
    if seed:
        body["seed"] = seed
    if tree:
        body.update(tree)
    if saga:
        body["saga"] = True
    if requester:
        body["requester"] = requester
    return body


def tool_body(
    call_id: str,
    name: str,
    result: Any,
    *,
    is_error: bool,
    read_only: bool = False,
    reconciled: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """The ``tool:<call>`` body: a call's outcome, from its run, a fork's patch, or a person
    who resolved a halt (``reconciled``, with ``evidence`` and ``by``)."""
    return {
        "kind": "tool",
        "call_id": call_id,
        "name": name,
        "result": result,
        "is_error": is_error,
        "read_only": read_only,
        "reconciled": reconciled,
        **extra,
    }


def cancelled_body(
    by: Any, by_id: Any, reason: str, *, cause: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``run:cancelled`` body: who cancelled the run (a person, the deadline of a
    request, or an ancestor's canceller) and why; a cancel that came from above also its
    ``cause``."""
    body: dict[str, Any] = {"kind": "cancelled", "by": by, "by_id": by_id, "reason": reason}
    if cause is not None:
        body["cause"] = cause
    return body


def abort_body(
    cause: dict[str, Any],
    *,
    calls: list[str] | None = None,
    by: str | None = None,
    by_id: Any = None,
    reason: str = "",
) -> dict[str, Any]:
    """The ``saga:abort`` body: its ``cause`` (the run's last error while it rolls back); a
    saga's own abort also the ``calls`` it plans to undo, a person's (``by``) who and why."""
    body: dict[str, Any] = {"kind": "saga_abort", "cause": cause}
    if calls is not None:
        body["calls"] = calls
    if by is not None:
        body.update(by=by, by_id=by_id, reason=reason)
    return body


# -- a session's journal and the runs it derives -----------------------------------------

SESSION_FORK = FORK
TURN = "turn:"
EVENT = "event:"
ANSWER = "answer:"

_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_KEY_LENGTH = 500


def validate_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise ConfigError(
            f"invalid session id {session_id!r}: a session id is 1-128 characters of "
            "A-Za-z0-9_- (a chat or ticket id from your own data)",
            code="config.session_id",
        )
    return session_id


_SESSION_CHANNEL = re.compile(r"[A-Za-z0-9_.:\-]{1,100}")
SITE_CHANNEL = "site"  # a session opened by the site's own code (``agent.session(id)``)
API_CHANNEL = "api"  # a session opened through the HTTP API


def validate_session_channel(channel: object) -> str:
    """A session's channel (docs/sessions.md, "Who a session belongs to"): the name of the
    way its messages come in (a webhook view, the API, the site's own code)."""
    if not isinstance(channel, str) or not _SESSION_CHANNEL.fullmatch(channel):
        raise ConfigError(
            f"invalid channel {channel!r}: a channel is 1-100 characters of A-Za-z0-9_.:- "
            "(a name for where a session's messages come from, like 'webhook:slack')",
            code="config.channel",
        )
    return channel


def encode_key(key: object) -> str:
    """A delivery key as it appears in a run id: any key is allowed; long ones are hashed."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ConfigError(
            f"invalid delivery key {key!r}: a key is a non-empty string of at most "
            f"{MAX_KEY_LENGTH} characters (a webhook's delivery id)",
            code="config.delivery_key",
        )
    encoded = quote(key, safe="")
    if encoded in (".", ".."):  # a run id's part is never a path's '.' or '..'
        encoded = encoded.replace(".", "%2E")
    if len(encoded) > 200:
        encoded = "sha256-" + hashlib.sha256(key.encode()).hexdigest()
    return encoded


SESSION_JOURNAL_SUFFIX = ">session"


def session_journal(session_id: str) -> str:
    """The run id of a session's own journal (turns, deliveries, answers)."""
    return f"{session_id}{SESSION_JOURNAL_SUFFIX}"


def turn_run(session_id: str, n: int) -> str:
    return f"{session_id}>turn/{n}"


def event_run(session_id: str, encoded_key: str) -> str:
    return f"{session_id}>event/{encoded_key}"


def session_of(run_id: str) -> str | None:
    """The session a turn's run belongs to, or None for any other run."""
    sid, sep, rest = run_id.partition(">")
    if sep and (rest.startswith("turn/") or rest.startswith("event/")):
        return sid
    return None


def turn(n: int) -> str:
    return f"{TURN}{n}"


def event(encoded_key: str) -> str:
    return f"{EVENT}{encoded_key}"


def answer(run_id: str) -> str:
    return f"{ANSWER}{run_id}"
