"""The durability dial: which of a run's records may commit without waiting for the disk.

``Agent(durability="sync")`` (the default) commits every record durably: once a write
returns, a power loss cannot take it back. ``durability="async"`` lets the records that are
safe to redo commit without waiting for the write-ahead log to reach the disk (PostgreSQL's
``synchronous_commit = off`` for that one transaction). The engine only says, per write,
whether it may lag (``sync=False`` on ``Store.insert``); the store decides how, and a store
that cannot (SQLite, ``InMemoryStore``) commits it like any other.

Records that may lag, in ``async`` only:

* a model turn whose tool calls (if any) are all read-only, or are not retry-safe (those get
  a synchronous attempt claim before they run, see below). A final answer (no calls) is
  written with ``run:complete`` in one synchronous write (``Store.finish_run_with``), so it
  lags only when the driver falls back to writing it alone;
* the result of a retry-safe tool (read-only, idempotent, or keyed): losing it re-runs the
  tool, which its safety class says is harmless;
* a spend record (what a discarded response cost): losing one under-counts that cost.

Everything else always commits durably: the run's start and its completion (a caller, a
signal handler or a parent run acts on them), attempt claims and the results of tools that
are not retry-safe, approvals and decisions, halts, waits, saga records, takeovers, the run
row's status changes.

Why this keeps the promise. PostgreSQL writes one log in commit order, and a synchronous
commit returns only once the log is on disk *up to its own commit record*: so every
transaction that committed before it, asynchronous or not, is on disk too. A power loss can
therefore lose only a *suffix* of asynchronous records — those committed after the last
synchronous one — and the resume after it redoes them: it calls the model again (which may
answer differently) and re-runs retry-safe tools. No side effect can depend on a lost record:

* a tool that is not retry-safe runs only after its attempt claim committed synchronously,
  after the model turn that asked for it — so that turn is on disk before the effect fires,
  and a redo never asks anew for a call whose claim exists;
* a retry-safe tool with an effect (idempotent, keyed) has no claim before it: the turn that
  asks for it commits synchronously, so a redo never sends that call with other arguments
  or drops it after its effect happened (``turn_may_lag``);
* whatever leaves the database — an approval request a person reads, a halt, a finished
  run's answer, a signal — is a synchronous record, which makes everything before it
  durable first.

What ``async`` can cost on a power loss, an OS crash or a crash of PostgreSQL (which loses
what its WAL writer had not yet handed to the OS, up to three ``wal_writer_delay``): the
model calls and retry-safe tool calls of the lost suffix are made again, and billed again.
A live viewer (``agent.events``) may have seen a turn that is then answered differently.

The chosen dial is not journaled: the rule is per record and holds whichever mode wrote the
records before it, so a deploy that changes the dial between a crash and its resume is safe
either way, and the dial is not part of the agent's fingerprint (it is no drift).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError

SYNC = "sync"
ASYNC = "async"
MODES = (SYNC, ASYNC)


def check(value: Any, agent: str) -> str:
    """The dial's value, or ``ConfigError`` naming the agent and the choices."""
    if value not in MODES:
        raise ConfigError(
            f"agent {agent!r}: durability is 'sync' or 'async', not {value!r}",
            code="config.agent",
        )
    return str(value)


def turn_may_lag(durability: str, calls: Sequence[Any], tools: Mapping[str, Any]) -> bool:
    """Whether a model turn making ``calls`` may commit without waiting for the disk.

    Not when it asks for a retry-safe tool that has an effect (idempotent or keyed): nothing
    durable is written between this turn and that effect, so the turn must be. A call of a
    tool that is not retry-safe is preceded by its synchronous attempt claim, and a call of
    an unknown tool only gets an error result: neither needs the turn itself to wait.
    """
    if durability != ASYNC:
        return False
    for call in calls:
        tool = tools.get(call.name)
        if tool is not None and tool.safety.retry_safe and not tool.safety.read_only:
            return False
    return True


def result_may_lag(durability: str, tool: Any) -> bool:
    """Whether a tool's result may commit without waiting for the disk: only a retry-safe
    tool's (a lost result re-runs it, which its safety class says is harmless)."""
    return durability == ASYNC and tool is not None and bool(tool.safety.retry_safe)


def spend_may_lag(durability: str) -> bool:
    """A spend record changes no result: losing one under-counts what a discarded response
    cost (the run's budget sees a little less than was billed)."""
    return durability == ASYNC
