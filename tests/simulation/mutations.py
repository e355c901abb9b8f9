"""Deliberate breaks of the engine, each of which the simulator must catch.

A simulator that passes proves little unless it fails when the engine is wrong. Each
mutation below breaks one promise the way a plausible change would (a line deleted, a check
skipped, a constant set to zero), applied for the length of a seed only (``Config.mutation``,
``SIM_MUTATION=<name>``), so a replay line reproduces a catch. ``test_mutations.py`` runs
each over its seed budget and requires a share of the seeds to break an invariant; the
shares measured are in docs/simulation.md.

These patch attributes of the engine's modules in this process; nothing is written to disk
and everything is restored when the seed ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from durable_agents.engine import (
    approvals,
    deadlines,
    imported,
    lifecycle,
    loop,
    names,
    retention,
    rules,
    runtime,
    sagas,
    steps,
    stops,
)
from durable_agents.engine.commands import approvals as approval_commands
from durable_agents.engine.commands import deadlines as deadline_commands
from durable_agents.engine.commands import forks, recovery, timers
from durable_agents.engine.errors import DurableAgentsError
from durable_agents.engine.journal import Journal
from durable_agents.engine.loop import Driver
from durable_agents.engine.memstore import InMemoryStore
from durable_agents.engine.ports import (
    APPROVAL_EXPIRED,
    AWAITING_APPROVAL,
    HALTED,
    THROTTLED,
    RunInfo,
    asked_again,
    changed_under,
)
from durable_agents.engine.tools import ToolArgumentsError
from durable_agents.engine.transcript import RunState


@contextlib.contextmanager
def _swapped(*swaps: tuple[Any, str, Any]) -> Iterator[None]:
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in swaps]
    for owner, attr, value in swaps:
        setattr(owner, attr, value)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def _no_live_attempts(self: RunState) -> dict[str, Any]:
    return {}


def _prefix_without_attempts(records: Any, step: int) -> list[Any]:
    """``steps.prefix`` as it was before hole 2's fix: a fork keeps the turns and results
    but not the claims of calls that had no result yet."""
    kept = steps.prefix(records, step)
    return [
        r for r in kept if not r.name.startswith((names.ATTEMPT, names.NOT_STARTED, names.UNKNOWN))
    ]


def _prefix_without_unknowns(records: Any, step: int) -> list[Any]:
    """``steps.prefix`` that keeps a step's claims but not what their tools said when they
    could not tell whether their effect happened (``@unknown/``): a fork halts on the claim
    without knowing why."""
    return [r for r in steps.prefix(records, step) if not r.name.startswith(names.UNKNOWN)]


_verify = approval_commands.verify_signature


def _verify_earlier(request: Any, *args: Any, **kwargs: Any) -> None:
    """Verify against the arguments the call asked about first, as a check written before
    requests could be asked again would."""
    if request.previous_arguments is not None:
        request = dataclasses.replace(request, arguments=request.previous_arguments)
    _verify(request, *args, **kwargs)


def _no_halt_age() -> contextlib.AbstractContextManager[None]:
    saved = runtime._runtime.__dict__.get("halt_min_age")
    runtime.configure(halt_min_age=lambda: 0.0)

    @contextlib.contextmanager
    def restore() -> Iterator[None]:
        try:
            yield
        finally:
            runtime._runtime.__dict__["halt_min_age"] = saved

    return restore()


def _claim_ignoring_limit(
    self: InMemoryStore, key: str, holder: str, run_id: str, token: str, limit: int
) -> bool:
    """``InMemoryStore.claim_slot`` that checks the lease but never counts the others."""
    with self._lock:
        if not self._holds(run_id, token):
            return False
        self._slots.setdefault(key, {})[holder] = (run_id, token)
        return True


def _claim_outliving_leases(
    self: InMemoryStore, key: str, holder: str, run_id: str, token: str, limit: int
) -> bool:
    """``InMemoryStore.claim_slot`` whose slots are not tied to their lease: a slot counts
    until it is given back, so a driver that died holds its slot for good."""
    with self._lock:
        slots = self._slots.setdefault(key, {})
        if not self._holds(run_id, token):
            return False
        if holder not in slots and len(slots) >= limit:
            return False
        slots[holder] = (run_id, token)
        return True


def _permit_always(self: InMemoryStore, key: str, count: int, period: float) -> float:
    """``InMemoryStore.take_permit`` that grants every permit (a bucket never filling)."""
    return 0.0


def _refuse_nothing(*args: Any, **kwargs: Any) -> None:
    """A refusal that lets everything through."""


class _SweptWithoutThrottled:
    """``lifecycle`` as the sweep saw it before issue 41: every paused status but
    ``throttled`` (the parent-pause statuses), the rest as it is."""

    PAUSED = tuple(s for s in lifecycle.PAUSED if s != THROTTLED)

    def __getattr__(self, name: str) -> Any:
        return getattr(lifecycle, name)


def _has_digest(seed: int) -> bool:
    """Whether a seed's errands book under a spent daily rate, with the tree canceller in
    its cast (``scenario.build``): the seeds whose throttled sub-runs are cancelled."""
    from .agent import draw_limits
    from .world import Config

    config = Config(seed)
    if random.Random(f"stops:{seed}").random() >= 0.6:
        return False
    if random.Random(f"digest:{seed}").random() >= config.digest:
        return False
    limits = draw_limits(seed, config.limits)
    return limits is None or limits.tool != "book"


def _has_importer(seed: int) -> bool:
    """Whether a seed's cast has the importer (``scenario.build``), and errands with it."""
    return random.Random(f"import:{seed}").random() < 0.35


_delete_run = InMemoryStore.delete_run
_create_run = InMemoryStore.create_run


def _delete_without_spending(self: InMemoryStore, run_id: str) -> None:
    """``InMemoryStore.delete_run`` as before issue 41: the run goes, its id stays free."""
    _delete_run(self, run_id)
    self._spent.pop(run_id, None)


def _create_ignoring_spent(self: InMemoryStore, run: RunInfo) -> bool:
    """``InMemoryStore.create_run`` that never looks at spent ids (a create path that skips
    the one check: a fork's automatic name, an import)."""
    spent = self._spent.pop(run.run_id, None)
    try:
        return _create_run(self, run)
    finally:
        if spent is not None and run.run_id not in self._runs:
            self._spent[run.run_id] = spent


def _has_operator(seed: int) -> bool:
    """Whether a seed's cast has the operator who deletes runs (``scenario.build``)."""
    return random.Random(f"operator:{seed}").random() < 0.3


def _has_limits(seed: int) -> bool:
    """Whether a seed's agent has limits (in the whole cast: ``scenario.build``)."""
    from .agent import draw_limits
    from .world import Config

    return draw_limits(seed, Config(seed).limits) is not None


def _halt_unless_drifted(self: Driver) -> None:
    """``Driver._halt_on_unknown_outcomes`` that looks at the tool first: a live claim whose
    tool a deploy removed, or whose arguments its new schema refuses, is left to the call's
    own handling (an unknown tool, bad arguments) instead of halting the run."""
    halts = []
    for halt in loop.unknown_outcomes(self.state, self.run_id):
        tool = self.agent.tools.get(halt.tool_name)
        if tool is None:
            continue
        try:
            tool.validate(json.dumps(halt.arguments or {}))
        except (DurableAgentsError, ToolArgumentsError):
            continue
        halts.append(halt)
    if halts:
        self._halt_run(halts)


_why_kept = retention.why_kept


def _judge_root_only(members: Any, cutoff: Any, referrers: Any) -> str:
    """``retention.why_kept`` that looks at the tree's root alone, as a prune written before
    trees were its unit would: a root that ended in time takes its sub-runs with it."""
    mine = {m["run_id"] for m in members}
    outside = {named: ref for named, ref in referrers.items() if ref not in mine}
    return _why_kept(members[:1], cutoff, outside)


def _has_pruner(seed: int) -> bool:
    """Whether a seed's cast has the pruner (``scenario.build``, ``pruning.takes_part``)."""
    from .pruning import takes_part

    return takes_part(seed)


# -- stale-slot-release (issue 43, part 3) ----------------------------------------------------


def _release_ignoring_token(self: InMemoryStore, key: str, holder: str, token: str) -> str | None:
    """``InMemoryStore.release_slot`` as before seed 321's fix: a slot is given back to
    whoever names its holder, whatever lease token it was taken with, so a stale driver
    ending its drive gives back the slot its successor took for the same run."""
    with self._lock:
        self._slots.get(key, {}).pop(holder, None)
        waiting = self.list_throttled(key=key, limit=1)
        return waiting[0].run_id if waiting else None


# ---------------------------------------------------------------------------------------------

_tally = approval_commands.tally
_save_decision = InMemoryStore.save_decision


def _tally_every_vote(policy: Any, decisions: Any, eligible: Any) -> Any:
    """``approvals.tally`` that counts every vote recorded, a person's second one too (each
    repeat is counted as someone else: ``ann#2``)."""
    seen: dict[str, int] = {}
    votes, voters = [], list(eligible)
    for d in decisions:
        seen[d.approver] = seen.get(d.approver, 0) + 1
        if seen[d.approver] > 1:
            d = dataclasses.replace(d, approver=f"{d.approver}#{seen[d.approver]}")
            voters.append(d.approver)
        votes.append(d)
    return _tally(policy, votes, voters)


def _save_every_vote(self: InMemoryStore, decision: Any) -> bool:
    """``InMemoryStore.save_decision`` without its one row per approver: a repeat is kept."""
    with self._lock:
        current = self._requests.get((decision.run_id, decision.call_id))
        if changed_under(decision, current):
            raise asked_again(decision, current)
        decisions = self._decisions.setdefault((decision.run_id, decision.call_id), [])
        decisions.append(dataclasses.replace(decision, created_at=self.now()))
        return True


# -- safety of what was only liveness (issue 43) -----------------------------------------------

_hand_over = recovery._hand_over


def _hand_over_halted_too(store: Any, run: Any, policy: Any, now: Any) -> bool:
    """``recovery._hand_over`` that hands a halted run over as it does a queued one."""
    return run.status == HALTED or _hand_over(store, run, policy, now)


def _save_on_closed_requests(self: InMemoryStore, decision: Any) -> bool:
    """``InMemoryStore.save_decision`` before issue 43: a vote is saved whatever its request's
    status (only a request asked again under it is refused)."""
    with self._lock:
        current = self._requests.get((decision.run_id, decision.call_id))
        if changed_under(decision, current):
            raise asked_again(decision, current)
        decisions = self._decisions.setdefault((decision.run_id, decision.call_id), [])
        if any(d.approver == decision.approver for d in decisions):
            return False
        decisions.append(dataclasses.replace(decision, created_at=self.now()))
        return True


def _renew_ignoring_token(self: InMemoryStore, run_id: str, token: str, ttl: float) -> bool:
    """``InMemoryStore.renew_lease`` that looks for a live lease on the run, not for the
    renewer's: a stale driver's heartbeat extends its successor's lease and is told it
    holds the run (``UPDATE … WHERE run_id = %s AND expires_at > now()``, the token left
    out)."""
    with self._lock:
        lease = self._leases.get(run_id)
        now = self._clock()
        if lease is None or lease[2] <= now:
            return False
        self._leases[run_id] = (lease[0], lease[1], now + ttl, now)
        return True


def _has_quorum(seed: int) -> bool:
    """Whether a seed's cast can have a quorum with people (``scenario.build``)."""
    from .world import Config

    return random.Random(f"quorum:{seed}").random() < Config(seed).quorum


# -- approval rules (issue 42) ----------------------------------------------------------------


def _has_rules(seed: int) -> bool:
    """Whether a seed's cast gates refunds by approval rules (``rulecast.takes_part``)."""
    from .world import Config

    return random.Random(f"rules:{seed}").random() < Config(seed).rules


def _no_rule_for_edits(*args: Any, **kwargs: Any) -> None:
    """Neither the approve command nor the drive looks at the rule of an edit."""
    return None


def _moved_as_wanted(wanted: Any, given: Any) -> dict[str, Any]:
    """``rules.at_least`` before the fix: the request takes the edit's rule as it is."""
    return dict(wanted)


_by_rule = Driver._by_rule


def _by_rule_as_deployed(self: Driver, gate: Any) -> tuple[Any, Any]:
    """``Driver._by_rule`` that lets today's rules allow a call asked under other rules: a
    deploy that lowered the threshold lets a waiting call through unasked."""
    decision, policy = _by_rule(self, gate)
    approval = gate.tool.safety.approval
    if decision is not None or not isinstance(approval, rules.Rules):
        return decision, policy
    again = gate.previous is not None
    tag = approvals.arguments_tag(gate.args) if again else None
    asked = self.log.reread(names.rule(gate.call.id, tag))
    if asked is None or asked.get("fingerprint") == approval.fingerprint:
        return decision, policy
    match = approval.evaluate(gate.args, self._rule_context(gate.tool))
    if match.outcome.kind != rules.ALLOW:
        return decision, policy
    rec, _ = self.log.write(
        approvals.decision_name(gate.call.id, gate.args, again=again),
        {
            "kind": "approval",
            "approved": True,
            "by": f"rule:{match.rule}",
            "automatic": True,
            "rule": match.rule,
            "fingerprint": match.fingerprint,
            "explain": match.explain,
            "note": "",
            "arguments": gate.args,
        },
    )
    return rec, None


def _expire_on_the_row(
    store: Any, journal: Any, run: Any, request: Any, name: str, policy: dict[str, Any]
) -> bool:
    """``commands.deadlines._expire`` that journals the step and marks the request's row
    expired, but leaves the decision's slot (``approval:<call>``) free: the expiry is the
    row's, and a person's approval racing it (or coming later) takes the slot."""
    journal.write(
        run.run_id,
        name,
        {
            "kind": "deadline",
            "step": deadlines.EXPIRE,
            "call_id": request.call_id,
            "tool": request.tool_name,
            "policy": policy,
            "on_expiry": deadlines.on_expiry(policy),
            "arguments": request.arguments,
        },
    )
    lifecycle.move_request(
        store,
        run.run_id,
        request.call_id,
        APPROVAL_EXPIRED,
        lifecycle.SWEEP,
        if_arguments=request.arguments,
    )
    return lifecycle.hand_over(store, run.run_id, lifecycle.SWEEP, only_from=AWAITING_APPROVAL)


def _tally_every_hand(policy: Any, decisions: Any, eligible: Any) -> Any:
    """``approvals.tally`` that counts a person once per approver they decide for: their
    own vote and their vote as a deputy for someone else both count."""
    marked = [
        dataclasses.replace(d, deputy=f"{d.deputy}\x00{d.approver}") if d.deputy else d
        for d in decisions
    ]
    count = approvals.tally(policy, marked, eligible)
    entries = tuple(
        {**e, "deputy": str(e["deputy"]).split("\x00")[0]} if e.get("deputy") else e
        for e in count.decisions
    )
    return dataclasses.replace(count, decisions=entries)


class _EveryStepNew(Journal):
    """The sweep's journal, hearing every deadline step it takes as its own new write: the
    step is announced whenever a sweep takes it, not only by the write that made it true."""

    def write(self, run_id: str, name: str, body: Any, **kwargs: Any) -> Any:
        record, inserted = super().write(run_id, name, body, **kwargs)
        return record, inserted or name.startswith(names.DEADLINE)


_check_tree = Driver._check_tree


def _check_tree_unless_new(self: Driver) -> None:
    """``Driver._check_tree`` skipped in the drive that creates the sub-run: its parent
    looked at the tree right before the call, so the new sub-run takes it as looked at. A
    stop recorded between the parent's look and the sub-run's row is missed for the whole of
    that first drive."""
    if not self.started:
        _check_tree(self)


def _has_deep_trees(seed: int) -> bool:
    """Whether a seed may build trees three deep (``trees.takes_part``; the cast's other
    conditions are read when it is built)."""
    from .trees import takes_part

    return takes_part(seed)


_undo_arguments = sagas._arguments


def _undo_as_asked(driver: Any, call_id: str, tool: Any, rec: Any) -> dict[str, Any]:
    """``sagas._arguments`` that gives an undo what the model asked for (the call in its
    turn), not what the call ran with: an approver's edit is undone as the model had it."""
    ran = _undo_arguments(driver, call_id, tool, rec)
    for turn in driver.state.turns:
        for call in driver.state.calls(turn):
            if call.id == call_id:
                try:
                    return dict(tool.validate(call.arguments))
                except (DurableAgentsError, ToolArgumentsError):
                    return ran  # (what the model asked is no longer valid: as it ran)
    return ran


def _undoes_refunds(seed: int) -> bool:
    """Whether a seed's saga deploys undo their refunds (``agent.undo_refunds``)."""
    from .agent import undo_refunds

    return undo_refunds(seed)


# -- issue 45: an MCP server's calls (``remote.py``) --------------------------------------


def _has_remote(seed: int) -> bool:
    """Whether a seed's agent calls the MCP server's tools (``remote.takes_part``)."""
    from .remote import takes_part
    from .world import Config

    return takes_part(Config(seed))


def _lost_answer_as_not_sent() -> contextlib.AbstractContextManager[None]:
    """``Connection.call`` that takes a connection failing after the request was sent for
    one that failed before it: ``McpUnavailable`` (the call never ran: an error result the
    model may retry), not ``McpOutcomeUnknown``."""
    from durable_agents.mcp import connection
    from durable_agents.mcp.errors import McpOutcomeUnknown, McpUnavailable

    call = connection.Connection.call

    def call_as_not_sent(self: Any, remote: str, arguments: dict[str, Any], *rest: Any) -> Any:
        try:
            return call(self, remote, arguments, *rest)
        except McpOutcomeUnknown as exc:
            raise McpUnavailable(str(exc), server=self.server.name) from None

    return _swapped((connection.Connection, "call", call_as_not_sent))


def _transport_error_as_result() -> contextlib.AbstractContextManager[None]:
    """``McpTool.invoke`` that returns a failed call's error as the tool's result."""
    from durable_agents.mcp.errors import McpOutcomeUnknown
    from durable_agents.mcp.server import McpTool

    invoke = McpTool.invoke

    def invoke_as_result(self: Any, args: Any, ctx: Any) -> Any:
        try:
            return invoke(self, args, ctx)
        except McpOutcomeUnknown as exc:
            return {"content": [{"type": "text", "text": str(exc)}], "isError": False}

    return _swapped((McpTool, "invoke", invoke_as_result))


def _has_gated_remote(seed: int) -> bool:
    """Whether a seed's agent calls the MCP server and gates its payments."""
    from .remote import gates_pay

    return _has_remote(seed) and gates_pay(seed)


def _approval_of_any_definition() -> contextlib.AbstractContextManager[None]:
    """``loop._still_fits`` that takes an approval for the tool whatever its server has
    declared since (as if every call had been sent under its decision already)."""
    still_fits = loop._still_fits

    def any_definition(decision: Any, tool: Any, *, sent: bool = False) -> bool:
        return still_fits(decision, tool, sent=True)

    return _swapped((loop, "_still_fits", any_definition))


def _task_sent_again() -> contextlib.AbstractContextManager[None]:
    """``mcp.tasks.call`` that sends ``tools/call`` again on a resume instead of polling
    the task the call's handle names (the journal keeps the first handle; the new task
    is waited on)."""
    from durable_agents.mcp import tasks

    def call_again(
        connection: Any, remote: str, arguments: dict[str, Any], ctx: Any, notes: Any = None
    ) -> Any:
        run = tasks.TaskCall(connection, remote, ctx)
        answer = run.start(arguments)
        task = answer.get("task")
        if not isinstance(task, dict) or not isinstance(task.get("taskId"), str):
            return tasks._direct_result(run, answer)
        handle = tasks.handle_for(connection.server.name, remote, task)
        ctx.keep_handle(handle)
        return run.wait(handle, notes)

    return _swapped((tasks, "call", call_again))


def _handle_after_polls() -> contextlib.AbstractContextManager[None]:
    """``mcp.tasks.call`` that journals a new task's handle once it has waited on it, not
    before: a crash while polling leaves a claim without a handle (a halt, not a poll)."""
    from durable_agents.mcp import tasks

    def call_late(
        connection: Any, remote: str, arguments: dict[str, Any], ctx: Any, notes: Any = None
    ) -> Any:
        run = tasks.TaskCall(connection, remote, ctx)
        handle = ctx.handle()
        if handle is not None:
            return run.wait(handle, notes)
        answer = run.start(arguments)
        task = answer.get("task")
        if not isinstance(task, dict) or not isinstance(task.get("taskId"), str):
            return tasks._direct_result(run, answer)
        handle = tasks.handle_for(connection.server.name, remote, task)
        try:
            return run.wait(handle, notes)
        finally:
            ctx.keep_handle(handle)

    return _swapped((tasks, "call", call_late))


def _unknown_task_as_failed() -> contextlib.AbstractContextManager[None]:
    """``TaskCall.wait`` that takes a task the server no longer knows for a failed one: an
    error result the model reads, not an unknown outcome that halts a side effect."""
    from durable_agents.engine.errors import ToolResultError
    from durable_agents.mcp import tasks
    from durable_agents.mcp.errors import McpOutcomeUnknown

    wait = tasks.TaskCall.wait

    def wait_as_failed(self: Any, handle: dict[str, Any], notes: Any = None) -> Any:
        try:
            return wait(self, handle, notes)
        except McpOutcomeUnknown as exc:
            if exc.code != "mcp.task_unknown":
                raise
            raise ToolResultError(str(exc), tasks.error_result(str(exc))) from None

    return _swapped((tasks.TaskCall, "wait", wait_as_failed))


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str  # what it breaks, in a line
    apply: Callable[[], contextlib.AbstractContextManager[None]]
    # The cast it needs (``SIM_ACTORS`` syntax; "" keeps the whole cast).
    actors: str = ""
    # The seeds that can catch it (the others are skipped, not run): None, all of them.
    reaches: Callable[[int], bool] | None = None


MUTATIONS: dict[str, Mutation] = {
    m.name: m
    for m in (
        Mutation(
            "no-halt-on-unknown-outcome",
            "a claimed call with no result is run again instead of halting the run "
            "(RunState.live_attempts finds none)",
            lambda: _swapped((RunState, "live_attempts", _no_live_attempts)),
        ),
        Mutation(
            "fork-drops-attempt-markers",
            "a fork keeps a step's calls but not their claims (steps.prefix before hole 2)",
            lambda: _swapped((forks, "prefix", _prefix_without_attempts)),
        ),
        Mutation(
            "signature-over-earlier-arguments",
            "a signed decision is verified against the arguments the call asked about first, "
            "not the ones it asks about now",
            lambda: _swapped((approval_commands, "verify_signature", _verify_earlier)),
        ),
        Mutation(
            "halt-min-age-zero",
            "a halt may be resolved the moment it is written (HALT_MIN_AGE = 0)",
            _no_halt_age,
        ),
        Mutation(
            "no-cancel-cascade",
            "a cancel stops the run but none of the sub-runs below it (stops.stop_below "
            "does nothing)",
            lambda: _swapped((stops, "stop_below", lambda store, run_id: [])),
        ),
        Mutation(
            "imports-not-inert",
            "an import is written as a run made here: drivers lease it, recovery lists it, "
            "every command acts on it (RunInfo.inert is never true)",
            lambda: _swapped((RunInfo, "inert", property(lambda self: False))),
        ),
        Mutation(
            "sub-run-ignores-stopped-root",
            "a sub-run drives on under a cancelled or aborted ancestor (Driver._check_tree "
            "does nothing)",
            lambda: _swapped((Driver, "_check_tree", lambda self: None)),
        ),
        Mutation(
            "late-sub-run-under-cancel",
            "a sub-run created after its root was cancelled drives on: the drive that creates "
            "it skips its look at the stops above it (Driver._check_tree in a drive that "
            "started the run), taking its parent's look before the call for its own",
            lambda: _swapped((Driver, "_check_tree", _check_tree_unless_new)),
            reaches=_has_deep_trees,
        ),
        Mutation(
            "undo-with-model-arguments",
            "a rollback undoes a call with the arguments the model asked for, not the ones it "
            "ran with: an approver's edit is undone as the model had it (sagas._arguments "
            "reads the model's turn)",
            lambda: _swapped((sagas, "_arguments", _undo_as_asked)),
            reaches=_undoes_refunds,
        ),
        Mutation(
            "parent-adopts-imported-sub-run",
            "a parent takes an inert import at its sub-run's id for its finished sub-run "
            "(imported.refuse_sub_run and the sub-run drive's refusal let it through)",
            lambda: _swapped(
                (imported, "refuse_sub_run", _refuse_nothing),
                (loop, "refuse_inert", _refuse_nothing),
            ),
            reaches=_has_importer,
        ),
        Mutation(
            "sweep-skips-throttled",
            "the sweep walks the paused statuses but throttled: a throttled sub-run under a "
            "cancel that died waits for its retry (a day, at 1/d) to stop",
            lambda: _swapped((timers, "lifecycle", _SweptWithoutThrottled())),
            reaches=_has_digest,
        ),
        Mutation(
            "delete-does-not-spend",
            "a deleted run's id is free again: a client's retry, a fork named with it or a "
            "live import of its export starts it anew (InMemoryStore.delete_run spends "
            "nothing)",
            lambda: _swapped((InMemoryStore, "delete_run", _delete_without_spending)),
            reaches=_has_operator,
        ),
        Mutation(
            "create-ignores-spent",
            "a run row is created under a spent id (InMemoryStore.create_run skips the check "
            "every create goes through)",
            lambda: _swapped((InMemoryStore, "create_run", _create_ignoring_spent)),
            reaches=_has_operator,
        ),
        Mutation(
            "drift-at-a-live-claim",
            "a live claim is judged by the tool as deployed now: one whose tool was removed "
            "or whose schema changed gets an error result instead of a halt (the drive looks "
            "at the tool before the claim)",
            lambda: _swapped((Driver, "_halt_on_unknown_outcomes", _halt_unless_drifted)),
        ),
        Mutation(
            "slots-ignore-limit",
            "a slot is granted to any run holding its lease, however many are held "
            "(InMemoryStore.claim_slot never counts)",
            lambda: _swapped((InMemoryStore, "claim_slot", _claim_ignoring_limit)),
            reaches=_has_limits,
        ),
        Mutation(
            "slots-outlive-leases",
            "a slot counts until it is given back, not while its lease is live: a dead "
            "driver's slot is never freed (InMemoryStore.claim_slot keeps dead slots)",
            lambda: _swapped((InMemoryStore, "claim_slot", _claim_outliving_leases)),
            reaches=_has_limits,
        ),
        Mutation(
            "rates-never-refuse",
            "a rate grants every permit (InMemoryStore.take_permit always says 0)",
            lambda: _swapped((InMemoryStore, "take_permit", _permit_always)),
            reaches=_has_limits,
        ),
        # Issue 43: retention in the world.
        Mutation(
            "prune-judges-root-only",
            "a prune judges a tree by its root alone: a tree whose root ended before the "
            "cutoff goes whole, with a sub-run still going or ended since (retention.why_kept "
            "reads the root only)",
            lambda: _swapped((retention, "why_kept", _judge_root_only)),
            reaches=_has_pruner,
        ),
        # -- stale-slot-release (issue 43, part 3) ------------------------------------------
        Mutation(
            "stale-slot-release",
            "a stale driver gives back the slot its successor took: release_slot ignores the "
            "lease token the slot was taken with (InMemoryStore.release_slot before seed 321)",
            lambda: _swapped((InMemoryStore, "release_slot", _release_ignoring_token)),
            reaches=_has_limits,
        ),
        # Issue 42: approval rules (``rulecast.py``); only the rules casts are run.
        Mutation(
            "edits-not-reevaluated",
            "an approver's edit is decided under the rule the call was asked under: neither "
            "the approve command nor the drive looks at the rule of the edited arguments",
            lambda: _swapped(
                (approval_commands, "_policy_for_edit", _no_rule_for_edits),
                (Driver, "_edit_short_of_rules", _no_rule_for_edits),
            ),
            reaches=_has_rules,
        ),
        Mutation(
            "edit-lowers-need",
            "an edit that moves a request under another group's rule takes that rule's "
            "count: two of finance become one lead (rules.at_least before its fix)",
            lambda: _swapped((rules, "at_least", _moved_as_wanted)),
            reaches=_has_rules,
        ),
        Mutation(
            "deploy-lowers-pending",
            "a drive evaluates today's rules again for a call asked under others: a deploy "
            "that lowered a threshold lets a waiting call through unasked",
            lambda: _swapped((Driver, "_by_rule", _by_rule_as_deployed)),
            reaches=_has_rules,
        ),
        Mutation(
            "expiry-on-the-row",
            "an expiry marks the request's row and leaves the decision's record free: an "
            "approval racing it, or coming later, takes the call",
            lambda: _swapped((deadline_commands, "_expire", _expire_on_the_row)),
            reaches=_has_rules,
        ),
        Mutation(
            "deputy-counted-twice",
            "a person's own vote and their vote as a deputy for another approver both count "
            "(the command's one-hand check and the tally's)",
            lambda: _swapped(
                (approval_commands, "_refuse_second_hand", _refuse_nothing),
                (approval_commands, "tally", _tally_every_hand),
                (timers, "tally", _tally_every_hand),
            ),
            reaches=_has_rules,
        ),
        Mutation(
            "reminders-every-sweep",
            "a deadline step is announced by every sweep that takes it, not only by the "
            "write that made it true (two sweeps racing, or one after a crash, tell twice)",
            lambda: _swapped((deadline_commands, "Journal", _EveryStepNew)),
            reaches=_has_rules,
        ),
        # -------------------------------------------------------------------------------------
        # Issue 43: safety of what was only liveness.
        Mutation(
            "halted-runs-re-driven",
            "recovery hands a halted run to a driver as it does a queued one (RECOVERABLE "
            "lists halted, recovery._hand_over sends it)",
            lambda: _swapped(
                (recovery, "RECOVERABLE", (*recovery.RECOVERABLE, HALTED)),
                (recovery, "_hand_over", _hand_over_halted_too),
            ),
        ),
        Mutation(
            "votes-after-close",
            "a vote is saved and counted after its request closed: the store saves it "
            "whatever the request's status, and approve no longer refuses a withdrawn "
            "request or a stopped run (approvals._refuse_orphans does nothing)",
            lambda: _swapped(
                (InMemoryStore, "save_decision", _save_on_closed_requests),
                (approval_commands, "_refuse_orphans", _refuse_nothing),
            ),
        ),
        Mutation(
            "token-blind-renewal",
            "a lease renewal ignores the token: a stale driver's heartbeat extends its "
            "successor's lease and is told it still holds the run "
            "(InMemoryStore.renew_lease looks for any live lease)",
            lambda: _swapped((InMemoryStore, "renew_lease", _renew_ignoring_token)),
        ),
        Mutation(
            "forks-at-unknown",
            "a fork at a call whose outcome is unknown keeps its claim but drops the tool's "
            "word that it could not tell (steps.prefix leaves @unknown records out)",
            lambda: _swapped((forks, "prefix", _prefix_without_unknowns)),
        ),
        # Issue 45: an MCP server's calls, their answers lost (``remote.py``).
        Mutation(
            "mcp-lost-answer-as-not-sent",
            "a connection that failed after an MCP call was sent is taken for one that failed "
            "before: the call is an error result the model retries (McpUnavailable), not an "
            "unknown outcome that halts a side effect",
            _lost_answer_as_not_sent,
            reaches=_has_remote,
        ),
        Mutation(
            "mcp-transport-error-as-result",
            "an MCP call whose connection failed after it was sent returns the failure as the "
            "tool's result (McpTool.invoke), as if the server had answered it",
            _transport_error_as_result,
            reaches=_has_remote,
        ),
        # An MCP server's tasks, polled across crashes (``remote.py``, ``handle:<call>``).
        Mutation(
            "mcp-task-sent-again",
            "a resumed call whose handle names an MCP task sends tools/call again (a second "
            "task) instead of polling the one it handed off (mcp.tasks.call)",
            _task_sent_again,
            reaches=_has_remote,
        ),
        Mutation(
            "mcp-task-handle-after-polls",
            "a new MCP task's handle is journaled once the call has waited on it, not before "
            "(mcp.tasks.call): a crash while polling leaves a claim without a handle",
            _handle_after_polls,
            reaches=_has_remote,
        ),
        Mutation(
            "mcp-unknown-task-as-failed",
            "a task the MCP server no longer knows is taken for a failed one: an error result "
            "the model retries on, not an unknown outcome that halts a side effect "
            "(TaskCall.wait)",
            _unknown_task_as_failed,
            reaches=_has_remote,
        ),
        # Issue 45: a decision bound to the definition its MCP server declared when asked.
        Mutation(
            "mcp-approval-of-any-definition",
            "an approval of an MCP tool's call stands whatever the server declared since it was "
            "asked (Driver._decision ignores the decision's tool_digest): the call is sent under "
            "a definition nobody approved",
            _approval_of_any_definition,
            reaches=_has_gated_remote,
        ),
        Mutation(
            "repeat-voters",
            "a quorum counts one person's two votes: a vote repeated at once is kept as a second "
            "row (InMemoryStore.save_decision) and counted (approvals.tally)",
            lambda: _swapped(
                (InMemoryStore, "save_decision", _save_every_vote),
                (approval_commands, "tally", _tally_every_vote),
                (timers, "tally", _tally_every_vote),
            ),
            reaches=_has_quorum,
        ),
    )
}


def applied(name: str) -> contextlib.AbstractContextManager[None]:
    """The mutation ``name`` for one seed ("" for none)."""
    if not name:
        return contextlib.nullcontext()
    try:
        mutation = MUTATIONS[name]
    except KeyError:
        raise ValueError(f"unknown mutation {name!r}; choose from {sorted(MUTATIONS)}") from None
    return mutation.apply()
