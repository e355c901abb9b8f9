"""durable_agents: durable execution for AI agents in Django.

The public API is what ``__all__`` lists; everything else may change.
"""

__version__ = "0.2.0.dev0"

from .engine.agent import Agent, ModelRetry, RunResult
from .engine.approvals import (
    ApprovalAlreadyDecided,
    ApprovalBadSignature,
    ApprovalNotFound,
    ApprovalOrphaned,
    ApprovalOutcome,
    ApprovalSignatureOutdated,
    ApproverNotEligible,
    Quorum,
    approve,
    decision_bytes,
)
from .engine.commands import PendingRun, cancel, pending, resume
from .engine.errors import (
    ApprovalPending,
    BudgetError,
    ConfigError,
    DurableAgentsError,
    InterruptPending,
    JournalVersionError,
    LeaseLost,
    ModelError,
    OutcomeUnknown,
    Pause,
    ProtocolError,
    RunBusy,
    SignalPending,
    StorageError,
    TimerPending,
    ToolError,
    ToolOutcomeUnknown,
)
from .engine.halts import (
    HaltAlreadyResolved,
    HaltInFlight,
    HaltOrphaned,
    HaltTooYoung,
    NoLiveAttempt,
    resolve_halt,
)
from .engine.history import Comparison, Patch, Step, as_of, compare, fork, history
from .engine.identity import Actor
from .engine.journal import Journal
from .engine.loop import AgentDrift, ResumeToolMissing
from .engine.recovery import recover
from .engine.sessions import SendResult, Session
from .engine.tools import Tool, ToolContext, tool

__all__ = [
    "Actor",
    "Agent",
    "AgentDrift",
    "ApprovalAlreadyDecided",
    "ApprovalBadSignature",
    "ApprovalNotFound",
    "ApprovalOrphaned",
    "ApprovalOutcome",
    "ApprovalPending",
    "ApprovalSignatureOutdated",
    "ApproverNotEligible",
    "BudgetError",
    "Comparison",
    "ConfigError",
    "DurableAgentsError",
    "HaltAlreadyResolved",
    "HaltInFlight",
    "HaltOrphaned",
    "HaltTooYoung",
    "InterruptPending",
    "Journal",
    "JournalVersionError",
    "LeaseLost",
    "ModelError",
    "ModelRetry",
    "NoLiveAttempt",
    "OutcomeUnknown",
    "Patch",
    "Pause",
    "PendingRun",
    "ProtocolError",
    "Quorum",
    "ResumeToolMissing",
    "RunBusy",
    "RunResult",
    "SendResult",
    "Session",
    "SignalPending",
    "Step",
    "StorageError",
    "TimerPending",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcomeUnknown",
    "approve",
    "as_of",
    "cancel",
    "compare",
    "decision_bytes",
    "fork",
    "history",
    "pending",
    "recover",
    "resolve_halt",
    "resume",
    "tool",
]
