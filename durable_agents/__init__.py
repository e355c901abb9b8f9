"""durable_agents: durable execution for AI agents in Django.

The public API is what ``__all__`` lists; everything else may change.
"""

from .engine.agent import Agent, ModelRetry, RunResult
from .engine.commands import PendingRun, pending, resume
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
from .engine.journal import Journal
from .engine.loop import AgentDrift, ResumeToolMissing
from .engine.tools import Tool, ToolContext, tool

__all__ = [
    "Agent",
    "AgentDrift",
    "ApprovalPending",
    "BudgetError",
    "ConfigError",
    "DurableAgentsError",
    "InterruptPending",
    "Journal",
    "JournalVersionError",
    "LeaseLost",
    "ModelError",
    "ModelRetry",
    "OutcomeUnknown",
    "Pause",
    "PendingRun",
    "ProtocolError",
    "ResumeToolMissing",
    "RunBusy",
    "RunResult",
    "SignalPending",
    "StorageError",
    "TimerPending",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcomeUnknown",
    "pending",
    "resume",
    "tool",
]
