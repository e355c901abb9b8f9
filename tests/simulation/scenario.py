"""What the simulated world contains: an agent with five tools and a model that follows a
plan, the deploys that change it, and the actors that use it.

The tools write to the world's ledger (the outside world: payments, mail, bookings) and
give the scheduler a point before and after their effect. The model is a pure function of
the transcript (plus a seeded stream for call ids and the odd filtered answer): it works
through the plan in the last ``plan:`` user message, retries a call that came back as an
error (up to three tries, never a denial), and answers when the plan is done.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import durable_agents as da
from durable_agents.engine import commands
from durable_agents.engine.agent import get_agent
from durable_agents.engine.errors import (
    ConfigError,
    DriveStopped,
    DurableAgentsError,
    LeaseLost,
    Pause,
    RunBusy,
    ToolOutcomeUnknown,
)
from durable_agents.engine.journal import Journal
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
from durable_agents.engine.ports import AWAITING_APPROVAL, CANCELLED, FAILED, HALTED
from durable_agents.engine.tools import ToolContext

from . import world as W

AGENT = "sim-agent"
SESSION = "chat"
NOT_HAPPENED = {"error": "did not happen", "checked": "ledger"}
UNFLAGGED = frozenset({"charge", "refund"})  # at most once, under an attempt claim
KEYED = frozenset({"notify", "book"})  # retry-safe side effects: downstream dedupes by key
GATED = frozenset({"refund"})
DECLINED_AMOUNT = 13  # a charge of this amount is declined before anything happens
UNKNOWN_AMOUNT = 35  # a charge of this amount times out after the money moved


def is_agent_run(run_id: str) -> bool:
    return not (run_id.endswith(">session") or run_id.startswith("steps-"))


# -- tools --------------------------------------------------------------------------------


def _act(tool: str, args: dict[str, Any], ctx: ToolContext) -> Any:
    w = W.CURRENT
    assert w is not None
    w.point(f"tool {tool} {ctx.call_id} start")
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
    )
    w.point(f"tool {tool} {ctx.call_id} done")
    if tool == "charge" and args["amount"] == UNKNOWN_AMOUNT:
        entry.outcome = "unknown"
        raise ToolOutcomeUnknown("the payment gateway timed out after the charge was sent")
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


TOOLS = {
    "lookup": da.tool(lookup, name="lookup", read_only=True),
    "charge_v1": da.tool(charge_v1, name="charge"),
    "charge_v2": da.tool(charge_v2, name="charge"),
    "refund_v1": da.tool(refund_v1, name="refund", requires_approval=True),
    "refund_v2": da.tool(refund_v2, name="refund", requires_approval=True),
    "notify": da.tool(notify, name="notify", idempotent=True),
    "book": da.tool(book, name="book", idempotency_key=lambda a: f"book-{a['order']}"),
}


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
        return call.name, int(args["order"])
    except (ValueError, KeyError, TypeError):
        return None


def _arguments(tool: str, order: int, amount: int, spec: Any) -> str:
    args: dict[str, Any] = {"order": order}
    if tool in ("charge", "refund"):
        args["amount"] = amount
    elif tool == "notify":
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

    model_id = "sim-model"

    def generate(self, request: ModelRequest) -> ModelResponse:
        w = W.CURRENT
        assert w is not None
        w.point("model start")
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

    def describe(self) -> str:
        parts = [f"instructions v{self.instructions}", f"on_drift={self.drift}"]
        parts += [
            name for name in ("currency", "reason", "no_notify", "no_charge") if getattr(self, name)
        ]
        return ", ".join(parts)

    def activate(self) -> da.Agent:
        tools = [TOOLS["lookup"]]
        if not self.no_charge:
            tools.append(TOOLS["charge_v2" if self.currency else "charge_v1"])
        tools.append(TOOLS["refund_v2" if self.reason else "refund_v1"])
        if not self.no_notify:
            tools.append(TOOLS["notify"])
        tools.append(TOOLS["book"])
        return da.Agent(
            AGENT,
            MODEL,
            f"Handle the customer's orders. (v{self.instructions})",
            tools,
            max_turns=8,
            on_drift=self.drift,
            model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
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
        if what == "instr":
            return replace(self, instructions=self.instructions + 1)
        if what == "drift":
            return replace(self, drift="error" if self.drift == "warn" else "warn")
        return replace(self, **{what: not getattr(self, what)})


# -- the plans of one seed ----------------------------------------------------------------


class Plans:
    def __init__(self, w: W.World) -> None:
        self.w = w
        self.next_order = 1

    def make(self) -> str:
        rng = self.w.rng
        steps = []
        for _ in range(rng.randint(1, 3)):
            ops = []
            for _ in range(rng.randint(1, 2)):
                tool = rng.choice(["charge", "charge", "charge", "refund", "notify", "book"])
                amount = 0
                if tool in UNFLAGGED:
                    amount = rng.choice([20, 20, 40, DECLINED_AMOUNT, UNKNOWN_AMOUNT])
                ops.append(f"{tool}.{self.next_order}.{amount}")
                self.next_order += 1
            steps.append("|".join(ops))
        if rng.random() < 0.3:
            steps[0] = f"lookup.{self.next_order}.0|" + steps[0]
            self.next_order += 1
        return "plan:" + ";".join(steps)


# -- actors -------------------------------------------------------------------------------

Op = tuple[str, Callable[[], Any]]


class Actor:
    kind = ""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: W.Proc | None = None

    def weight(self, w: W.World) -> int:
        return 1

    def choose(self, w: W.World) -> Op | None:
        raise NotImplementedError


def drive_like_a_worker(w: W.World, run_id: str) -> str:
    """What the Celery task ``drive_run`` does with one message (its retry: a requeue)."""
    from durable_agents.conf import get_settings

    try:
        commands.resume(run_id, store=w.store)
        return "finished"
    except Pause:
        return "paused"
    except (RunBusy, LeaseLost):
        return "busy"
    except DriveStopped:
        return "stopped"
    except DurableAgentsError as exc:
        if not exc.retryable:
            return f"failed ({exc.code})"
        run = commands.get_run(run_id, store=w.store)
        if run.attempts >= get_settings().retry.max_attempts:
            return f"failed for good ({exc.code})"
        w.dispatch(run_id)
        return f"retry ({exc.code})"


class Client(Actor):
    kind = "client"

    def __init__(self, name: str, plans: Plans, count: int) -> None:
        super().__init__(name)
        self.plans = plans
        self.left = count
        self.n = 0

    def weight(self, w: W.World) -> int:
        return 4 if self.left else 0

    def choose(self, w: W.World) -> Op | None:
        self.left -= 1
        self.n += 1
        run_id, plan = f"r{self.n}", self.plans.make()
        return f"start {run_id} {plan}", lambda: get_agent(AGENT).start(
            plan, run_id=run_id, store=w.store
        )


class Driver(Actor):
    kind = "driver"

    def weight(self, w: W.World) -> int:
        return 4 if w.queue else 0

    def choose(self, w: W.World) -> Op | None:
        if not w.queue:
            return None
        run_id = w.queue.pop(w.rng.randrange(len(w.queue)))

        def op() -> str:
            assert self.proc is not None
            self.proc.run_id = run_id
            return drive_like_a_worker(w, run_id)

        return f"drive {run_id}", op


class Recovery(Actor):
    """Celery beat's recovery pass, every ``RECOVERY_INTERVAL`` (15 s) at most."""

    kind = "recovery"
    interval = 15.0

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.next_pass = 0.0

    def weight(self, w: W.World) -> int:
        return 2 if w.now >= self.next_pass else 0

    def choose(self, w: W.World) -> Op | None:
        from durable_agents.recovery import recover

        self.next_pass = w.now + self.interval
        return "recovery pass", recover


class Deployer(Actor):
    kind = "deployer"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def weight(self, w: W.World) -> int:
        if not self.left:
            return 0
        # Deploys land more often right after a crash: between a crash and its resume is
        # where a changed schema meets a call in flight.
        return 4 if w.crashes and w.step - w.last_crash < 20 else 1

    def choose(self, w: W.World) -> Op | None:
        self.left -= 1
        new = w.deploy.changed(w)

        def op() -> str:
            w.deploy = new
            new.activate()
            return new.describe()

        return f"deploy ({new.describe()})", op


class Webhook(Actor):
    """A webhook view: each delivery calls ``send_once``; a chat user calls ``send``."""

    kind = "webhook"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def weight(self, w: W.World) -> int:
        return 2 if self.left else 0

    def choose(self, w: W.World) -> Op | None:
        self.left -= 1
        if w.rng.random() < 0.2:
            answered = sum(
                1
                for r in Journal(w.raw).history(f"{SESSION}>session")
                if r.name.startswith("answer:")
            )
            text = w.chat[min(answered, len(w.chat) - 1)]

            def send() -> Any:
                return get_agent(AGENT).session(SESSION, store=w.store).send(text).answer

            return f"send {text}", send
        key = w.rng.choice(sorted(w.deliveries))
        text = w.deliveries[key]
        wait = w.rng.random() < 0.5

        def deliver() -> str:
            session = get_agent(AGENT).session(SESSION, store=w.store)
            try:
                return session.send_once(key, text, wait=wait).status
            except RunBusy:
                w.violate(
                    "webhooks_never_busy",
                    f"send_once({key!r}, wait={wait}) raised RunBusy to the webhook: another "
                    "delivery of the same key is driving its turn",
                    hole="send_once",
                )
                return "RunBusy"

        return f"deliver {key} wait={wait}", deliver


class Stepper(Actor):
    """User code using the public ``Journal.step`` for an effect of its own."""

    kind = "stepper"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def weight(self, w: W.World) -> int:
        return 1 if self.left else 0

    def choose(self, w: W.World) -> Op | None:
        self.left -= 1
        run_id = f"steps-{w.rng.randint(1, 2)}"

        def ship() -> dict[str, Any]:
            w.point("step ship start")
            entry = w.record(
                "@step", run_id, "ship", {}, "", {"shipped": w.next_receipt()}, effect=True
            )
            w.point("step ship done")
            return entry.value

        return f"step {run_id} ship", lambda: Journal(w.store).step(run_id, "ship", ship)


class Person(Actor):
    """Staff: decide approvals, resolve halts from the ledger, cancel, fork with patches."""

    kind = "person"

    def __init__(self, name: str, forks: int, cancels: int) -> None:
        super().__init__(name)
        self.forks_left = forks
        self.cancels_left = cancels
        self.resumes_left = 1

    def weight(self, w: W.World) -> int:
        if w.raw.list_approval_requests() or w.raw.list_halts():
            return 3
        return 1 if self.forks_left or self.cancels_left or self.resumes_left else 0

    def choose(self, w: W.World) -> Op | None:
        raw = w.raw
        options: list[tuple[int, str]] = []
        requests = raw.list_approval_requests()
        halts = raw.list_halts()
        unfinished = [r.run_id for r in raw.list_unfinished() if is_agent_run(r.run_id)]
        started = [r for r in w.runs if is_agent_run(r) and raw.get(r, "run:start") is not None]
        if requests:
            options.append((4, "decide"))
        if halts:
            options.append((4, "resolve"))
        if unfinished and self.cancels_left:
            options.append((1, "cancel"))
        waiting = [
            r.run_id
            for r in raw.list_unfinished(statuses=(HALTED, AWAITING_APPROVAL))
            if is_agent_run(r.run_id)
        ]
        if waiting and self.resumes_left:
            options.append((1, "resume"))
        if started and self.forks_left:
            options.append((2, "fork"))
        if not options:
            return None
        what = w.pick(options)
        if what == "decide":
            req = requests[w.rng.randrange(len(requests))]
            return self._decide(w, req.run_id, req.call_id, w.rng.random() < 0.7)
        if what == "resolve":
            halt = halts[w.rng.randrange(len(halts))]
            return self._resolve(w, halt.run_id, halt.op_id)
        if what == "resume":
            # The admin's "resume" button, pressed on a run that waits on a person.
            self.resumes_left -= 1
            run_id = waiting[w.rng.randrange(len(waiting))]
            return f"resume {run_id}", lambda: da.resume(run_id, store=w.store).answer
        if what == "cancel":
            self.cancels_left -= 1
            run_id = unfinished[w.rng.randrange(len(unfinished))]
            return f"cancel {run_id}", lambda: da.cancel(
                run_id, by=self.name, reason="sim", store=w.store
            )
        self.forks_left -= 1
        return self._fork(w, started[w.rng.randrange(len(started))])

    def _decide(self, w: W.World, run_id: str, call_id: str, approve: bool) -> Op:
        def op() -> str:
            request = w.store.get_approval_request(run_id, call_id)
            seen = request.arguments if request is not None else None
            outcome = da.approve(run_id, call_id, approve, by=self.name, store=w.store)
            if outcome.status == "approved":
                w.approved.setdefault((run_id, call_id), []).append(seen)
            elif outcome.status == "denied":
                w.denied.add((run_id, call_id))
            return outcome.status

        verb = "approve" if approve else "deny"
        return f"{verb} {run_id} {call_id}", op

    def _resolve(self, w: W.World, run_id: str, call_id: str) -> Op:
        from .invariants import effects_seen_by

        def op() -> str:
            w.point("person checks the ledger")
            checked = w.now
            seen = effects_seen_by(w, run_id, call_id)
            if seen:
                result: Any = seen[0].value
                is_error = False
            else:
                result, is_error = dict(NOT_HAPPENED), True
            w.resolution_attempts.append(
                {"run": run_id, "call": call_id, "result": result, "is_error": is_error}
            )
            da.resolve_halt(
                run_id,
                call_id,
                result,
                is_error=is_error,
                evidence={"ledger": [e.seq for e in seen]},
                by=self.name,
                store=w.store,
            )
            rows = [h for h in w.raw.list_halts(run_id=run_id, status=None) if h.op_id == call_id]
            if rows and rows[0].status == "open" and (run_id, call_id) not in w.resolutions:
                w.violate(
                    "halts_stay_resolved",
                    f"halt {run_id}/{call_id}: resolve_halt returned the standing outcome, yet "
                    "the halt stays open (a resolution stopped between the journal and the "
                    "halt row, and nothing closes it now)",
                    hole="new",
                )
                return "standing; the halt stays open"
            w.resolutions.setdefault(
                (run_id, call_id),
                {
                    "result": result,
                    "is_error": is_error,
                    "t": checked,
                    "by": self.name,
                },
            )
            return "happened" if seen else "did not happen"

        # One request: the person checks the ledger and submits at once (a process of
        # theirs may still crash, but nobody else moves in between).
        op.exclusive = True
        return f"resolve {run_id} {call_id}", op

    def _fork(
        self, w: W.World, run_id: str, step: int | None = None, patch: da.Patch | None = None
    ) -> Op:
        if step is not None:
            return self._forking(w, run_id, step, patch or da.Patch(), True)
        rng = w.rng
        records = Journal(w.raw).history(run_id)
        turns = [r for r in records if r.name.startswith("model:")]
        step = rng.randint(0, len(turns))
        calls = [
            c["id"]
            for r in turns
            if int(r.name[6:]) <= step
            for c in (r.get("message") or {}).get("tool_calls") or ()
        ]
        kind = rng.choice(["none", "result", "error", "plan", "stop", "instructions"])
        patch = da.Patch()
        if kind in ("result", "error") and calls:
            call = calls[rng.randrange(len(calls))]
            value = {"patched": True} if kind == "result" else {"error": "patched failure"}
            patch = da.Patch(
                tool_results={call: value}, tool_errors=[call] if kind == "error" else []
            )
        elif kind == "plan":
            patch = da.Patch(append_user=w.plans.make())
        elif kind == "stop":
            patch = da.Patch(append_user="stop")
        elif kind == "instructions":
            patch = da.Patch(instructions="Patched instructions.")
        return self._forking(w, run_id, step, patch, rng.random() < 0.8, kind)

    def _forking(
        self, w: W.World, run_id: str, step: int, patch: da.Patch, go: bool, kind: str = "given"
    ) -> Op:
        def op() -> str:
            assert self.proc is not None
            self.proc.capture = {}
            fork_id = da.fork(run_id, step, patch, by=self.name, store=w.store)
            snapshot = self.proc.capture.get(run_id, [])
            self.proc.capture = None
            w.forks.append(
                {
                    "id": fork_id,
                    "source": run_id,
                    "step": step,
                    "patch": patch.to_json(),
                    "snapshot": snapshot,
                    "by": self.name,
                }
            )
            if go:
                w.dispatch(fork_id)
            return fork_id

        return f"fork {run_id} at step {step} patch={kind}", op


# -- one seed -----------------------------------------------------------------------------


def build(w: W.World) -> None:
    """The cast of one seed: which actors take part, drawn from the seed."""
    cfg = w.config
    rng = w.rng
    w.plans = Plans(w)
    w.deploy = Deploy()
    w.deploy.activate()
    w.deliveries = {f"d{i}": w.plans.make() for i in range(1, 3)}
    w.chat = [w.plans.make() for _ in range(2)]

    def on(kind: str, p: float = 0.75) -> bool:
        # Every draw happens whatever the config, so narrowing it keeps the other choices.
        return rng.random() < p and kind in cfg.actors

    actors: list[Actor] = []
    if on("client", 1.0):
        actors.append(Client("client", w.plans, rng.randint(1, 3)))
    if "driver" in cfg.actors:
        actors += [Driver(f"driver{i}") for i in range(1, cfg.drivers + 1)]
    if on("recovery", 0.9):
        actors.append(Recovery("recovery"))
    if on("person"):
        actors += [
            Person(n, rng.randint(0, 2), rng.choice([0, 0, 1]))
            for n in ("ann", "bob")[: cfg.persons]
        ]
    if on("deployer", 0.8):
        actors.append(Deployer("deployer", rng.randint(1, 4)))
    if on("webhook", 0.5):
        actors += [Webhook("webhook1", rng.randint(1, 4)), Webhook("webhook2", rng.randint(0, 3))]
    if on("stepper", 0.15):
        actors += [Stepper("stepper1", 2), Stepper("stepper2", 1)]
    w.actors = actors
    w.log(
        "-",
        f"cast: {', '.join(a.name for a in actors)}; crash x{w.crash_rate} "
        f"stall x{w.stall_rate}{'; split writes' if w.split_writes else ''}",
    )


def main_phase(w: W.World, check: Callable[[W.World], None]) -> None:
    """Actors interleaved by the seed, with crashes and stalls, until nothing moves any
    more (twice, with the clock moved past every lease in between) or the step budget is
    spent."""
    quiet_spells = 0
    for step in range(w.config.steps):
        w.step = step
        # A process that just woke from a stall, or a person's resolution, moves first and
        # at once: no time passes and nobody else moves until it reaches a store call.
        first = [a.proc for a in w.actors if a.proc and a.proc.urgent and a.proc.ready(w.now)]
        if first:
            w.move(first[0], faults=first[0].exclusive)
            check(w)
            continue
        stalled = any(a.proc is not None and a.proc.stalled_until for a in w.actors)
        # While a process is frozen, time runs slow: the others get many steps to take its
        # run over (and a person to act on it) before it wakes.
        w.advance(w.rng.choice(W.STALL_STEP_SECONDS if stalled else W.STEP_SECONDS))
        options: list[tuple[int, Actor]] = []
        for actor in w.actors:
            if actor.proc is not None:
                if actor.proc.ready(w.now):
                    options.append((4, actor))
            else:
                weight = actor.weight(w)
                if weight:
                    options.append((weight, actor))
        idle = not any(a.proc for a in w.actors) and all(a.kind == "recovery" for _, a in options)
        if idle or step - w.progress > 60:
            if quiet_spells == 2:
                return
            # Nothing new happens: let crashed processes' leases lapse (and halts age), so
            # recovery and people find what they left behind; twice at most.
            quiet_spells += 1
            w.progress = step
            w.log("-", "nothing new happens: the clock moves past every lease")
            w.advance_by(2 * w.config.ttl + 1)
            continue
        if not options:  # all stalled or asleep
            procs = [a.proc for a in w.actors if a.proc is not None]
            wake = min(max(p.stalled_until, p.sleep_until) for p in procs)
            w.advance(min(w.config.ttl / 3, max(0.1, wake - w.now)))
            continue
        actor = w.pick(options)
        if actor.proc is not None:
            w.move(actor.proc, faults=True)
        else:
            chosen = actor.choose(w)
            if chosen is not None:
                proc = w.start(actor, *chosen)
                if getattr(chosen[1], "exclusive", False) and not proc.glet.dead:
                    proc.exclusive = proc.urgent = True
        check(w)


def drain_phase(w: W.World) -> None:
    """No new operations and no more faults: every process still alive finishes (stalled
    ones continue when their stall ends)."""
    w.phase = "drain"
    for guard in range(20000):
        w.step = guard
        procs = [a.proc for a in w.actors if a.proc is not None]
        if not procs:
            return
        ready = [p for p in procs if p.ready(w.now)]
        if not ready:
            wake = min(max(p.stalled_until, p.sleep_until) for p in procs)
            w.advance(min(w.config.ttl / 3, max(0.1, wake - w.now)))
            continue
        urgent = [p for p in ready if p.urgent]
        w.move(urgent[0] if urgent else ready[w.rng.randrange(len(ready))], faults=False)
    w.violate("terminates", "processes were still running after 20000 drain steps", hole="new")


def quiet_phase(w: W.World) -> None:
    """Crashed drivers' leases expire; then recovery passes, each followed by workers
    draining the queue, until a pass hands nothing over (or it is clearly never going to)."""
    w.phase = "quiet"
    w.advance_by(2 * w.config.ttl + 1)
    worker = Driver("worker")
    beat = Recovery("beat")
    w.actors += [worker, beat]
    from durable_agents.recovery import recover

    def drain() -> None:
        # Copies of one message are driven once: the rest would find it driven already.
        pending, w.queue[:] = list(dict.fromkeys(w.queue)), []
        for run_id in pending:
            proc = w.start(
                worker, f"drive {run_id}", lambda run_id=run_id: drive_like_a_worker(w, run_id)
            )
            w.last_drive[run_id] = w.run_to_end(proc).outcome

    drain()
    session_liveness(w, worker)
    for round_ in range(10):
        w.step = round_
        proc = w.run_to_end(w.start(beat, "recovery pass", recover))
        sent = list(proc.result or [])
        w.recovery_rounds.append(sent)
        if not sent:
            return
        drain()
        w.advance_by(30.0)  # past any back-off recovery keeps for a failing run


def session_liveness(w: W.World, worker: Actor) -> None:
    """A session whose open turn was cancelled or failed for good still takes a message."""
    records = Journal(w.raw).history(f"{SESSION}>session")
    answered = {r.get("run_id") for r in records if r.name.startswith("answer:")}
    sends = [r for r in records if r.name.startswith("turn:")]
    open_turn = next((r for r in reversed(sends) if r.get("run_id") not in answered), None)
    if open_turn is None:
        return
    run = w.raw.get_run(str(open_turn.get("run_id")))
    if run is None or run.status not in (CANCELLED, FAILED):
        return
    if run.status == FAILED and (run.last_error or {}).get("retryable"):
        return
    text = "plan:lookup.99.0"

    def send() -> Any:
        try:
            return get_agent(AGENT).session(SESSION, store=w.store).send(text).answer
        except ConfigError as exc:
            if exc.code == "session.turn_open":
                w.violate(
                    "sessions_stay_open",
                    f"session {SESSION!r}: turn {run.run_id!r} is {run.status} for good, and "
                    f"a new message is refused ({exc.code})",
                    hole="9",
                )
            raise

    w.run_to_end(w.start(worker, f"send {text}", send))


def simulate(config: W.Config) -> W.World:
    """Run one seed: build, interleave, drain, settle; then check every invariant."""
    from .invariants import check_all, check_as_we_go

    w = W.World(config)
    with W.patched(w):
        try:
            build(w)
            w.phase = "main"
            main_phase(w, check_as_we_go)
            drain_phase(w)
            quiet_phase(w)
            check_all(w)
        finally:
            w.teardown()
    return w
