"""Errors and pauses.

Two families, deliberately apart:

* ``DurableAgentsError`` — something failed. Each subclass belongs to one category
  (``ConfigError``, ``ModelError``, ``ToolError``, ``StorageError``, ``ProtocolError``,
  ``BudgetError``) and carries a stable ``code`` that callers and the API can match on.
* ``Pause`` — the run stopped durably and waits (for a human, an input, a timer). A paused
  run is not a failed one; recovery and the API treat the two differently.

``RunBusy`` and ``LeaseLost`` are coordination signals, not faults: another driver holds or
took the run.
"""

from __future__ import annotations

from typing import Any


class DurableAgentsError(Exception):
    """Root of every failure this library raises."""

    category = "error"
    code = "error"
    retryable = False

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def __str__(self) -> str:
        return self.message


class ConfigError(DurableAgentsError):
    """Misuse or misconfiguration by the caller: fix the call or the settings."""

    category = "config"
    code = "config.invalid"


class ModelError(DurableAgentsError):
    """A model provider call failed. ``retryable`` says whether a later attempt can succeed."""

    category = "model"
    code = "model.failed"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool = False,
        status: int | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, code=code, **details)
        self.retryable = retryable
        self.status = status


class ToolError(DurableAgentsError):
    """A tool failed or was misused (unknown tool, bad arguments)."""

    category = "tool"
    code = "tool.failed"


class ToolOutcomeUnknown(ToolError):
    """Raised by a tool that cannot tell whether its effect happened (a timeout after sending).

    For a side-effecting tool the run records no result and halts for a human; for a
    retry-safe tool it is an ordinary error result the model sees.
    """

    code = "tool.outcome_unknown"


class StorageError(DurableAgentsError):
    """The store could not read or write."""

    category = "storage"
    code = "storage.failed"
    retryable = True


class ProtocolError(DurableAgentsError):
    """Malformed journal or wire data."""

    category = "protocol"
    code = "protocol.invalid"


class JournalVersionError(ProtocolError):
    """A run's journal is in a format this version does not read or write."""

    code = "protocol.journal_version"


class BudgetError(DurableAgentsError):
    """A run hit one of its limits (turns, tokens)."""

    category = "budget"
    code = "budget.exceeded"


class RunBusy(DurableAgentsError):
    """Another driver holds the run's lease; nothing ran."""

    category = "coordination"
    code = "run.busy"
    retryable = True


class LeaseLost(DurableAgentsError):
    """This driver's lease lapsed or was taken; its write was refused and nothing was stored."""

    category = "coordination"
    code = "run.lease_lost"
    retryable = True


class DriveStopped(DurableAgentsError):
    """This process is shutting down: the drive stopped after the step in flight and released
    the run, which any driver may continue."""

    category = "coordination"
    code = "run.drive_stopped"
    retryable = True


class Pause(Exception):
    """The run stopped durably and is waiting. Not a failure."""

    status = "paused"
    code = "run.paused"

    def __init__(self, message: str, *, run_id: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.details = details

    def __str__(self) -> str:
        return self.message


class ApprovalPending(Pause):
    """A gated tool call waits for a staff decision."""

    status = "awaiting_approval"
    code = "run.awaiting_approval"


class OutcomeUnknown(Pause):
    """A side effect may or may not have happened; a human must record what did."""

    status = "halted"
    code = "run.halted"


class InterruptPending(Pause):
    """The run asked a question and waits for the answer."""

    status = "awaiting_input"
    code = "run.awaiting_input"


class SignalPending(Pause):
    """The run waits for an external signal."""

    status = "awaiting_input"
    code = "run.awaiting_signal"


class TimerPending(Pause):
    """The run sleeps until a time."""

    status = "sleeping"
    code = "run.sleeping"
