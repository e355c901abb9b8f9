"""A session's journal (``<session>>session``) read as its conversation: the one decoder of
its records, for the engine (the history the model reads, the open turn, a fork's turns),
the API and the admin. (A run's own journal has its decoder in ``transcript.RunState``.)

The records: ``turn:<n>`` (a message ``send`` started, with its run), ``event:<key>`` (one
``send_once`` started), ``answer:<run>`` (how that run's turn closed: ``outcome``
``answered`` with its ``answer``, or how it ended without one, with its ``error``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import names
from .model import Message
from .records import Record

ANSWERED = "answered"


@dataclass(frozen=True)
class Started:
    """A message the session took: a ``send`` (``kind`` turn) or a ``send_once`` (event)."""

    kind: str
    run_id: str
    input: Any
    at: datetime | None
    record: Record


@dataclass(frozen=True)
class Closed:
    """A turn that closed, in the order turns closed."""

    run_id: str
    input: Any
    outcome: str
    answer: str | None
    error: Mapping[str, Any] | None
    at: datetime | None
    record: Record

    @property
    def reply(self) -> str:
        """What the conversation says the assistant replied: the answer, or that the turn
        did not finish (``[this turn did not finish: cancelled, run.cancelled]``)."""
        if self.outcome == ANSWERED:
            return str(self.answer)
        code = (self.error or {}).get("code")
        return f"[this turn did not finish: {self.outcome}" + (f", {code}]" if code else "]")


@dataclass
class SessionLog:
    started: list[Started] = field(default_factory=list)
    closed: list[Closed] = field(default_factory=list)

    @classmethod
    def of(cls, records: Iterable[Record]) -> SessionLog:
        log = cls()
        for rec in records:
            if rec.name.startswith(names.ANSWER):
                error = rec.get("error")
                log.closed.append(
                    Closed(
                        run_id=str(rec.get("run_id")),
                        input=rec.get("input"),
                        outcome=str(rec.get("outcome") or ANSWERED),
                        answer=rec.get("answer"),
                        error=error if isinstance(error, Mapping) else None,
                        at=rec.created_at,
                        record=rec,
                    )
                )
            elif rec.name.startswith((names.TURN, names.EVENT)):
                kind = "turn" if rec.name.startswith(names.TURN) else "event"
                log.started.append(
                    Started(kind, str(rec.get("run_id")), rec.get("input"), rec.created_at, rec)
                )
        return log

    def history(self) -> list[Message]:
        """The user/assistant transcript of the closed turns, in the order they closed."""
        out: list[Message] = []
        for turn in self.closed:
            out += [Message("user", str(turn.input)), Message("assistant", turn.reply)]
        return out

    def waiting(self) -> list[Started]:
        """The messages taken whose turn has not closed yet, in the order they came."""
        closed = {t.run_id for t in self.closed}
        return [s for s in self.started if s.run_id not in closed]

    def open_send(self) -> Started | None:
        """The latest ``send`` whose turn has not closed."""
        sends = [s for s in self.waiting() if s.kind == "turn"]
        return sends[-1] if sends else None

    @property
    def sends(self) -> int:
        """How many ``send`` turns the session has numbered (``turn:<n>``)."""
        return sum(1 for s in self.started if s.kind == "turn")
