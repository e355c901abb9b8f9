"""durable_agents: durable execution for AI agents in Django.

The public API is what ``__all__`` lists; everything else may change.
"""

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

__all__ = [
    "ApprovalPending",
    "BudgetError",
    "ConfigError",
    "DurableAgentsError",
    "InterruptPending",
    "Journal",
    "JournalVersionError",
    "LeaseLost",
    "ModelError",
    "OutcomeUnknown",
    "Pause",
    "ProtocolError",
    "RunBusy",
    "SignalPending",
    "StorageError",
    "TimerPending",
    "ToolError",
    "ToolOutcomeUnknown",
]
