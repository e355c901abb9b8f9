"""Where the engine tells an observer what it does: a drive, a model turn, a tool call, a
run created, a lease taken over. The engine calls these hooks; it imports no tracing
library. The default observer does nothing (a method call and an empty ``with`` per step);
the Django app installs one built on OpenTelemetry when ``DURABLE_AGENTS["TELEMETRY"]`` is
on (``durable_agents.otel``, docs/telemetry.md).

A hook must not change what the engine does: an observer that raises is the observer's
bug (the OpenTelemetry one catches its own errors where it touches the database)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from .errors import (
    DriveStopped,
    DurableAgentsError,
    LeaseLost,
    OutcomeUnknown,
    Pause,
    RunBusy,
    Throttled,
)

# How a span ended (its ``durable_agents.outcome`` attribute).
OK = "ok"
ERROR = "error"
PAUSED = "paused"
HALTED = "halted"
THROTTLED = "throttled"  # a limit was full (engine.limits): the run waits, not failed
FAILED = "failed"
BUSY = "busy"
LEASE_LOST = "lease_lost"
STOPPED = "stopped"


class Span:
    """What a hook yields: the step's span, on which the engine sets what it learns. The
    default one drops everything."""

    __slots__ = ()

    def set(self, **attributes: Any) -> None:
        """Add attributes (``outcome=...``, ``finish=...``); None values are dropped."""


class Observer:
    """The hooks the engine calls; this one does nothing. Each step hook is a context
    manager yielding a ``Span``; an observer sets the outcome of a step left with an
    exception from the exception (``outcome_of``), of one that returned ``ok`` unless the
    engine set another."""

    def drive(self, run_id: str, agent: str) -> AbstractContextManager[Span]:
        return _NOTHING

    def model_turn(self, run_id: str, n: int) -> AbstractContextManager[Span]:
        return _NOTHING

    def tool_call(
        self, run_id: str, call_id: str, tool: str, safety: str, attempt: int
    ) -> AbstractContextManager[Span]:
        return _NOTHING

    def run_created(self, run_id: str) -> None:
        """A new run's row was written (in the caller's transaction, if any): the place to
        remember who started it."""

    def takeover(self, run_id: str, reason: str) -> None:
        """This process took a run's lease over from a holder that died or expired."""


class _Nothing(AbstractContextManager[Span]):
    __slots__ = ()

    def __enter__(self) -> Span:
        return _SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_SPAN = Span()
_NOTHING = _Nothing()
_observer: Observer = Observer()


def observer() -> Observer:
    """The installed observer (the do-nothing one unless ``install`` was called)."""
    return _observer


def install(new: Observer | None) -> None:
    """Install ``new`` for this process (None: the do-nothing one again)."""
    global _observer
    _observer = new if new is not None else Observer()


def safety_class(safety: Any) -> str:
    """A tool's retry safety in one word: ``read_only``, ``idempotent``, ``keyed`` (an
    idempotency key of the caller's data) or ``side_effect`` (runs under an attempt claim;
    halts when its outcome is unknown)."""
    if safety.read_only:
        return "read_only"
    if safety.idempotent:
        return "idempotent"
    if safety.idempotency_key is not None:
        return "keyed"
    return "side_effect"


def outcome_of(exc: BaseException | None) -> str:
    """The outcome word for a step that ended with ``exc`` (None: it returned)."""
    if exc is None:
        return OK
    if isinstance(exc, OutcomeUnknown):
        return HALTED
    if isinstance(exc, Throttled):
        return THROTTLED
    if isinstance(exc, Pause):
        return PAUSED
    if isinstance(exc, RunBusy):
        return BUSY
    if isinstance(exc, LeaseLost):
        return LEASE_LOST
    if isinstance(exc, DriveStopped):
        return STOPPED
    if isinstance(exc, DurableAgentsError):
        return FAILED
    return ERROR


def error_name(exc: BaseException) -> str:
    """What a span says an exception was: its stable code, else its class name."""
    code = getattr(exc, "code", None)
    return str(code) if code else type(exc).__name__
