"""Sub-agents: an agent called as a tool, each call a child run of one durable tree.

``child.as_tool()`` is a tool whose every call starts (or continues) the child run
``<parent>/<call_id>``, with ``parent_run_id`` and ``root_run_id`` set on its row and in its
``run:start`` record, its own journal, lease, turn limit and token budget. The parent's tool
result is the child's answer.

How a tree is driven (see docs/composition.md):

* The child is driven **inline**, by the parent's driver, inside the tool call: a tree that
  never pauses runs start to end in one worker, with no hand-over latency. The call is
  retry-safe: running it again drives the child again, which replays its own journal (a
  child step is never run twice; a finished child answers from its ``run:complete``).
* A child that pauses (approval, halt, wait) or that another driver holds (its lease is
  live) pauses the parent too (``ChildPending``), in the child's status: the tree's pause.
  A retryably failed or stopped child pauses its parent the same way; recovery drives the
  child.
* Whoever drives the child to its end afterwards (a decision's hand-over, recovery) hands
  the parent over when the child finishes (``hand_over_parent``), which re-runs the call:
  the child answers from its journal and the parent continues. So deciding a call at the
  bottom of a tree resumes the whole tree, one level at a time, up to the root.
* A child that failed for good (an error no retry fixes, or a retryable one with no attempt
  left, or recovery gave up on it), was cancelled or compensated is the call's error result
  in the parent; its end hands the parent over like a finish does. A call run again does not
  drive a child that failed for good (nothing was to retry it).
* The chain of a child's ancestors is at most ``runtime.subagent_depth()`` deep, and never
  holds the child's own agent (a cycle): both are the call's error result, with a code.
* A run imported from another site that holds the child's id is never taken for the child
  (``imported.foreign_sub_run``): on the first call, on a call run again after a crash, and
  on a fork's reference, the call's error result is ``subagent.imported``, and nothing of the
  import's answer reaches the parent.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from . import failpoints, imported, names, runtime, saga_tree
from .errors import (
    ChildPending,
    ConfigError,
    Conflict,
    DurableAgentsError,
    Pause,
    RunBusy,
    RunImported,
    StorageError,
    Throttled,
)
from .journal import Journal
from .loop import drive
from .ports import AWAITING_INPUT, CANCELLED, RunInfo, Store
from .tools import Safety, Tool, ToolContext
from .tree import child_run_id, failed_for_good

if TYPE_CHECKING:
    from .definition import AgentDefinition

log = logging.getLogger("durable_agents")


def as_tool(
    agent: AgentDefinition, name: str | None = None, description: str | None = None
) -> Tool:
    """``agent`` as a tool: each call runs a child run of it (see the module docstring)."""

    def call_agent(input: str, ctx: ToolContext) -> str:
        return run_child(agent, input, ctx)

    tool = Tool(
        call_agent,
        name=name or agent.name,
        description=description or f"Ask the {agent.name!r} agent; returns its answer.",
        # Retry-safe: calling again continues the same child run from its journal.
        safety=Safety(idempotent=True),
    )
    tool.subagent = agent.name  # its calls' spend rolls up into the caller's (``tree``)
    # A saga's rollback of the caller rolls the child back too (``saga_tree``).
    tool.subagent_def = agent
    tool.subagent_rollback = partial(saga_tree.rollback_child, agent)
    return tool


def run_child(agent: AgentDefinition, input: str, ctx: ToolContext) -> str:
    """Drive the child run of this call (start it on the first call) and return its answer;
    raise ``ChildPending`` when it cannot finish now."""
    waits = ctx._waits
    store: Store = waits.store if waits is not None else runtime.store()
    parent = store.get_run(ctx.run_id)
    child_id = child_run_id(ctx.run_id, ctx.call_id)
    root = (parent.root_run_id if parent is not None else None) or ctx.run_id
    check_tree(store, ctx.run_id, agent.name)
    # Before the parent journals the child: an import holding its id is refused, and never
    # named in the parent's tree.
    _refuse_imported(store.get_run(child_id), parent, ctx.call_id, agent.name)
    journal = Journal(store)
    recorded, inserted = journal.write(
        ctx.run_id,
        names.child(ctx.call_id),
        {"kind": "child", "run_id": child_id, "agent": agent.name, "call_id": ctx.call_id},
        fence=waits.fence if waits is not None else None,
    )
    if str(recorded.get("run_id")) != child_id:
        # A fork's copy of its source's call, whose child had ended before the fork point:
        # referenced, never driven (it is the source's run, not the fork's).
        return _referenced(
            store, journal, str(recorded.get("run_id")), agent.name, parent, ctx.call_id
        )
    failpoints.hit(f"after-child:{child_id}")
    if not inserted:
        # The call runs again: an import may hold the child's id since the record (a driver
        # died after it, before the child's row), or the child failed for good meanwhile.
        row = store.get_run(child_id)
        _refuse_imported(row, parent, ctx.call_id, agent.name)
        _refuse_failed(row, agent.name)
    try:
        result = drive(
            agent,
            child_id,
            input,
            store=store,
            derived_id=True,
            meta={"parent_run_id": ctx.run_id, "root_run_id": root},
        )
    except Pause as pause:
        raise ChildPending(
            f"run {ctx.run_id!r} waits for its sub-run {child_id!r}: {pause.message}",
            run_id=ctx.run_id,
            child_run_id=child_id,
            child_status=pause.status,
            cause=type(pause).__name__,
            # What the deepest paused run waits on (its calls, halts, waits) and its id.
            child_details={
                **{k: v for k, v in pause.details.items() if k in ("calls", "halts", "cause")},
                "paused_run_id": pause.details.get("paused_run_id") or child_id,
                # A throttled child tries again at a time: so does its parent's call.
                **({"wake_ms": pause.details["wake_ms"]} if isinstance(pause, Throttled) else {}),
            },
        ) from None
    except RunBusy:
        raise _waiting(ctx.run_id, child_id, "is being driven elsewhere") from None
    except RunImported as exc:
        # An inert import landed at the id after the look above: the drive refused it, on
        # the row it read with the journal (a finished one too: its answer is nobody's).
        raise _taken(exc, ctx.run_id, ctx.call_id, agent.name) from None
    except StorageError:
        # The store failed this drive (perhaps before the child's row existed, so nothing
        # would ever retry the child): the parent's drive fails for a retry, and calling
        # again continues the child from its journal.
        raise
    except DurableAgentsError as exc:
        if exc.retryable:
            _refuse_failed(store.get_run(child_id), agent.name)
            raise _waiting(ctx.run_id, child_id, f"will be retried ({exc.code})") from None
        code = f"subagent.{'cancelled' if exc.code == 'run.cancelled' else 'failed'}"
        raise Conflict(
            f"[{code}] sub-run {child_id!r} of agent {agent.name!r} ended without an answer "
            f"({exc.code}): {exc}",
            code=code,
        ) from None
    return result.answer


def _refuse_failed(child: RunInfo | None, agent: str) -> None:
    """A child that failed for good is its call's error, without driving it again: nothing
    was to retry it (an error no retry fixes, or no attempt left: recovery gave up on a
    child whose driver kept dying, which a drive from here must not undo)."""
    if child is None or not failed_for_good(child):
        return
    error = child.last_error or {}
    raise Conflict(
        f"[subagent.failed] sub-run {child.run_id!r} of agent {agent!r} ended without an "
        f"answer ({error.get('code')}): {error.get('message')}",
        code="subagent.failed",
    )


def _refuse_imported(
    child: RunInfo | None, parent: RunInfo | None, call_id: str, agent: str
) -> None:
    """The call's error (``subagent.imported``) if ``child``, the run at its child's id, is
    an import that is not the parent's (``imported.refuse_sub_run``)."""
    try:
        imported.refuse_sub_run(child, parent, call_id)
    except RunImported as exc:
        parent_id = parent.run_id if parent is not None else ""
        raise _taken(exc, parent_id, call_id, agent) from None


def _taken(exc: RunImported, parent_id: str, call_id: str, agent: str) -> Conflict:
    # Said in the log too: a file placed where a live run would look is an operator's doing
    # that staff should hear of, not only the model.
    log.warning(
        "run %s: call %s refused the import %s at its sub-run's id (subagent.imported)",
        parent_id,
        call_id,
        exc.details.get("run_id"),
    )
    return Conflict(
        f"[subagent.imported] the sub-run of agent {agent!r} was not run: {exc}",
        code="subagent.imported",
        run_id=exc.details.get("run_id"),
    )


def _referenced(
    store: Store,
    journal: Journal,
    child_id: str,
    agent: str,
    fork: RunInfo | None,
    call_id: str,
) -> str:
    """The answer of an ended child a fork references, or the error its source's call got.
    A child a saga rolled back after it finished (``saga:abort`` after its ``run:complete``)
    has no answer any more: what it did is undone, or being undone. An import at the id
    (its source journaled the child, then died before the child's row) is refused."""
    run = store.get_run(child_id)
    _refuse_imported(run, fork, call_id, agent)
    complete = journal.get(child_id, names.RUN_COMPLETE)
    if complete is not None and journal.get(child_id, names.SAGA_ABORT) is not None:
        raise Conflict(
            f"[subagent.failed] sub-run {child_id!r} of agent {agent!r}, which this fork "
            "references from its source, finished before the fork point but was rolled back "
            "by a saga since (its effects are undone): its answer no longer stands; fork "
            "before the call to run the sub-agent again",
            code="subagent.failed",
        )
    if complete is not None:
        return str(complete.get("answer"))
    status = run.status if run is not None else "deleted"
    code = f"subagent.{'cancelled' if status == CANCELLED else 'failed'}"
    raise Conflict(
        f"[{code}] sub-run {child_id!r} of agent {agent!r}, which this fork references from "
        f"its source, ended without an answer ({status})",
        code=code,
    )


def _waiting(run_id: str, child_id: str, why: str) -> ChildPending:
    return ChildPending(
        f"run {run_id!r} waits for its sub-run {child_id!r}, which {why}",
        run_id=run_id,
        child_run_id=child_id,
        child_status=AWAITING_INPUT,
        cause="busy",
    )


def check_tree(store: Store, parent_run_id: str, agent_name: str) -> None:
    """Refuse a child that would be deeper than the depth limit, or whose agent already runs
    among its ancestors (an agent calling itself through the chain)."""
    limit = runtime.subagent_depth()
    chain: list[str] = []
    run_id: str | None = parent_run_id
    while run_id is not None:
        run = store.get_run(run_id)
        if run is None:
            break
        chain.append(run.agent)
        if run.agent == agent_name:
            path = " -> ".join(reversed(chain)) + f" -> {agent_name}"
            raise ConfigError(
                f"[subagent.cycle] agent {agent_name!r} would call itself through its "
                f"sub-agents ({path}); a tree of sub-agents may not hold a cycle",
                code="subagent.cycle",
            )
        run_id = run.parent_run_id
    if len(chain) > limit:
        raise ConfigError(
            f"[subagent.depth] a sub-run of agent {agent_name!r} would be {len(chain)} levels "
            f"below its root; the limit is {limit} (DURABLE_AGENTS['SUBAGENT_DEPTH'])",
            code="subagent.depth",
        )
