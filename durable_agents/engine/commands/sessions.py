"""Sessions: durable conversations, one run per turn.

Each turn runs as its own run — ``<session>>turn/<n>`` for ``send``, ``<session>>event/<key>``
for ``send_once`` — seeded with the transcript before it (recorded in the turn's
``run:start``, so a turn resumed after a crash sees exactly what its earlier model calls
saw). The session's own journal, ``<session>>session``, records which message started each
turn and each finished turn's answer, so the transcript rebuilds after a restart.

``send_once(key, text)`` is the webhook path: the intake is recorded under the delivery key
(first writer wins) before anything runs, so the same delivery arriving twice — or ten
times at once, or after a worker crash — opens one turn and never repeats a side effect.

A session belongs to one agent and one channel (docs/sessions.md, "Who a session belongs
to"): the agent and the channel that opened it are on its journal's row, and a message of
another agent or from another channel — another webhook's sender, the API, the site's own
code — is refused before anything is read or written.

A turn that ends for good without an answer (cancelled, or failed with an error no retry
can fix, like ``budget.max_turns``) is closed in the transcript, marked as such, when the
next message arrives: the next ``send`` starts a new turn instead of being refused forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import failpoints, identity, lifecycle, names, runtime
from ..definition import AgentDefinition, RunResult
from ..errors import (
    ApprovalPending,
    ConfigError,
    Conflict,
    NotFound,
    Pause,
    RunBusy,
    SessionNotYours,
)
from ..imported import NEW_REQUEST_FIX, refuse_inert
from ..journal import Journal
from ..loop import drive
from ..model import Message
from ..names import encode_key, session_of, validate_session_id
from ..ports import (
    AWAITING_APPROVAL,
    CANCELLED,
    FAILED,
    FINISHED,
    HUMAN_WAIT_STATUSES,
    KIND_SESSION,
    RunInfo,
    Store,
)
from ..records import Record
from ..session_log import SessionLog
from .forks import fork_session
from .runs import create_run, record_answer

__all__ = [
    "SendResult",
    "Session",
    "channel_of",
    "encode_key",
    "give_session",
    "record_answer",
    "session_of",
    "validate_session_id",
]


def channel_of(journal_run: RunInfo) -> str:
    """The channel that owns a session, from its journal's row (a row written before
    sessions had owners says nothing: migration 0021 gave each one)."""
    body = journal_run.input if isinstance(journal_run.input, dict) else {}
    return str(body.get("channel") or names.SITE_CHANNEL)


@dataclass(frozen=True)
class SendResult:
    """What ``send_once`` did: ``queued`` (the turn was handed to a driver), ``answered``
    (the turn finished; ``answer`` holds it), ``paused`` (it waits, e.g. on an approval) or
    ``running`` (``wait=True``: another delivery of the same key is driving the turn, and it
    had not finished when ``timeout`` ran out)."""

    session_id: str
    key: str
    run_id: str
    status: str
    answer: str | None = None


class Session:
    """A durable conversation with one agent. Get one with ``agent.session(id)``."""

    def __init__(
        self,
        agent: AgentDefinition,
        session_id: str,
        *,
        store: Store | None = None,
        channel: str = names.SITE_CHANNEL,
    ) -> None:
        self.agent = agent
        self.session_id = validate_session_id(session_id)
        self.channel = names.validate_session_channel(channel)
        self._store = store
        self._owned = False  # checked once: a session's owner never changes

    @property
    def store(self) -> Store:
        return self._store or runtime.store()

    @property
    def journal_id(self) -> str:
        return names.session_journal(self.session_id)

    # -- reading ----------------------------------------------------------------------

    def _records(self) -> list[Record]:
        if not self._owned:
            self._check_owner(self.store.get_run(self.journal_id))
        return Journal(self.store).records(self.journal_id)

    def _check_owner(self, journal_run: RunInfo | None) -> None:
        """Refuse a session of another agent (409 ``session.agent_mismatch``) or channel
        (403 ``session.other_channel``); a session not opened yet belongs to nobody."""
        if journal_run is None:
            return
        if journal_run.agent != self.agent.name:
            raise Conflict(
                f"session {self.session_id!r} talks to agent {journal_run.agent!r}, not "
                f"{self.agent.name!r}; a session belongs to the agent that opened it",
                code="session.agent_mismatch",
            )
        if channel_of(journal_run) != self.channel:
            # The owner's name is not said: the caller may be another webhook's sender.
            raise SessionNotYours(
                f"session {self.session_id!r} belongs to another channel than "
                f"{self.channel!r}; a session takes messages only from the channel that "
                "opened it (docs/sessions.md)"
            )
        self._owned = True

    def _log(self) -> SessionLog:
        return SessionLog.of(self._records())

    def history(self) -> list[Message]:
        """The user/assistant transcript of the closed turns, in the order they closed. A
        turn that ended without an answer (cancelled, failed for good) keeps its message,
        and its reply says so: ``[this turn did not finish: ...]``."""
        return self._log().history()

    @property
    def turns(self) -> int:
        return len(self._log().closed)

    def open_turn(self) -> Record | None:
        """The latest ``send`` turn that has no answer yet."""
        send = self._log().open_send()
        return send.record if send is not None else None

    def fork(self, from_turn: int, new_session_id: str | None = None) -> Session:
        """A new session whose transcript is this one's first ``from_turn`` turns, of the
        same agent and channel."""
        return Session(
            self.agent,
            fork_session(self, from_turn, new_session_id),
            store=self._store,
            channel=self.channel,
        )

    # -- writing ----------------------------------------------------------------------

    def _ensure_journal(self) -> bool:
        """Open the session's journal unless it is open; True if this call opened it."""
        store = self.store
        existing = store.get_run(self.journal_id)
        refuse_inert(existing, "send the session a message")  # an imported transcript
        if existing is None:
            # Created in its final state, in one write, with its owner: a session's journal
            # is a record, never work to drive, and a crash can leave no half-made row (nor
            # a session without an owner) behind.
            created = store.create_run(
                lifecycle.created(
                    FINISHED,
                    run_id=self.journal_id,
                    agent=self.agent.name,
                    session_id=self.session_id,
                    input={"session": self.session_id, "channel": self.channel},
                    kind=KIND_SESSION,
                )
            )
            if not created:  # another channel may have opened it first
                existing = store.get_run(self.journal_id)
            failpoints.hit("after-session-journal")
        self._check_owner(existing)
        return existing is None

    def _seed(self) -> list[dict[str, Any]]:
        return [m.to_json() for m in self.history()]

    def send(self, text: str) -> RunResult:
        """One turn, driven here. While a turn is open (paused, failed), only the same
        message resumes it; another message is refused, naming the open turn."""
        return self._drive(self._claim_turn(text), text)

    def submit(self, text: str, *, by: Any = None) -> str:
        """One turn, handed to a driver after the current transaction commits (a worker,
        with Celery dispatch); returns the turn's run id. Open turns as for ``send``.
        Given ``by``, the message is logged as theirs (``send``)."""
        actor = identity.resolve(by) if by is not None else None
        run_id = self._claim_turn(text)
        if self.store.get_run(run_id) is None:
            self._start_turn(run_id, text, actor.username if actor is not None else None)
        if actor is not None:
            self.store.log_action(identity.logged(actor, "send", run_id, self.session_id))
        runtime.dispatch(run_id)
        return run_id

    def _start_turn(self, run_id: str, text: str, requester: str | None = None) -> None:
        """Create the turn's run, seeded with the transcript as it stands now; ``requester``:
        the person who sent the message, when one did (``by``)."""
        create_run(
            self.agent,
            text,
            run_id,
            store=self.store,
            derived_id=True,
            seed=self._seed(),
            session_id=self.session_id,
            requester=requester,
        )

    def _claim_turn(self, text: str) -> str:
        """The run id of the turn ``text`` belongs to: the open one, or a new one."""
        if not isinstance(text, str) or not text:
            raise ConfigError("a message is a non-empty string", code="config.input")
        self._ensure_journal()
        open_turn = self.open_turn()
        if open_turn is not None and self._close_if_over(open_turn):
            open_turn = None
        if open_turn is not None:
            if open_turn.get("input") != text:
                self._refuse_new_input(open_turn)
            return str(open_turn.get("run_id"))
        n = self._log().sends + 1
        run_id = names.turn_run(self.session_id, n)
        record, _ = Journal(self.store).write(
            self.journal_id, names.turn(n), {"kind": "turn", "input": text, "run_id": run_id}
        )
        if record.get("input") != text:  # another sender took turn n first
            self._refuse_new_input(record)
        return run_id

    def _close_if_over(self, turn: Record) -> bool:
        """Close a turn that can never answer (cancelled, or failed with an error that no
        retry fixes), keeping it in the transcript marked as such. True if it is closed."""
        run_id = str(turn.get("run_id"))
        run = self.store.get_run(run_id)
        if run is None:
            return False
        error = dict(run.last_error or {})
        if run.status == CANCELLED:
            outcome = "cancelled"
        elif run.status == FAILED and (
            not error.get("retryable") or run.attempts >= runtime.retry_policy().max_attempts
        ):
            outcome = "failed"
        else:
            return False
        Journal(self.store).write(
            self.journal_id,
            names.answer(run_id),
            {
                "kind": "answer",
                "run_id": run_id,
                "input": turn.get("input"),
                "answer": None,
                "outcome": outcome,
                "error": error or None,
            },
        )
        return True

    def _refuse_new_input(self, open_turn: Record) -> None:
        run_id = str(open_turn.get("run_id"))
        run = self.store.get_run(run_id)
        if run is not None and run.status == AWAITING_APPROVAL:
            requests = self.store.list_approval_requests(run_id=run_id)
            calls = ", ".join(f"{r.call_id!r} ({r.tool_name})" for r in requests) or "a call"
            raise ApprovalPending(
                f"session {self.session_id!r} awaits approval of {calls} in turn {run_id!r}; "
                "decide it with durable_agents.approve(...), in the admin, or with a command "
                "`python manage.py durable_agents runs` prints, before sending a "
                "new message",
                run_id=run_id,
                calls=[r.call_id for r in requests],
            )
        raise Conflict(
            f"session {self.session_id!r} has an open turn {run_id!r} for the message "
            f"{open_turn.get('input')!r}; send that message again to resume it, or resolve "
            "what it waits on first",
            code="session.turn_open",
            run_id=run_id,
        )

    def _drive(self, run_id: str, text: str) -> RunResult:
        result = drive(
            self.agent,
            run_id,
            text,
            store=self.store,
            derived_id=True,
            seed=self._seed(),
            meta={"session_id": self.session_id},
        )
        record_answer(self.store, run_id, text, result.answer)
        return result

    def send_once(
        self, key: str, text: str, *, wait: bool = False, timeout: float = 30.0, by: Any = None
    ) -> SendResult:
        """Record an inbound message under its delivery key and run its turn once.

        A key whose turn finished returns that answer without running anything; a key
        whose turn is unfinished resumes that same turn; the same key with another message
        is refused. The intake is written before this returns; the turn is handed to a
        driver after the current transaction commits (``wait=True`` drives it here). With
        ``wait=True``, a duplicate delivery that finds the turn being driven by another
        waits (at most ``timeout`` seconds) for that turn and returns its outcome: it never
        raises ``RunBusy``; still running at the timeout, it returns ``running``.

        Given ``by``, every delivery is logged as theirs (``send_once``), redeliveries too:
        each one may hand the turn over again.
        """
        actor = identity.resolve(by) if by is not None else None
        requester = actor.username if actor is not None else None
        sent = self._send_once(key, text, wait=wait, timeout=timeout, requester=requester)
        if actor is not None:
            said = {"key": key, "status": sent.status}
            self.store.log_action(
                identity.logged(actor, "send_once", sent.run_id, self.session_id, said)
            )
        return sent

    def _send_once(
        self, key: str, text: str, *, wait: bool, timeout: float, requester: str | None = None
    ) -> SendResult:
        if not isinstance(text, str) or not text:
            raise ConfigError("a message is a non-empty string", code="config.input")
        encoded = encode_key(key)
        run_id = names.event_run(self.session_id, encoded)
        self._ensure_journal()
        journal = Journal(self.store)
        intake, _ = journal.write(
            self.journal_id,
            names.event(encoded),
            {"kind": "event", "key": key, "input": text, "run_id": run_id},
        )
        if intake.get("input") != text:
            raise Conflict(
                f"delivery {key!r} of session {self.session_id!r} was first received with "
                "another message; a key names one message",
                code="session.key_conflict",
                run_id=run_id,
            )
        turn = self.store.get_run(run_id)
        # A delivery is never answered from a file imported at its turn's id.
        refuse_inert(turn, "answer a delivery with it", where="here", fix=NEW_REQUEST_FIX)
        done = journal.get(run_id, names.RUN_COMPLETE) if turn else None
        if done is not None:
            record_answer(self.store, run_id, text, str(done.get("answer") or ""))
            return SendResult(self.session_id, key, run_id, "answered", done.get("answer"))
        if turn is None or journal.get(run_id, names.RUN_START) is None:
            run = self.store.get_run(run_id)
            if run is None or run.status not in HUMAN_WAIT_STATUSES:
                self._start_turn(run_id, text, requester)
        # Read last, right before the hand-over: a driver may have paused the turn while
        # the reads above ran (found by the simulator: a halted turn handed over again).
        run = self.store.get_run(run_id)
        if run is not None and run.status in HUMAN_WAIT_STATUSES:
            # Waiting on a person: driving it again would only pause again.
            return SendResult(self.session_id, key, run_id, "paused")
        if wait:
            return self._wait_for_turn(key, run_id, text, timeout)
        runtime.dispatch(run_id)
        return SendResult(self.session_id, key, run_id, "queued")

    def _wait_for_turn(self, key: str, run_id: str, text: str, timeout: float) -> SendResult:
        deadline = runtime.monotonic() + timeout
        journal = Journal(self.store)
        while True:
            try:
                result = self._drive(run_id, text)
            except Pause:
                return SendResult(self.session_id, key, run_id, "paused")
            except RunBusy:
                # Another delivery of this key is driving the turn: its outcome is ours.
                done = journal.get(run_id, names.RUN_COMPLETE)
                if done is not None:
                    answer = str(done.get("answer") or "")
                    record_answer(self.store, run_id, text, answer)
                    return SendResult(self.session_id, key, run_id, "answered", answer)
                run = self.store.get_run(run_id)
                if run is not None and run.status in HUMAN_WAIT_STATUSES:
                    return SendResult(self.session_id, key, run_id, "paused")
                if runtime.monotonic() >= deadline:
                    return SendResult(self.session_id, key, run_id, "running")
                runtime.sleep(0.05)
                continue
            return SendResult(self.session_id, key, run_id, "answered", result.answer)


def give_session(session_id: str, channel: str, *, by: Any, store: Store | None = None) -> str:
    """Give session ``session_id`` to ``channel`` from now on (a session opened before
    sessions had owners, by a webhook view with a secret of its own: docs/sessions.md);
    logged as ``by``'s ``session_channel``. Returns the channel it belonged to."""
    actor = identity.resolve(by)
    identity.require(actor, identity.OPERATE_RUNS, "give a session to another channel")
    validate_session_id(session_id)
    names.validate_session_channel(channel)
    store = store or runtime.store()
    journal_id = names.session_journal(session_id)
    run = store.get_run(journal_id)
    if run is None:
        raise NotFound(f"no session {session_id!r}", code="session.not_found")
    refuse_inert(run, "give the session to another channel")
    before = channel_of(run)
    body = dict(run.input) if isinstance(run.input, dict) else {"session": session_id}
    store.update_run(journal_id, {"input": {**body, "channel": channel}})
    said = {"from": before, "to": channel}
    store.log_action(identity.logged(actor, "session_channel", journal_id, session_id, said))
    return before
