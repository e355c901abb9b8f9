"""durable_agents: durable execution for AI agents in Django.

The public API is what ``__all__`` lists; everything else may change.
"""

__version__ = "0.2.0.dev0"

# ``da.mcp.Server(...)``: tools from MCP servers; the mcp package is imported only when used.
from . import mcp
from ._moved import install as _install_moved_paths
from .engine.agent import Agent
from .engine.approvals import ApprovalOutcome, Quorum, decision_bytes
from .engine.commands.approvals import approve, deny
from .engine.commands.delegations import delegate
from .engine.commands.delegations import revoke as revoke_delegation
from .engine.commands.forks import Patch, fork
from .engine.commands.halts import resolve_halt
from .engine.commands.recovery import recover
from .engine.commands.runs import PendingRun, cancel, pending, resume
from .engine.commands.sessions import SendResult, Session
from .engine.commands.timers import WakeOutcome, wake_timer
from .engine.commands.waits import WaitOutcome, answer_interrupt, enqueue, signal
from .engine.definition import ModelRetry, RunResult
from .engine.errors import (
    AgentDrift,
    ApprovalAlreadyDecided,
    ApprovalArgumentsDisagree,
    ApprovalBadSignature,
    ApprovalEditInvalid,
    ApprovalExpired,
    ApprovalForWhom,
    ApprovalNotFound,
    ApprovalOrphaned,
    ApprovalPending,
    ApprovalSignatureOutdated,
    ApproverNotEligible,
    BudgetError,
    ChannelPending,
    ChildPending,
    ConfigError,
    DelegationError,
    DelegationNotFound,
    DelegationOverlaps,
    DurableAgentsError,
    HaltAlreadyResolved,
    HaltInFlight,
    HaltOrphaned,
    HaltTooYoung,
    InterruptAlreadyAnswered,
    InterruptAnswerInvalid,
    InterruptNotFound,
    InterruptPending,
    JournalVersionError,
    LeaseLost,
    ModelError,
    NoLiveAttempt,
    OutcomeUnknown,
    Pause,
    ProtocolError,
    ReplayDiverged,
    ResumeToolMissing,
    RunBusy,
    SagaAborted,
    SignalPending,
    StorageError,
    Throttled,
    TimerPending,
    ToolError,
    ToolOutcomeUnknown,
    ToolResultError,
    WaitError,
    WaitNameTaken,
    WaitNotRetrySafe,
)
from .engine.identity import Actor
from .engine.journal import Journal
from .engine.ports import DelegationInfo
from .engine.replay import ReplayReport, replay
from .engine.replay_model import ReplayModel
from .engine.rules import Deadline, Rule, RuleContext, Rules, allow, arg, ask
from .engine.staff import ask_staff
from .engine.steps import Comparison, Step, as_of, compare, history
from .engine.tools import Tool, ToolContext, tool
from .engine.waits import ChannelMessage, TimedOut

__all__ = [
    "Actor",
    "Agent",
    "AgentDrift",
    "ApprovalAlreadyDecided",
    "ApprovalArgumentsDisagree",
    "ApprovalBadSignature",
    "ApprovalEditInvalid",
    "ApprovalExpired",
    "ApprovalForWhom",
    "ApprovalNotFound",
    "ApprovalOrphaned",
    "ApprovalOutcome",
    "ApprovalPending",
    "ApprovalSignatureOutdated",
    "ApproverNotEligible",
    "BudgetError",
    "ChannelMessage",
    "ChannelPending",
    "ChildPending",
    "Comparison",
    "ConfigError",
    "Deadline",
    "DelegationError",
    "DelegationInfo",
    "DelegationNotFound",
    "DelegationOverlaps",
    "DurableAgentsError",
    "HaltAlreadyResolved",
    "HaltInFlight",
    "HaltOrphaned",
    "HaltTooYoung",
    "InterruptAlreadyAnswered",
    "InterruptAnswerInvalid",
    "InterruptNotFound",
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
    "ReplayDiverged",
    "ReplayModel",
    "ReplayReport",
    "ResumeToolMissing",
    "Rule",
    "RuleContext",
    "Rules",
    "RunBusy",
    "RunResult",
    "SagaAborted",
    "SendResult",
    "Session",
    "SignalPending",
    "Step",
    "StorageError",
    "Throttled",
    "TimedOut",
    "TimerPending",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcomeUnknown",
    "ToolResultError",
    "WaitError",
    "WaitNameTaken",
    "WaitNotRetrySafe",
    "WaitOutcome",
    "WakeOutcome",
    "allow",
    "answer_interrupt",
    "approve",
    "arg",
    "as_of",
    "ask",
    "ask_staff",
    "cancel",
    "compare",
    "decision_bytes",
    "delegate",
    "deny",
    "enqueue",
    "fork",
    "history",
    "mcp",
    "pending",
    "recover",
    "replay",
    "resolve_halt",
    "resume",
    "revoke_delegation",
    "signal",
    "tool",
    "wake_timer",
]

# Old import paths of the database and Celery glue still import, with a warning (_moved.py).
_install_moved_paths()
