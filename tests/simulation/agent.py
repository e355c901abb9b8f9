"""The simulated agent: five tools that write to the world's ledger, a model that follows a
plan, the deploys that change them, and the plans runs are started with.

The tools give the scheduler a point before and after their effect. The model is a pure
function of the transcript (plus a seeded stream for call ids and the odd filtered answer):
it works through the plan in the last ``plan:`` user message, reads the tool schemas it is
sent, retries a call that came back as an error (up to three tries, never a denial), and
answers when the plan is done.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, replace
from typing import Any

import durable_agents as da
from durable_agents.engine.errors import ToolOutcomeUnknown
from durable_agents.engine.limits import parse_rate
from durable_agents.engine.model import (
    FINISH_FILTERED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from durable_agents.engine.tools import ToolContext
from durable_agents.engine.waits import TimedOut

from . import world as W

AGENT = "sim-agent"
SESSION = "chat"
NOT_HAPPENED = {"error": "did not happen", "checked": "ledger"}
# The MCP server's tools (``remote.py``): ``crm__pay`` at most once, ``crm__mail`` keyed,
# ``crm__ship`` at most once, run as a task the server keeps.
REMOTE_PAY, REMOTE_MAIL, REMOTE_SHIP = "crm__pay", "crm__mail", "crm__ship"
# At most once, under an attempt claim.
UNFLAGGED = frozenset({"charge", "refund", REMOTE_PAY, REMOTE_SHIP})
KEYED = frozenset({"notify", "book", REMOTE_MAIL})  # retry-safe: downstream dedupes by key
GATED = frozenset({"refund"})
# A quorum cast's refunds need two approvals from the payouts group: its members are the
# cast's people (``World.eligible``), never the outsider who tries to decide too.
QUORUM = da.Quorum(need=2, group=W.PAYOUTS)
DECLINED_AMOUNT = 13  # a charge of this amount is declined before anything happens
UNKNOWN_AMOUNT = 35  # a charge of this amount times out after the money moved
UNKNOWN_MESSAGE = "the payment gateway timed out after the charge was sent"  # what it says


def is_agent_run(run_id: str) -> bool:
    return not (run_id.endswith(">session") or run_id.startswith("steps-"))


# -- tools --------------------------------------------------------------------------------


def _act(tool: str, args: dict[str, Any], ctx: ToolContext) -> Any:
    w = W.CURRENT
    assert w is not None
    entered = w.entry_seq()  # before the scheduler may run anyone else
    w.step_begins(ctx.run_id, f"{tool} call {ctx.call_id}", ctx.call_id)
    w.slow_tool(tool, ctx.run_id, ctx.call_id)
    w.point(f"tool {tool} {ctx.call_id} start")
    w.begins(ctx.call_id)
    w.work_begins(ctx.run_id, tool, ctx.call_id)
    if tool == "charge" and args["amount"] == DECLINED_AMOUNT:
        w.record(
            tool,
            ctx.run_id,
            ctx.call_id,
            args,
            ctx.idempotency_key,
            "declined",
            effect=False,
            outcome="raised",
            entered=entered,
        )
        raise RuntimeError("card declined")
    value = {"tool": tool, "order": args["order"], "receipt": w.next_receipt()}
    entry = w.record(
        tool,
        ctx.run_id,
        ctx.call_id,
        args,
        ctx.idempotency_key,
        value,
        effect=tool != "lookup",
        dedupe=tool in KEYED,
        entered=entered,
    )
    w.point(f"tool {tool} {ctx.call_id} done")
    if tool == "charge" and args["amount"] == UNKNOWN_AMOUNT:
        entry.outcome = "unknown"
        raise ToolOutcomeUnknown(UNKNOWN_MESSAGE)
    return entry.value


def lookup(order: int, ctx: ToolContext) -> Any:
    """Look an order up."""
    return _act("lookup", {"order": order}, ctx)


def charge_v1(order: int, amount: int, ctx: ToolContext) -> Any:
    """Charge the customer's card."""
    return _act("charge", {"order": order, "amount": amount}, ctx)


def charge_v2(order: int, amount: int, currency: str, ctx: ToolContext) -> Any:
    """Charge the customer's card in a currency."""
    args = {"order": order, "amount": amount, "currency": currency}
    return _act("charge", args, ctx)


def refund_v1(order: int, amount: int, ctx: ToolContext) -> Any:
    """Refund an order (a person approves it first)."""
    return _act("refund", {"order": order, "amount": amount}, ctx)


def refund_v2(order: int, amount: int, ctx: ToolContext, reason: str = "goodwill") -> Any:
    """Refund an order for a reason (a person approves it first)."""
    return _act("refund", {"order": order, "amount": amount, "reason": reason}, ctx)


def notify(order: int, text: str, ctx: ToolContext) -> Any:
    """Mail the customer (the mailer dedupes by idempotency key)."""
    return _act("notify", {"order": order, "text": text}, ctx)


def book(order: int, slot: int, ctx: ToolContext) -> Any:
    """Book a delivery slot (keyed by the order)."""
    return _act("book", {"order": order, "slot": slot}, ctx)


ANSWERS = ["yes", "no"]  # what a person may answer; anything else is refused
# A payment's deadline (seconds after its wait began), and what ``confirm`` returns when the
# deadline won.
SIGNAL_TIMEOUT = 40.0
TIMED_OUT = {"timed_out": True}


def wait_name(order: int) -> str:
    """An even order asks staff (an interrupt); an order of 1, 5, 9… awaits the payment (a
    signal); one of 3, 7, 11… reads the carrier's messages (a channel)."""
    if order % 2 == 0:
        return f"ok-{order}"
    return f"paid-{order}" if order % 4 == 1 else f"inbox-{order}"


def ship_prompt(order: int, version: int) -> str:
    """What ``confirm`` asks staff about an even order: a deploy may reword it (``Deploy.ask``),
    and a question asked again in other words is a new question (issue 29)."""
    return f"Ship order {order}?" if version == 0 else f"Ship order {order} today?"


def _confirm(version: int) -> Any:
    def confirm(order: int, ctx: ToolContext) -> Any:
        """Ask staff to confirm an order, or wait for its payment (read-only: it re-runs); an
        order of 1, 5, 9… naps 20 s first."""
        w = W.CURRENT
        assert w is not None
        entered = w.entry_seq()
        w.point(f"tool confirm {ctx.call_id} start")
        name = wait_name(order)
        got: dict[str, Any] = {}

        def handled(value: Any) -> W.Effect:
            return w.record(
                "confirm",
                ctx.run_id,
                ctx.call_id,
                {"order": order},
                "",
                {"wait": name, "value": value, **got},
                effect=False,
                entered=entered,
            )

        if order % 4 == 1:
            # A timer first: the run sleeps 20 s (its wake time journaled once), then waits.
            ctx.sleep(f"nap-{order}", 20.0)
            w.count("timers woke")
        if order % 2 == 0:
            prompt = ship_prompt(order, version)
            value = ctx.interrupt(name, prompt, schema={"type": "string", "enum": ANSWERS})
            got["prompt"] = prompt
        elif order % 4 == 1:
            # Orders 5, 13, 21…: the payment has a deadline; a callback racing it either wins
            # (its payload) or finds the wait timed out (issue 32).
            timeout = SIGNAL_TIMEOUT if order % 8 == 5 else None
            value = ctx.await_signal(name, timeout=timeout)
            if isinstance(value, TimedOut):
                value = TIMED_OUT
        else:
            # The oldest message nothing acked; handled (written to the ledger), then acked:
            # consumed once by this call. A run of the call that dies after the ack goes on
            # with the next message (docs/waiting.md).
            msg = ctx.receive(name)
            got["key"] = msg.key
            entry = handled(msg.payload)
            ctx.ack(name, msg.key)
            w.point(f"tool confirm {ctx.call_id} done")
            return entry.value
        entry = handled(value)
        w.point(f"tool confirm {ctx.call_id} done")
        return entry.value

    return confirm


confirm = _confirm(0)


# -- undos (sagas, issue 16) ---------------------------------------------------------------
# A saga deploy's charge is refunded and its booking released when the run aborts: each undo
# is a ledgered effect of its own (``uncharge``/``unbook``, call ``compensate:<call>``), with
# scheduler points around it, so a crash can land inside an undo.


def _undo(tool: str, args: dict[str, Any], result: Any, ctx: ToolContext) -> Any:
    w = W.CURRENT
    assert w is not None
    w.step_begins(ctx.run_id, f"{tool} (an undo) {ctx.call_id}", ctx.call_id)
    w.point(f"tool {tool} {ctx.call_id} start")
    entry = w.record(tool, ctx.run_id, ctx.call_id, args, ctx.idempotency_key, result, effect=True)
    w.count("undos run")
    w.point(f"tool {tool} {ctx.call_id} done")
    return {"undone": entry.seq}


def uncharge(args: dict[str, Any], result: Any, ctx: ToolContext) -> Any:
    return _undo("uncharge", args, result, ctx)


def unbook(args: dict[str, Any], result: Any, ctx: ToolContext) -> Any:
    return _undo("unbook", args, result, ctx)


def unrefund(args: dict[str, Any], result: Any, ctx: ToolContext) -> Any:
    return _undo("unrefund", args, result, ctx)


UNDOS = frozenset({"uncharge", "unbook", "unrefund"})

TOOLS = {
    "lookup": da.tool(lookup, name="lookup", read_only=True),
    "charge_v1_saga": da.tool(charge_v1, name="charge", compensate=uncharge),
    "charge_v2_saga": da.tool(charge_v2, name="charge", compensate=uncharge),
    "book_saga": da.tool(
        book, name="book", idempotency_key=lambda a: f"book-{a['order']}", compensate=unbook
    ),
    "charge_v1": da.tool(charge_v1, name="charge"),
    "charge_v2": da.tool(charge_v2, name="charge"),
    "refund_v1": da.tool(refund_v1, name="refund", requires_approval=True),
    "refund_v2": da.tool(refund_v2, name="refund", requires_approval=True),
    "refund_v1_quorum": da.tool(refund_v1, name="refund", approval=QUORUM),
    "refund_v2_quorum": da.tool(refund_v2, name="refund", approval=QUORUM),
    # Issue 43: gated and compensable (a saga deploy's ``undo_refunds``): an approver's edit
    # is what ran, and what its undo must be given.
    "refund_v1_undo": da.tool(
        refund_v1, name="refund", requires_approval=True, compensate=unrefund
    ),
    "refund_v2_undo": da.tool(
        refund_v2, name="refund", requires_approval=True, compensate=unrefund
    ),
    "refund_v1_quorum_undo": da.tool(
        refund_v1, name="refund", approval=QUORUM, compensate=unrefund
    ),
    "refund_v2_quorum_undo": da.tool(
        refund_v2, name="refund", approval=QUORUM, compensate=unrefund
    ),
    "notify": da.tool(notify, name="notify", idempotent=True),
    "book": da.tool(book, name="book", idempotency_key=lambda a: f"book-{a['order']}"),
    "confirm": da.tool(confirm, name="confirm", read_only=True),
    "confirm_ask1": da.tool(_confirm(1), name="confirm", read_only=True),
}

# -- approval rules (issue 42: ``rulecast.py``) -------------------------------------------
# A rules cast's refunds are gated by a company's policy on the amount: small ones go
# through, middling ones one lead decides, larger ones two of finance, and the largest are
# refused. Version 2 (a deploy) moves every threshold up, so a request waiting under version
# 1 would need less under it. Every request has a deadline: reminded, escalated to the
# on-call group, and expired (``on_expiry`` drawn per cast).
LEADS, FINANCE, ONCALL = "leads", "finance", "oncall"
REMIND, ESCALATE, EXPIRE = 60.0, 120.0, 240.0
RULE_THRESHOLDS = {1: (15, 30, 70), 2: (25, 45, 60)}  # allow <=, one lead <=, deny >


def rules_policy(version: int, on_expiry: str) -> da.Rules:
    allow, lead, deny = RULE_THRESHOLDS[version]
    return da.Rules(
        [
            da.Rule("small", da.arg("amount") <= allow, da.allow),
            da.Rule(
                "too-big",
                da.arg("amount") > deny,
                da.deny(f"Refunds above {deny} are done by phone: ask the customer to call."),
            ),
            da.Rule("lead", da.arg("amount") <= lead, da.ask(LEADS)),
        ],
        default=da.ask(da.Quorum(2, FINANCE)),
        deadline=da.Deadline(
            remind=REMIND, escalate=(ESCALATE, ONCALL), expire=EXPIRE, on_expiry=on_expiry
        ),
    )


RULES = {
    (version, on_expiry): rules_policy(version, on_expiry)
    for version in RULE_THRESHOLDS
    for on_expiry in ("deny", "cancel", "halt")
}
for (_version, _expiry), _policy in RULES.items():
    for _reason, _fn in (("", refund_v1), ("_reason", refund_v2)):
        TOOLS[f"refund{_reason}_rules{_version}_{_expiry}"] = da.tool(
            _fn, name="refund", approval=_policy
        )

# -- the model ----------------------------------------------------------------------------


def parse_plan(text: str) -> list[list[tuple[str, int, int]]]:
    """``plan:charge.1.20|lookup.2.0;refund.1.20`` -> steps of (tool, order, amount)."""
    steps = []
    for step in text[len("plan:") :].split(";"):
        ops = []
        for op in step.split("|"):
            tool, order, amount = op.split(".")
            ops.append((tool, int(order), int(amount)))
        steps.append(ops)
    return steps


def _op_of(call: ToolCall) -> tuple[str, int] | None:
    try:
        args = json.loads(call.arguments or "{}")
        if call.name == ERRAND:  # a sub-agent's one argument is its input: a plan
            return call.name, parse_plan(str(args["input"]))[0][0][1]
        return call.name, int(args["order"])
    except (ValueError, KeyError, TypeError):
        return None


def errand_plan(order: int, about: str = "") -> str:
    """An errand's own plan: mail the customer and book a slot; then, for one order in three,
    refund it (a call staff approve: the sub-run pauses, and a decision drives it on its own
    while its parent waits), or for another, ask staff to confirm it (a question). So a
    parent is cancelled or aborted while its sub-run is paused, or busy in another worker.
    ``about``: the errand tool's description, which names a deep errand's agent or a chore's
    (``trees.py``): a three-deep tree's plans."""
    if DEEP_TAG in about or CHORE_TAG in about:
        from .trees import plan_for

        return plan_for(order, chore=CHORE_TAG in about)
    plan = f"plan:notify.{order}.0|book.{order}.0"
    if order % 3 == 0:
        plan += f";refund.{order}.20"
    elif order % 6 == 4:
        plan += f";confirm.{order}.0"
    return plan


def _arguments(tool: str, order: int, amount: int, spec: Any) -> str:
    if tool == ERRAND:  # the sub-run mails the customer and books a slot
        return json.dumps({"input": errand_plan(order, spec.description if spec else "")})
    args: dict[str, Any] = {"order": order}
    if tool in ("charge", "refund", REMOTE_PAY, REMOTE_SHIP):
        args["amount"] = amount
    elif tool in ("notify", REMOTE_MAIL):
        args["text"] = f"about order {order}"
    elif tool == "book":
        args["slot"] = order % 3
    params = dict(spec.parameters) if spec is not None else {}
    props = params.get("properties") or {}
    for name in params.get("required") or ():  # a model reads the schema it is sent
        if name not in args:
            args[name] = "EUR" if (props.get(name) or {}).get("type") == "string" else 1
    return json.dumps(args, sort_keys=True)


class SimModel:
    """Follows the plan of the last ``plan:`` message; bills every response it gives."""

    model_id = W.MODEL_ID

    def generate(self, request: ModelRequest) -> ModelResponse:
        w = W.CURRENT
        assert w is not None
        proc = w.current
        run_id = proc.leased[-1] if proc is not None and proc.leased else None
        w.step_begins(run_id, "a model call")
        w.point("model start")
        w.work_begins(run_id)
        msgs = list(request.messages)
        usage = Usage(10 + 2 * len(msgs), 5)
        roll = w.model_rng.random()
        message = self._next(w, msgs, {t.name: t for t in request.tools})
        finish = FINISH_TOOL_CALLS if message.tool_calls else FINISH_STOP
        if roll < 0.02:
            finish = FINISH_FILTERED  # retryable: the loop asks again
        elif roll < 0.025:
            finish = FINISH_LENGTH  # not retryable: the run fails
        w.bill(usage.total_tokens)
        w.point("model billed")
        return ModelResponse(message, usage, finish, "sim", self.model_id)

    def _next(self, w: W.World, msgs: list[Message], offered: dict[str, Any]) -> Message:
        at = next(
            (
                i
                for i in range(len(msgs) - 1, -1, -1)
                if msgs[i].role == "user" and msgs[i].content.startswith("plan:")
            ),
            None,
        )
        if at is None:
            first = msgs[0].content[:60] if msgs else ""
            w.violate(
                "only_agent_runs_run",
                f"the model was asked to continue a transcript nobody sent (it starts {first!r})",
                hole="4",
            )
            return Message("assistant", "nothing to do")
        steps = parse_plan(msgs[at].content)
        tries: dict[tuple[str, int], int] = {}
        status: dict[tuple[str, int], str] = {}
        by_call: dict[str, tuple[str, int]] = {}
        stop = False
        for m in msgs[at + 1 :]:
            if m.role == "assistant":
                for c in m.tool_calls:
                    op = _op_of(c)
                    if op is not None:
                        by_call[c.id] = op
                        tries[op] = tries.get(op, 0) + 1
            elif m.role == "tool":
                op = by_call.get(m.tool_call_id or "")
                if op is None:
                    continue
                if not m.is_error:
                    status[op] = "ok"
                elif '"error":"denied"' in m.content or tries[op] >= 3:
                    status[op] = "gave-up"
                else:
                    status[op] = "retry"
            elif m.role == "user" and m.content == "stop":
                stop = True
        n = sum(1 for m in msgs if m.role == "assistant") + 1
        if not stop:
            for step in steps:
                todo = [
                    op
                    for op in step
                    if status.get(op[:2]) not in ("ok", "gave-up") and op[0] in offered
                ]
                if todo:
                    calls = tuple(
                        ToolCall(
                            f"c{n}.{j + 1}.{w.model_rng.randrange(100)}",
                            tool,
                            _arguments(tool, order, amount, offered.get(tool)),
                        )
                        for j, (tool, order, amount) in enumerate(todo)
                    )
                    return Message("assistant", "", tool_calls=calls)
        summary = " ".join(
            f"{t}.{o}={status.get((t, o), 'skipped')}" for step in steps for t, o, _ in step
        )
        return Message("assistant", f"done: {summary}")


MODEL = SimModel()

# -- a sub-agent (issue 16) ---------------------------------------------------------------

ERRAND = "errand"
# The agents of a three-deep tree's errands (``trees.py``), as their tools' descriptions name
# them: the model reads which plan to give.
DEEP_TAG, CHORE_TAG = "sim-errand-deep", "sim-chore"
# Runs the errand its parent's call gives it (a plan of its own) with keyed side effects;
# the parent calls it as a tool, so each call is a sub-run ``<parent>/<call>``.
ERRAND_AGENT = da.Agent(
    "sim-errand",
    MODEL,
    "Run the errand.",
    [TOOLS["notify"], TOOLS["book"], TOOLS["refund_v1"], TOOLS["confirm"]],
    max_turns=6,
    model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
)
TOOLS[ERRAND] = ERRAND_AGENT.as_tool(name=ERRAND)
# The errand of a saga deploy: its booking has an undo, so an aborted parent rolls the
# sub-run back in its own journal (the saga recurses into the tree).
ERRAND_SAGA_AGENT = da.Agent(
    "sim-errand-saga",
    MODEL,
    "Run the errand.",
    [TOOLS["notify"], TOOLS["book_saga"], TOOLS["refund_v1"], TOOLS["confirm"]],
    max_turns=6,
    model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
)
TOOLS["errand_saga"] = ERRAND_SAGA_AGENT.as_tool(name=ERRAND)

# -- limits (engine.limits) ---------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one seed's agent is limited to (``Agent(max_concurrent_runs=)``, ``@tool(rate=,
    max_concurrent=)``, a site's model rate): drawn once per seed, kept by every deploy."""

    runs: int | None = None  # max_concurrent_runs of the simulated agent
    tool: str = ""  # the one limited tool, if any
    tool_concurrent: int | None = None
    tool_rate: str | None = None
    model_rate: str | None = None  # a rate for every call of the model (every agent's)

    def describe(self) -> str:
        parts = [f"runs<={self.runs}"] if self.runs else []
        if self.tool:
            parts.append(f"{self.tool}: {self.tool_concurrent or '-'} at once, {self.tool_rate}")
        if self.model_rate:
            parts.append(f"model {self.model_rate}")
        return "limits(" + "; ".join(parts) + ")"


# The tool limits a seed may draw: (tool, max_concurrent, rate). Charges are at most once (a
# throttled call has no claim yet: its retry is its first attempt); lookups are read-only;
# notifications are keyed; errands and waits are never limited here.
TOOL_LIMITS = (
    ("charge", 1, None),
    ("charge", 1, "2/20s"),
    ("lookup", None, "1/10s"),
    ("notify", 1, "2/20s"),
    ("book", None, "1/15s"),
)


def draw_limits(seed: int, odds: float) -> Limits | None:
    """Whether this seed's agent has limits, and which: from a stream of the seed's own
    (``limits:<seed>``), so seeds without them keep their schedules."""
    rng = random.Random(f"limits:{seed}")
    if rng.random() >= odds:
        return None
    runs = rng.choice((None, 1, 1, 2))
    tool, concurrent, rate = rng.choice((("", None, None), *TOOL_LIMITS))
    model_rate = "3/20s" if rng.random() < 0.3 else None
    if runs is None and not tool and model_rate is None:
        runs = 1
    return Limits(runs, tool, concurrent, rate, model_rate)


_LIMITED: dict[tuple[int, int | None, str | None], Any] = {}


def limited(tool: Any, concurrent: int | None, rate: str | None) -> Any:
    """A copy of ``tool`` with limits (the same copy for the same limits: every deploy of a
    seed runs the same tool objects)."""
    key = (id(tool), concurrent, rate)
    if key not in _LIMITED:
        made = copy.copy(tool)
        made.max_concurrent = concurrent
        made.rate = parse_rate(rate, f"tool {tool.name!r}") if rate is not None else None
        _LIMITED[key] = made
    return _LIMITED[key]


# The digest casts (issue 41): an errand's booking is posted at most once a day
# (``rate="1/d"``), and today's was posted before the seed began (``scenario.build`` spends
# the rate): every errand that books waits, throttled, until tomorrow, its parent paused on
# it, while people cancel the tree above it.
DIGEST_RATE = "1/d"
for _saga in ("", "_saga"):
    _errand = da.Agent(
        f"sim-errand{_saga.replace('_', '-')}-digest",
        MODEL,
        "Run the errand.",
        [
            TOOLS["notify"],
            limited(TOOLS["book" + _saga], None, DIGEST_RATE),
            TOOLS["refund_v1"],
            TOOLS["confirm"],
        ],
        max_turns=6,
        model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
    )
    TOOLS[f"errand{_saga}_digest"] = _errand.as_tool(name=ERRAND)


# -- deploys ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deploy:
    """One version of the agent's code."""

    currency: bool = False  # charge gains a required parameter
    reason: bool = False  # refund gains a parameter with a default
    no_notify: bool = False  # notify is removed
    no_charge: bool = False  # charge is removed
    instructions: int = 0
    drift: str = "warn"
    # A saga (issue 16): charges and the errand's bookings have undos, the agent aborts and
    # rolls back (its errands' sub-runs too) when a run fails for good. Set by the cast, not
    # drawn, so seeds without it draw what they drew before.
    saga: bool = False
    # Refunds need a quorum of two people (``QUORUM``). Set by the cast from a stream of its
    # own, never drawn from the seed's: seeds without it keep their schedules.
    quorum: bool = False
    # Two tool calls of one turn may run at once (``tool_concurrency=2``; ``world.SimPool``).
    # Set by the cast from a stream of its own, as ``quorum`` is.
    concurrent: bool = False
    # ``confirm`` rewords its question to staff (``ship_prompt``). Toggled by a deploy only in
    # the answerer's casts, from a stream of its own (``World.ask_rng``).
    ask: int = 0
    # Limits (``Limits``): set by the cast from a stream of its own, kept by every deploy.
    limits: Limits | None = None
    # The errands book under a spent daily rate (``DIGEST_RATE``): set by the cast from a
    # stream of its own, kept by every deploy.
    digest: bool = False
    # Refunds are gated by approval rules (``RULES``): their version (0: no rules), and what
    # an expired request does to its run. Set by the cast (``rulecast.py``), the version
    # changed by the rules deployer only: the seed's drawn deploys keep them.
    rules: int = 0
    expiry: str = "deny"
    # A saga's refunds have an undo too (issue 43): gated and compensable, so an approver's
    # edit is undone as it ran. Set by the cast from a stream of its own, kept by every
    # deploy.
    undo_refunds: bool = False
    # The errand's sub-agent has a sub-agent of its own: trees three deep (issue 43,
    # ``trees.py``). Set by the cast from a stream of its own, kept by every deploy.
    deep: bool = False
    # The agent calls an MCP server's tools too (issue 45, ``remote.py``). Set by the cast
    # from a stream of its own, kept by every deploy.
    remote: bool = False

    @property
    def durability(self) -> str:
        """Every other version relaxes its records (docs/durability.md): a deploy that bumps
        the instructions flips the dial under runs in flight. Derived, not drawn, so seeds
        keep their schedules; the in-memory store commits both alike, so what this explores
        is that the dial changes nothing the engine decides."""
        return "async" if self.instructions % 2 else "sync"

    def describe(self) -> str:
        parts = [f"instructions v{self.instructions}", f"on_drift={self.drift}"]
        parts.append(f"durability={self.durability}")
        parts += [
            name
            for name in (
                "currency",
                "reason",
                "no_notify",
                "no_charge",
                "saga",
                "quorum",
                "concurrent",
                "ask",
                "digest",
                "undo_refunds",
                "deep",
                "remote",
            )
            if getattr(self, name)
        ]
        if self.limits is not None:
            parts.append(self.limits.describe())
        if self.rules:
            parts.append(f"rules v{self.rules} (on expiry: {self.expiry})")
        return ", ".join(parts)

    def activate(self) -> da.Agent:
        saga = "_saga" if self.saga else ""
        tools = [TOOLS["lookup"]]
        if not self.no_charge:
            tools.append(TOOLS[("charge_v2" if self.currency else "charge_v1") + saga])
        quorum = "_quorum" if self.quorum else ""
        if self.rules:
            reason = "_reason" if self.reason else ""
            tools.append(TOOLS[f"refund{reason}_rules{self.rules}_{self.expiry}"])
        else:
            undo = "_undo" if self.saga and self.undo_refunds else ""
            tools.append(TOOLS[("refund_v2" if self.reason else "refund_v1") + quorum + undo])
        if not self.no_notify:
            tools.append(TOOLS["notify"])
        tools.append(TOOLS["book"])
        tools.append(TOOLS["confirm_ask1" if self.ask else "confirm"])
        tools.append(
            TOOLS["errand" + saga + ("_digest" if self.digest else "_deep" if self.deep else "")]
        )
        if self.remote:
            from .remote import activate

            assert W.CURRENT is not None
            tools.append(activate(W.CURRENT))
        limits = self.limits
        if limits is not None and limits.tool:
            tools = [
                limited(t, limits.tool_concurrent, limits.tool_rate) if t.name == limits.tool else t
                for t in tools
            ]
        return da.Agent(
            AGENT,
            MODEL,
            f"Handle the customer's orders. (v{self.instructions})",
            tools,
            max_turns=8,
            on_drift=self.drift,
            model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
            durability=self.durability,
            saga=self.saga,
            tool_concurrency=2 if self.concurrent else 1,
            max_concurrent_runs=limits.runs if limits is not None else None,
        )

    def changed(self, w: W.World) -> Deploy:
        what = w.pick(
            [
                (4, "currency"),
                (2, "reason"),
                (1, "no_notify"),
                (1, "no_charge"),
                (1, "instr"),
                (1, "drift"),
            ]
        )
        if "answerer" in w.config.actors and w.ask_rng.random() < 0.4:
            # (Drawn from a stream of its own: the seed's schedule draws what it drew.)
            return replace(self._changed(what), ask=1 - self.ask)
        return self._changed(what)

    def _changed(self, what: str) -> Deploy:
        if what == "instr":
            return replace(self, instructions=self.instructions + 1)
        if what == "drift":
            return replace(self, drift="error" if self.drift == "warn" else "warn")
        return replace(self, **{what: not getattr(self, what)})


def undo_refunds(seed: int) -> bool:
    """Whether a cast with the answerer (a saga deploy) undoes its refunds (issue 43): from a
    stream of its own."""
    return random.Random(f"undo-refunds:{seed}").random() < 0.5


# -- the plans of one seed ----------------------------------------------------------------


class Plans:
    def __init__(self, w: W.World) -> None:
        self.w = w
        self.next_order = 1
        self.tools = ["charge", "charge", "charge", "refund", "notify", "book"]
        # Waits (issue 15) came after the seeds of the known holes were found: without the
        # answerer, a seed draws what it drew before, so those seeds keep their schedules.
        if "answerer" in w.config.actors:
            self.tools.append("confirm")
            self.tools.append(ERRAND)  # sub-agents came after waits: the same seeds draw them
            if undo_refunds(w.config.seed):
                # Issue 43: refunds that are undone as they ran, asked for more often.
                self.tools += ["refund", "refund"]
        # Issue 43: in half the casts that undo refunds (a stream of their own), a plan with a
        # refund ends with a question or a wait, so a run whose edited refund ran pauses
        # before it finishes: the moment a person can roll it back.
        self.wait_last = (
            "answerer" in w.config.actors
            and undo_refunds(w.config.seed)
            and random.Random(f"undo-wait:{w.config.seed}").random() < 0.5
        )
        # Plans that open with an errand (issue 43: ``trees.py`` sets it in its casts).
        self.errand_first = 0

    def make(self) -> str:
        rng = self.w.rng
        steps = []
        for _ in range(rng.randint(1, 3)):
            ops = []
            for _ in range(rng.randint(1, 2)):
                tool = rng.choice(self.tools)
                amount = 0
                if tool in UNFLAGGED:
                    amount = rng.choice([20, 20, 40, DECLINED_AMOUNT, UNKNOWN_AMOUNT])
                ops.append(f"{tool}.{self.next_order}.{amount}")
                self.next_order += 1
            steps.append("|".join(ops))
        if rng.random() < 0.3:
            steps[0] = f"lookup.{self.next_order}.0|" + steps[0]
            self.next_order += 1
        if self.wait_last and any(op.startswith("refund.") for op in "|".join(steps).split("|")):
            steps.append(f"confirm.{self.next_order}.0")
            self.next_order += 1
        if self.errand_first:
            self.errand_first -= 1
            steps.insert(0, f"{ERRAND}.{self.next_order}.0")
            self.next_order += 1
        return "plan:" + ";".join(steps)
