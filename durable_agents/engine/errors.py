"""Errors and pauses.

Two families, deliberately apart:

* ``DurableAgentsError`` — something failed. Each subclass belongs to one category
  (``ConfigError``, ``ModelError``, ``ToolError``, ``StorageError``, ``ProtocolError``,
  ``BudgetError``) and carries a stable ``code`` that callers and the API can match on, and
  an ``http_status`` hint the API answers with (the engine knows no HTTP; the hint only says
  whether the condition is bad input, a missing thing, a conflict with the run's state, a
  refusal of who acts, or a failure of a provider or the store).
* ``Pause`` — the run stopped durably and waits (for a human, an input, a timer). A paused
  run is not a failed one; recovery and the API treat the two differently.

``RunBusy`` and ``LeaseLost`` are coordination signals, not faults: another driver holds or
took the run.

Every error class of the engine is defined here, and only here.
"""

from __future__ import annotations

from typing import Any


class DurableAgentsError(Exception):
    """Root of every failure this library raises."""

    category = "error"
    code = "error"
    retryable = False
    http_status = 500

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
    http_status = 400


class NotFound(ConfigError):
    """The call names a run (or another thing) that does not exist."""

    code = "run.not_found"
    http_status = 404


class Conflict(ConfigError):
    """The call is well formed but the run's state refuses it (finished, cancelled, started
    with another input, a turn still open...)."""

    code = "run.conflict"
    http_status = 409


class RunImported(Conflict):
    """The run is an inert import (docs/replay.md, "Imports"): evidence from another site,
    never driven, and nothing in it is decided, answered, signalled, resolved, cancelled or
    forked here."""

    code = "run.imported"


class SessionNotYours(ConfigError):
    """The session belongs to another channel (docs/sessions.md, "Who a session belongs
    to"): a message that came another way is refused, and nothing is written."""

    code = "session.other_channel"
    http_status = 403


class RunIdSpent(Conflict):
    """The run id belonged to a run this site deleted (docs/retention.md, "Spent ids"): it
    is spent for good, since a run created again under it — started, forked, imported, a
    sub-run or a session's turn — could do again what the first one did."""

    code = "run.spent"


class RunPruned(RunIdSpent):
    """The run id belongs to a run ``prune`` deleted (docs/retention.md): its id is spent,
    since starting it again would run again what it did."""

    code = "run.pruned"


class ImportRefused(ConfigError):
    """An export cannot be imported as asked (a live import whose decisions do not all
    verify here, say); nothing was written."""

    code = "import.refused"
    http_status = 422


class AgentPathError(ConfigError):
    """An entry of the site's agent list (``DURABLE_AGENTS['AGENTS']``) cannot be imported,
    or defines no agent."""

    code = "config.agents"


class ModelError(DurableAgentsError):
    """A model provider call failed. ``retryable`` says whether a later attempt can succeed."""

    category = "model"
    code = "model.failed"
    http_status = 502

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
    http_status = 400


class ToolOutcomeUnknown(ToolError):
    """Raised by a tool that cannot tell whether its effect happened (a timeout after sending).

    For a side-effecting tool the run records no result and halts for a human; for a
    retry-safe tool it is an ordinary error result the model sees.
    """

    code = "tool.outcome_unknown"


class ToolResultError(ToolError):
    """Raised by a tool whose call ran and answered with an error that has a shape of its
    own (an MCP server's ``isError`` result): ``result`` (JSON) is journaled whole as the
    call's error result, and the model reads it as it reads a tool's exception."""

    code = "tool.error_result"

    def __init__(self, message: str, result: Any, **details: Any) -> None:
        super().__init__(message, **details)
        self.result = result


class SagaAborted(ToolError):
    """A saga run (``Agent(saga=True)``) aborted: its completed compensable calls were undone
    in reverse order and it ended ``compensated``. ``details["cause"]`` is the failure that
    aborted it (code and message). A tool may raise it to abort its saga on purpose."""

    code = "saga.aborted"
    http_status = 409


class StorageError(DurableAgentsError):
    """The store could not read or write."""

    category = "storage"
    code = "storage.failed"
    retryable = True
    http_status = 503


class ProtocolError(DurableAgentsError):
    """Malformed journal or wire data."""

    category = "protocol"
    code = "protocol.invalid"
    http_status = 400


class JournalVersionError(ProtocolError):
    """A run's journal is in a format this version does not read or write."""

    code = "protocol.journal_version"


class ReplayDiverged(Conflict):
    """A replay found today's code diverging from a recorded run: ``details`` holds the
    ``step``, the ``kind`` (``instructions``, ``tool_removed``, ``tool_changed``,
    ``refused``, ``request``) and both sides (``recorded``, ``today``)."""

    code = "replay.diverged"
    http_status = 409


class BudgetError(DurableAgentsError):
    """A run hit one of its limits (turns, tokens)."""

    category = "budget"
    code = "budget.exceeded"
    http_status = 400


class RunBusy(DurableAgentsError):
    """Another driver holds the run's lease; nothing ran."""

    category = "coordination"
    http_status = 409
    code = "run.busy"
    retryable = True


class LeaseLost(DurableAgentsError):
    """This driver's lease lapsed or was taken; its write was refused and nothing was stored."""

    category = "coordination"
    code = "run.lease_lost"
    http_status = 409
    retryable = True


class DriveStopped(DurableAgentsError):
    """This process is shutting down: the drive stopped after the step in flight and released
    the run, which any driver may continue."""

    category = "coordination"
    code = "run.drive_stopped"
    http_status = 409
    retryable = True


class ToolArgumentsError(Exception):
    """The model's arguments do not fit the tool: sent back to the model as an error result
    (never raised to a caller)."""


# -- the run's agent ----------------------------------------------------------------------


class AgentDrift(ConfigError):
    """The run started under a different agent and the drift policy is ``error``."""

    code = "config.agent_drift"


class ResumeToolMissing(ConfigError):
    """A pending call names a tool the agent no longer has."""

    code = "config.resume_tool_missing"


# -- who acts ----------------------------------------------------------------------------


class ActorError(ConfigError):
    """``by=`` does not name a user who may do this."""

    code = "actor.unknown"


class ActorInactive(ActorError):
    code = "actor.inactive"
    http_status = 403


class ActorForbidden(ActorError):
    code = "actor.forbidden"
    http_status = 403


# -- approvals ---------------------------------------------------------------------------


class ApprovalError(ConfigError):
    code = "approval.invalid"


class ApprovalNotFound(ApprovalError):
    code = "approval.not_found"
    http_status = 404


class ApprovalOrphaned(ApprovalError):
    code = "approval.orphaned"
    http_status = 409


class ApprovalAlreadyDecided(ApprovalError):
    code = "approval.already_decided"
    http_status = 409


class ApprovalExpired(ApprovalAlreadyDecided):
    """Nobody decided the request before its deadline expired it (``da.Deadline``): it can
    never be decided afterwards."""

    code = "approval.expired"
    http_status = 409


class ApproverNotEligible(ApprovalError):
    code = "approval.not_eligible"
    http_status = 403


class ApprovalBadSignature(ApprovalError):
    code = "approval.bad_signature"


class ApprovalSignatureOutdated(ApprovalBadSignature):
    code = "approval.signature_format"


class ApprovalArgumentsChanged(ApprovalError):
    """The request asks about other arguments than its decider was shown (asked again
    meanwhile): a conflict with the request's state, not bad input."""

    code = "approval.arguments_changed"
    http_status = 409


class ApprovalEditInvalid(ApprovalError):
    """Edited arguments that the tool's schema refuses, or an edit the tool forbids
    (``editable=False``) or a denial cannot carry."""

    code = "approval.edit_invalid"


class ApprovalArgumentsDisagree(ApprovalError):
    """A quorum's approvals must approve the same arguments."""

    code = "approval.arguments_disagree"
    http_status = 409


class ApprovalForWhom(ApprovalError):
    """A deputy of several approvers must say whom they decide for (``for_approver=``)."""

    code = "approval.for_approver_needed"


# -- delegations -------------------------------------------------------------------------


class DelegationError(ConfigError):
    """A delegation that cannot be recorded as asked (its window, scope or people)."""

    code = "delegation.invalid"


class DelegationNotFound(DelegationError):
    code = "delegation.not_found"
    http_status = 404


class DelegationOverlaps(DelegationError):
    """Another delegation of the same approver covers part of the same time and calls."""

    code = "delegation.overlaps"
    http_status = 409


# -- halts -------------------------------------------------------------------------------


class HaltError(ConfigError):
    code = "halt.invalid"


class HaltInFlight(HaltError):
    code = "halt.in_flight"
    http_status = 409


class HaltTooYoung(HaltError):
    code = "halt.too_young"
    http_status = 409


class HaltAlreadyResolved(HaltError):
    code = "halt.already_resolved"
    http_status = 409


class NoLiveAttempt(HaltError):
    code = "halt.no_live_attempt"
    http_status = 409


class HaltOrphaned(HaltError):
    code = "halt.orphaned"
    http_status = 409


# -- waits (interrupts, signals) ----------------------------------------------------------


class WaitError(ConfigError):
    code = "wait.invalid"


class WaitNotRetrySafe(WaitError):
    """A wait in a tool that is not retry-safe: the tool re-runs from the top until the wait
    resolves, so its side effects before the wait would run again."""

    code = "config.wait_not_retry_safe"


class WaitNameTaken(WaitError):
    """Two calls of one run wait under one name: a name is one wait, resolved once."""

    code = "config.wait_name_taken"
    http_status = 409


class InterruptNotFound(WaitError):
    code = "interrupt.not_found"
    http_status = 404


class InterruptAnswerInvalid(WaitError):
    code = "interrupt.invalid_answer"


class InterruptAlreadyAnswered(WaitError):
    code = "interrupt.already_answered"
    http_status = 409


class InterruptQuestionChanged(WaitError):
    """The run asks another question under that name than the one its answerer was shown
    (the tool ran again and asked with another prompt or schema): nothing was recorded."""

    code = "interrupt.question_changed"
    http_status = 409


class InterruptExpired(WaitError):
    """A live question (an MCP server's elicitation, asked while its call was open) is no
    longer waited for: the call gave up on it (its deadline passed, it ended, or the process
    that asked is gone). Nothing was recorded: an answer now would reach nobody."""

    code = "interrupt.expired"
    http_status = 409


# -- pauses ------------------------------------------------------------------------------


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


class ChannelPending(SignalPending):
    """The run waits for a message on one of its channels (``ctx.receive``)."""

    code = "run.awaiting_message"


class TimerPending(Pause):
    """The run sleeps until a time."""

    status = "sleeping"
    code = "run.sleeping"


class Throttled(Pause):
    """A limit is full (a slot of its agent or of a tool, a rate): the run waits, and tries
    again at ``details['retry_at']`` or when a slot it waits for is given back. Not a
    failure, and nothing recorded is repeated (docs/limits.md)."""

    status = "throttled"
    code = "run.throttled"


class ChildPending(Pause):
    """A call waits for its sub-run (``agent.as_tool()``), which paused or is driven
    elsewhere. The parent pauses in its child's status (``details['child_status']``): a
    child's pause is the tree's pause."""

    status = "awaiting_input"
    code = "run.awaiting_child"
