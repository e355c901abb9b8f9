"""The actors of the simulated world: who calls the engine, and with what.

Each actor, when the scheduler picks it while it is idle, chooses one operation (reading
the store directly, as a person reads a page) and runs it as a process of its own, through
the engine's public commands.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import durable_agents as da
from durable_agents.engine import runtime, tree
from durable_agents.engine.agent import get_agent
from durable_agents.engine.approvals import decision_name, incarnation_of
from durable_agents.engine.commands import runs as commands
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.errors import (
    ApprovalBadSignature,
    ApprovalExpired,
    ApproverNotEligible,
    DriveStopped,
    DurableAgentsError,
    InterruptAlreadyAnswered,
    InterruptAnswerInvalid,
    LeaseLost,
    Pause,
    RunBusy,
    RunIdSpent,
    RunImported,
    StorageError,
)
from durable_agents.engine.journal import Journal, header
from durable_agents.engine.names import RUN_COMPLETE, RUN_START, start_body
from durable_agents.engine.ports import (
    AWAITING_APPROVAL,
    HALTED,
    IMPORTED_INERT,
    IMPORTED_LIVE,
    QUEUED,
    TERMINAL_STATUSES,
    THROTTLED,
    RunInfo,
)
from durable_agents.engine.records import Record, encode
from durable_agents.engine.waits import latest_question, open_waits

from . import world as W
from .agent import (
    AGENT,
    ANSWERS,
    ERRAND,
    NOT_HAPPENED,
    SESSION,
    Plans,
    is_agent_run,
    parse_plan,
    wait_name,
)
from .invariants import _in_flight, effects_seen_by, sweep_reaches_down

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
        if run.attempts >= runtime.retry_policy().max_attempts:
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
    """Celery beat's recovery pass, every ``RECOVERY_INTERVAL`` (15 s) at most, and its timer
    sweep."""

    kind = "recovery"
    interval = 15.0

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.next_pass = 0.0

    def weight(self, w: W.World) -> int:
        return 2 if w.now >= self.next_pass else 0

    def choose(self, w: W.World) -> Op | None:
        self.next_pass = w.now + self.interval
        return "recovery pass", lambda: recover() + _wake_timers(w)


def _wake_timers(w: W.World) -> list[str]:
    """Beat's ``wake_timers`` sweep (its own schedule in production; here it rides on the
    recovery pass, after it, so adding it did not move every seed's schedule)."""
    from durable_agents.engine.commands.timers import wake_timers

    # (Throttled runs came with limits: a seed without them has none, and sweeps as before.)
    if not any(w.raw.list_unfinished(statuses=["sleeping", "awaiting_input", "throttled"])):
        return []
    return sweep_reaches_down(w, lambda: wake_timers(store=w.store))


class Deployer(Actor):
    kind = "deployer"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left
        self.aimed_left = 2  # targeted deploys (issue 32), beside the drawn ones
        self.pinned = False

    def weight(self, w: W.World) -> int:
        if self.aimed_left and _intercepted_pending(w):
            return 10  # lands before the people decide
        if _remote_payment_pending(w):
            return 10  # the server's next version, before the people decide (issue 45)
        if not self.left:
            return 0
        # Deploys land more often right after a crash: between a crash and its resume is
        # where a changed schema meets a call in flight.
        return 4 if w.crashes and w.step - w.last_crash < 20 else 1

    def choose(self, w: W.World) -> Op | None:
        if _remote_payment_pending(w):
            # Issue 45: the site deploys with the MCP server's next version, which describes
            # ``crm__pay`` anew (the same arguments): the payment awaiting its decision was
            # asked about a definition the workers no longer list.
            service = w.remote
            assert service is not None
            service.changes_left -= 1
            service.aimed.update(_remote_payments_pending(w))
            if service.version_rng.random() < 0.9:
                same = w.deploy
                w.count("MCP server changes aimed at a payment awaiting its decision")

                def server_op() -> str:
                    service.version += 1
                    w.deploys.append((w.now, same))
                    same.activate()
                    return f"the MCP server's version {service.version}"

                return "deploy (the MCP server's next version)", server_op
        if self.aimed_left and _intercepted_pending(w) and w.aim_rng.random() < 0.8:
            self.aimed_left -= 1
            # Targeted (issue 32): a refund whose signed decision was captured is pending;
            # change its arguments (a defaulted ``reason``), so it is asked again.
            new = dataclasses.replace(w.deploy, reason=not w.deploy.reason)
            w.count("deploys aimed at a captured request")
            self.pinned = True
        else:
            self.left -= 1
            new = w.deploy.changed(w)
            if self.pinned:  # later deploys keep the change the captured request met
                new = dataclasses.replace(new, reason=w.deploy.reason)

        def op() -> str:
            w.deploy = new
            w.deploys.append((w.now, new))
            new.activate()
            return new.describe()

        return f"deploy ({new.describe()})", op


def _remote_payment_pending(w: W.World) -> bool:
    """Whether a gated payment of the MCP server waits for its decision, with a change of
    the server left to aim at it (only in the casts whose ``crm__pay`` is gated)."""
    service = w.remote
    if service is None or not service.gated or not service.changes_left:
        return False
    return bool(_remote_payments_pending(w) - service.aimed)


def _remote_payments_pending(w: W.World) -> set[tuple[str, str]]:
    """The gated payments of the MCP server awaiting their decision: (run, call)."""
    from .remote import PAY

    return {(r.run_id, r.call_id) for r in w.raw.list_approval_requests() if r.tool_name == PAY}


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
                for r in Journal(w.raw).records(f"{SESSION}>session")
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
        self.aimed_resumes_left = 1
        # Issue 43: one fork at a call whose outcome is unknown, beside the drawn ones.
        self.unknown_forks_left = 1
        # And one rollback of a run whose edited refund ran (a saga deploy undoing refunds).
        self.undo_edits_left = 1

    def weight(self, w: W.World) -> int:
        if w.raw.list_approval_requests() or w.raw.list_halts():
            return 3
        if self.forks_left or self.cancels_left or self.resumes_left:
            return 1
        if not (self.undo_edits_left and w.deploy.undo_refunds and w.edits):
            return 0
        unfinished = [r.run_id for r in w.raw.list_unfinished() if is_agent_run(r.run_id)]
        return 1 if _edited_and_run(w, unfinished) else 0

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
        stale = _asked_under_other_code(w, waiting) if w.intercepts else []
        if stale and self.aimed_resumes_left:
            options.append((12, "resume-aimed"))
        if started and self.forks_left:
            options.append((2, "fork"))
        # Issue 43: a fork at a call whose outcome the tool said it could not tell (an
        # ``@unknown`` record, no result yet), once, beside the drawn ones.
        # (An unknown outcome halts its run: only halted runs are read.)
        halted = {h.run_id for h in halts}
        # (In the answerer's casts only, as every later aim: the known-hole seeds keep their
        # schedules.)
        aims = "answerer" in w.config.actors
        unknown = (
            _unknown_outcomes(w, [r for r in started if r in halted])
            if aims and self.unknown_forks_left and halted
            else []
        )
        if unknown:
            options.append((6, "fork-unknown"))
        # Issue 43: a saga run whose refund ran as an approver edited it, rolled back.
        edited = _edited_and_run(w, unfinished) if self.undo_edits_left else []
        if edited:
            options.append((6, "compensate-edited"))
        if not options:
            return None
        what = w.pick(options)
        if what == "decide":
            req = requests[w.rng.randrange(len(requests))]
            approve, edit = w.rng.random() < 0.7, w.rng.random() < (0.1 if w.intercepts else 0.3)
            if w.deploy.undo_refunds and req.tool_name == "refund" and w.rng.random() < 0.5:
                edit = True  # issue 43: edits of refunds that are undone as they ran
            return self._decide(w, req.run_id, req.call_id, approve, edit=approve and edit)
        if what == "resolve":
            halt = halts[w.rng.randrange(len(halts))]
            return self._resolve(w, halt.run_id, halt.op_id)
        if what == "resume":
            # The admin's "resume" button, pressed on a run that waits on a person: in the
            # targeted casts, on one whose request a deploy changed since it was asked (the
            # drive asks it again about the new arguments: what a captured signature is then
            # aimed at).
            self.resumes_left -= 1
            run_id = waiting[w.rng.randrange(len(waiting))]
            return f"resume {run_id}", lambda: da.resume(run_id, store=w.store).answer
        if what == "resume-aimed":
            self.aimed_resumes_left -= 1
            run_id = stale[w.aim_rng.randrange(len(stale))]
            w.count("resumes aimed at a request a deploy changed")
            return f"resume {run_id}", lambda: da.resume(run_id, store=w.store).answer
        if what == "cancel":
            self.cancels_left -= 1
            run_id = unfinished[w.rng.randrange(len(unfinished))]
            # Under a saga deploy every other cancel is "cancel and compensate" (not drawn:
            # the seeds without sagas keep their schedules).
            compensate = bool(w.deploy.saga) and self.cancels_left % 2 == 0
            return f"cancel{' and compensate' if compensate else ''} {run_id}", lambda: cancel_tree(
                w, run_id, self.name, "sim", compensate
            )
        if what == "compensate-edited":
            self.undo_edits_left -= 1
            run_id = edited[w.rng.randrange(len(edited))]
            w.count("runs rolled back after an edited refund ran")

            def rollback() -> Any:
                try:
                    return cancel_tree(w, run_id, self.name, "sim", True)
                except RunBusy:
                    self.undo_edits_left += 1  # taken meanwhile: another try later
                    raise

            return f"cancel and compensate {run_id} (an edited refund ran)", rollback
        if what == "fork-unknown":
            self.unknown_forks_left -= 1
            run_id, step = unknown[w.rng.randrange(len(unknown))]
            w.count("forks aimed at a call whose outcome is unknown")
            return self._fork(w, run_id, step=step, patch=da.Patch())
        self.forks_left -= 1
        if w.aims_forks and w.aim_rng.random() < 0.6:
            in_flight = _calls_in_flight(w, started)
            if in_flight:
                run_id, step = in_flight[w.aim_rng.randrange(len(in_flight))]
                w.count("forks aimed at a call in flight")
                return self._fork(w, run_id, step=step, patch=da.Patch())
        return self._fork(w, started[w.rng.randrange(len(started))])

    def _decide(
        self, w: W.World, run_id: str, call_id: str, approve: bool, *, edit: bool = False
    ) -> Op:
        def op() -> str:
            # The person reads the request's page, then submits: the decision is for the
            # arguments they saw (the engine refuses it if the request changed meanwhile).
            # Some approve with edits (a smaller amount); a denial carries a message the
            # model reads.
            request = w.store.get_approval_request(run_id, call_id)
            if request is None:
                return "gone"
            seen = request.arguments
            edited = None
            if edit and isinstance(seen, dict) and isinstance(seen.get("amount"), int):
                edited = {**seen, "amount": max(1, seen["amount"] // 2)}
                if w.rules_rng is not None and (
                    seen["amount"] <= 30 if self.name == "edith" else w.rules_rng.random() < 0.5
                ):
                    # A rules cast: across a threshold upwards too (issue 42); the editor
                    # into the quorum's range under either version of the rules.
                    more = seen["amount"] + 30 if self.name == "edith" else seen["amount"] * 2
                    edited = {**seen, "amount": more}
                    w.count("rules: edits raising the amount")
            note = "" if approve else W.deny_message(call_id)
            signed, signature = None, None
            # Some decisions are signed with the person's key (an unedited one: the bytes
            # are the arguments they saw), over the run's start they read: what the
            # replayer captures. Drawn from the signing stream (``World.sign_rng``).
            if (
                w.keys
                and edited is None
                and w.sign_rng.random() < max(0.8 if w.intercepts else 0.3, w.sign_odds)
            ):
                incarnation = incarnation_of(w.store, run_id)
                signed = W.Signed(
                    run_id, call_id, request.tool_name, seen, incarnation, self.name, approve, note
                )
                signature = w.sign(signed)
                if w.intercepts and w.aim_rng.random() < 0.35:
                    # Captured in transit, never delivered: the replayer holds a signature
                    # its maker's decision never used.
                    w.count("signed decisions intercepted")
                    w.intercepted.append(signed)
                    return "intercepted"
            if w.deploy.rules:  # the rules an edit is judged under (``rules_hold``)
                w.rule_versions.setdefault((run_id, call_id), set()).add(w.deploy.rules)
            if approve:
                w.submitted.append((run_id, call_id, self.name, seen if edited is None else edited))
                if edited is not None:
                    w.edits.add((run_id, call_id, self.name))
            try:
                outcome = da.approve(
                    run_id,
                    call_id,
                    approve,
                    by=self.name,
                    note=note,
                    arguments=seen,
                    edit=edited,
                    signature=signature,
                    store=w.store,
                )
            except ApprovalExpired:
                w.count("rules: decisions refused as expired")  # racing the expiry, or late
                raise
            except ApprovalBadSignature:
                now = w.raw.get_approval_request(run_id, call_id)
                if (
                    signed is not None
                    and now is not None
                    and encode(now.arguments) == encode(seen)
                    and incarnation_of(w.raw, run_id) == signed.incarnation
                ):
                    w.violate(
                        "signatures_bind",
                        f"run {run_id}: {self.name}'s own signed decision on {call_id} was "
                        "refused, though the request and the run's start are what they signed",
                        hole="new",
                    )
                raise
            if signature is not None:
                w.count("signed decisions taken")
                if signed is not None:
                    w.signed_taken.append(signed)
            if outcome.status == "approved":
                # What the person whose approval stands approved running: their decision
                # row's edit (it may be someone who crashed after deciding), else as asked.
                again = request.previous_arguments is not None
                name = decision_name(call_id, seen, again=again)
                standing = Journal(w.raw).get(run_id, name)
                by = str(standing.get("by")) if standing is not None else self.name
                rows = [d for d in w.raw.list_decisions(run_id, call_id) if d.approver == by]
                ran_as = rows[0].arguments if rows and rows[0].arguments is not None else seen
                w.approved.setdefault((run_id, call_id), []).append(ran_as)
            elif outcome.status == "denied":
                w.denied.add((run_id, call_id))
            mine = [d for d in w.raw.list_decisions(run_id, call_id) if d.approver == self.name]
            if not approve and mine and not mine[0].approved:
                # Taken: not a repeat of a standing denial by someone who had approved.
                w.denials.add((run_id, call_id))
            if request.policy.get("kind") == "quorum":
                w.count("quorums reached" if outcome.status == "approved" else "quorum votes")
            return outcome.status

        verb = ("edit-approve" if edit else "approve") if approve else "deny"
        return f"{verb} {run_id} {call_id}", op

    def _resolve(self, w: W.World, run_id: str, call_id: str) -> Op:
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
        records = Journal(w.raw).records(run_id)
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


def _intercepted_pending(w: W.World) -> bool:
    """In the targeted casts, a refund is pending, or was approved with a signature and has
    not run yet: a deploy that changes its arguments makes the next drive ask it again
    (what a signature captured before is then aimed at, and what its approvers sign anew)."""
    if not w.intercepts:
        return False
    reason = bool(w.deploy.reason)
    if any(
        r.tool_name == "refund"
        and r.previous_arguments is None
        and isinstance(r.arguments, dict)
        and ("reason" in r.arguments) == reason  # not changed by a deploy yet
        for r in w.raw.list_approval_requests()
    ):
        return True
    return any(
        s.approved
        and isinstance(s.arguments, dict)
        and ("reason" in s.arguments) == reason
        and w.raw.get(s.run_id, f"tool:{s.call_id}") is None
        for s in w.signed_taken
    )


def _asked_under_other_code(w: W.World, runs: list[str]) -> list[str]:
    """Runs with a refund pending whose arguments the deployed code would change (a
    defaulted ``reason`` gained or lost)."""
    reason = bool(w.deploy.reason)
    return [
        r.run_id
        for r in w.raw.list_approval_requests()
        if r.run_id in runs
        and r.tool_name == "refund"
        and isinstance(r.arguments, dict)
        and ("reason" in r.arguments) != reason
    ]


def _calls_in_flight(w: W.World, runs: list[str]) -> list[tuple[str, int]]:
    """(run, the step that asked for it) of each call claimed and without a result: the
    fork that keeps that step must not run it again (hole 2)."""
    found = []
    for run_id in runs:
        records = Journal(w.raw).records(run_id)
        for turn in (r for r in records if r.name.startswith("model:")):
            for call in (turn.get("message") or {}).get("tool_calls") or ():
                if _in_flight(records, str(call["id"])):
                    found.append((run_id, int(turn.name[6:])))
    return found


def _edited_and_run(w: W.World, runs: list[str]) -> list[str]:
    """Unfinished runs of a saga deploy that undoes refunds, whose refund ran as an approver
    edited it (its decision holds ``edited``, its result is no error)."""
    if not (w.deploy.saga and w.deploy.undo_refunds):
        return []
    found = []
    for run_id in runs:
        lease = w.raw.get_lease(run_id)
        if lease is not None and lease.live:
            continue  # a cancel is refused while a driver holds the run (``RunBusy``)
        names = {r.name: r for r in Journal(w.raw).records(run_id)}
        if "saga:abort" in names or "run:cancelled" in names:
            continue
        for name, rec in names.items():
            if not name.startswith("approval:") or not rec.get("edited"):
                continue
            result = names.get(f"tool:{name.removeprefix('approval:').split(':')[0]}")
            if result is not None and not result.get("is_error"):
                found.append(run_id)
                break
    return found


def _unknown_outcomes(w: W.World, runs: list[str]) -> list[tuple[str, int]]:
    """(run, the step that asked for it) of each call whose tool said it could not tell
    whether its effect happened (``@unknown/attempt:<call>:<k>``) and that has no result: a
    fork keeping that step halts on it, saying why (``halts_say_why``)."""
    found = []
    for run_id in runs:
        records = Journal(w.raw).records(run_id)
        names = {r.name for r in records}
        unknown = {
            n.removeprefix("@unknown/attempt:").rpartition(":")[0]
            for n in names
            if n.startswith("@unknown/attempt:")
        }
        for turn in (r for r in records if r.name.startswith("model:")):
            for call in (turn.get("message") or {}).get("tool_calls") or ():
                call_id = str(call["id"])
                if call_id in unknown and f"tool:{call_id}" not in names:
                    found.append((run_id, int(turn.name[6:])))
    return found


def _runs_below(w: W.World, run_id: str) -> list[str]:
    """Every run the calls of ``run_id`` started (its ``child:`` records, whose row names it
    as parent), and theirs, down the tree. (A fork of a sub-run is a run of its own, below
    nothing. A sub-run a fork's maker made for a fork cancelled before its own journal was
    copied is below no call: it stops itself when driven, and ``nothing_stranded`` holds it
    to that.)"""
    below: list[str] = []
    todo = [run_id]
    while todo:
        parent = todo.pop()
        for rec in Journal(w.raw).records(parent):
            if not rec.name.startswith("child:"):
                continue
            child = str(rec.get("run_id"))
            row = w.raw.get_run(child)
            # (An import at a sub-run's id is nobody's sub-run, whatever its row says.)
            if row is not None and row.inert:
                continue
            if row is not None and row.parent_run_id == parent and child not in below:
                below.append(child)
                todo.append(child)
    return below


def cancel_tree(w: W.World, run_id: str, by: str, reason: str, compensate: bool) -> Any:
    """``da.cancel``, then the promise a cancel makes when it returns: every unfinished
    run below that nobody held (nor took) during the cancel has recorded its stop, and
    none of its requests is pending (staff never see a call of a cancelled tree to
    approve). A run busy in a worker stops itself before its next step."""
    below = _runs_below(w, run_id)
    taken_before = len(w.leases_taken)
    held = {r for r in below if (lease := w.raw.get_lease(r)) is not None and lease.live}
    outcome = da.cancel(run_id, by=by, reason=reason, compensate=compensate, store=w.store)
    held |= set(w.leases_taken[taken_before:])
    held |= {r for r in below if (lease := w.raw.get_lease(r)) is not None and lease.live}
    for sub in below:
        row = w.raw.get_run(sub)
        if row is None or sub in held or row.finished or row.status == "failed":
            continue
        stopped = any(w.raw.get(sub, name) is not None for name in ("run:cancelled", "saga:abort"))
        pending = (
            [r.call_id for r in w.raw.list_approval_requests() if r.run_id == sub]
            if not compensate
            else []
        )
        if not stopped or pending:
            w.violate(
                "cancels_reach_down",
                f"cancel of {run_id} returned with sub-run {sub} ({row.status}) "
                + ("not stopped" if not stopped else f"still asking about {pending}"),
                hole="new",
            )
    return outcome


class TreeCanceller(Actor):
    """Staff cancelling a tree while a sub-run of it has not ended (issue 29): the root or
    the parent of a sub-run that awaits a decision or an answer, or that a worker drives
    right now; plainly, or under a saga deploy "cancel and compensate". The cancel may die
    anywhere (after its own record, before its sub-runs'); its choices come from a stream
    of its own (``World.stop_rng``)."""

    kind = "canceller"

    def __init__(self, name: str, left: int, aimed: int = 0) -> None:
        super().__init__(name)
        self.left = left
        # In the digest casts (issue 41), one cancel more, aimed at a tree whose sub-run
        # waits on its spent rate; its choices from a stream of its own.
        self.aimed = aimed
        self.left_alone: set[str] = set()  # trees whose aimed cancel died

    def _below(self, w: W.World) -> list[Any]:
        """Unfinished sub-runs whose parent nobody drives right now (so a cancel of it is
        taken): paused with it, or waiting while a worker drives the sub-run."""
        rows = [w.raw.get_run(r) for r in w.runs if "/" in r]
        out = []
        for row in rows:
            if row is None or not row.parent_run_id or row.finished:
                continue
            if {row.root_run_id, row.parent_run_id} & self.left_alone:
                continue  # cancelling it again would finish the dead cancel at once
            lease = w.raw.get_lease(row.parent_run_id)
            if lease is None or not lease.live:
                out.append(row)
        return out

    def weight(self, w: W.World) -> int:
        below = self._below(w) if self.left or self.aimed else []
        if self.aimed and any(r.status == THROTTLED for r in below):
            return 3  # while the sub-run waits on its rate
        return 1 if self.left and below else 0

    def choose(self, w: W.World) -> Op | None:
        below = self._below(w)
        throttled = [r for r in below if r.status == THROTTLED]
        if self.aimed and throttled:
            self.aimed -= 1
            return self._aimed(w, throttled[w.digest_rng.randrange(len(throttled))])
        if not below or not self.left:
            return None
        self.left -= 1
        row = below[w.stop_rng.randrange(len(below))]
        top = w.stop_rng.random() < 0.5 and row.root_run_id
        run_id = str(row.root_run_id if top else row.parent_run_id)
        lease = w.raw.get_lease(row.run_id)
        w.count(
            "trees cancelled with a sub-run busy"
            if lease is not None and lease.live
            else "trees cancelled with a sub-run paused"
        )
        compensate = bool(w.deploy.saga) and w.stop_rng.random() < 0.5
        return (
            f"cancel{' and compensate' if compensate else ''} tree {run_id}",
            lambda: cancel_tree(w, run_id, self.name, "tree", compensate),
        )

    def _aimed(self, w: W.World, row: Any) -> Op:
        """Cancel the tree of ``row``, a sub-run throttled on a spent rate; most such cancels
        die right after their own record (``after-cancel:<run>``), before reaching it: the
        next sweep must finish them, not the sub-run's retry a day later."""
        rng = w.digest_rng
        run_id = str(
            row.root_run_id if rng.random() < 0.5 and row.root_run_id else row.parent_run_id
        )
        compensate = bool(w.deploy.saga) and rng.random() < 0.5
        die = rng.random() < 0.7
        w.count("trees cancelled with a sub-run throttled")
        if die:
            self.left_alone |= {run_id, str(row.root_run_id or run_id)}

        def op() -> Any:
            if die and self.proc is not None:
                self.proc.die_at = f"after-cancel:{run_id}"
            return cancel_tree(w, run_id, self.name, "tree", compensate)

        # (One that dies runs to its death at once: nobody slips in before its record.)
        op.exclusive = die  # type: ignore[attr-defined]
        return f"cancel{' and compensate' if compensate else ''} tree {run_id}", op


class Outsider(Actor):
    """Someone outside the quorum's group who holds the permission to decide and tries to
    approve a quorum call anyway: every path must refuse them (``approval.not_eligible``)."""

    kind = "outsider"

    def __init__(self, name: str, tries: int) -> None:
        super().__init__(name)
        self.tries_left = tries

    def _requests(self, w: W.World) -> list[Any]:
        return [r for r in w.raw.list_approval_requests() if r.policy.get("kind") == "quorum"]

    def weight(self, w: W.World) -> int:
        return 2 if self.tries_left and self._requests(w) else 0

    def choose(self, w: W.World) -> Op | None:
        requests = self._requests(w)
        if not requests or not self.tries_left:
            return None
        self.tries_left -= 1
        req = requests[w.rng.randrange(len(requests))]
        run_id, call_id = req.run_id, req.call_id

        def op() -> str:
            request = w.store.get_approval_request(run_id, call_id)
            if request is None:
                return "gone"
            w.submitted.append((run_id, call_id, self.name, request.arguments))
            try:
                outcome = da.approve(
                    run_id,
                    call_id,
                    True,
                    by=self.name,
                    arguments=request.arguments,
                    store=w.store,
                )
            except ApproverNotEligible:
                w.count("outsiders refused")
                return "refused"
            w.violate(
                "quorums_need_people",
                f"run {run_id}: {self.name}, outside group {W.PAYOUTS!r}, approved quorum call "
                f"{call_id} and was not refused ({outcome.status})",
                hole="new",
            )
            return outcome.status

        return f"outsider-approve {run_id} {call_id}", op


class Replayer(Actor):
    """Someone who captured people's signed decisions (a log, a proxy) and submits them on
    other requests: a fork of the run, the same call asked again about other arguments,
    another call or run. The signature binds the run's start, the call, the tool and its
    arguments: every replay must be refused (``approval.bad_signature``), or refused before
    the signature is looked at (the request is gone)."""

    kind = "replayer"
    # Refusals that come before the signature is checked (a replay carries no edit).
    BEFORE_THE_SIGNATURE = frozenset({"approval.not_found"})

    def __init__(self, name: str, tries: int, aimed: int = 2) -> None:
        super().__init__(name)
        self.tries_left = tries
        self.aimed_left = aimed

    def weight(self, w: W.World) -> int:
        if self.aimed_left and self._aimed(w):
            return 4
        return 2 if self.tries_left and w.signatures and self._requests(w) else 0

    def _requests(self, w: W.World) -> list[Any]:
        return w.raw.list_approval_requests()

    def _aimed(self, w: W.World) -> list[tuple[W.Signed, Any]]:
        """The nastiest targets (issue 32): a signature aimed at the call it was made for,
        asked again about other arguments (a deploy changed them), or at that call in a
        fork of its run."""
        pairs = []
        for req in self._requests(w):
            row = w.raw.get_run(req.run_id)
            source = row.forked_from if row is not None else None
            for signed in w.signatures:
                if signed.call_id != req.call_id:
                    continue
                if signed.run_id == req.run_id:
                    if encode(signed.arguments) != encode(req.arguments):
                        pairs.append((signed, req))
                elif signed.run_id == source:
                    pairs.append((signed, req))
        # The nastiest first: the signature of the approval the call was asked again over
        # (its arguments are the request's ``previous_arguments``).
        over = [
            (s, r)
            for s, r in pairs
            if r.previous_arguments is not None
            and encode(s.arguments) == encode(r.previous_arguments)
        ]
        return over or pairs

    def choose(self, w: W.World) -> Op | None:
        aimed = self._aimed(w) if self.aimed_left else []
        requests = self._requests(w)
        if aimed:
            self.aimed_left -= 1
            signed, req = aimed[w.aim_rng.randrange(len(aimed))]
            w.count("replays aimed")
        else:
            if not requests or not w.signatures or not self.tries_left:
                return None
            self.tries_left -= 1
            signed = w.signatures[w.sign_rng.randrange(len(w.signatures))]
            req = requests[w.sign_rng.randrange(len(requests))]
        return replay(w, signed, req.run_id, req.call_id)


def replay(w: W.World, signed: W.Signed, run_id: str, call_id: str) -> Op:
    """Submit ``signed``'s captured signature on the request of ``call_id`` in ``run_id``:
    it must be refused (``approval.bad_signature``), or refused before the signature is
    looked at (the request is gone), unless the request asks exactly what was signed."""

    def op() -> str:
        proc = w.current
        request = w.store.get_approval_request(run_id, call_id)
        if request is None:
            return "gone"
        if proc is not None:
            proc.requests_read = []  # what the engine reads from here on
        here = (run_id, call_id, request.tool_name, encode(request.arguments))
        there = (signed.run_id, signed.call_id, signed.tool_name, encode(signed.arguments))
        if here == there and incarnation_of(w.raw, run_id) == signed.incarnation:
            return "its own request: the signer's decision, not a replay"
        try:
            outcome = da.approve(
                run_id,
                call_id,
                signed.approved,
                by=signed.by,
                note=signed.note,
                signature=w.signatures_made[signed],
                store=w.store,
            )
        except ApprovalBadSignature:
            w.count("replayed signatures refused")
            return "refused"
        except StorageError:
            # The store failed the request (maybe after it committed): the journal says
            # what was taken, and the invariants read it there.
            return "the store failed"
        except DurableAgentsError as exc:
            if exc.code in Replayer.BEFORE_THE_SIGNATURE:
                return f"refused ({exc.code})"
            result = f"!! {exc.code}"
        else:
            result = outcome.status
        read = proc.requests_read if proc is not None else []
        if incarnation_of(w.raw, run_id) == signed.incarnation and any(
            r is not None and (run_id, call_id, r.tool_name, encode(r.arguments)) == there
            for r in read
        ):
            # The request the engine read asked about exactly what was signed (a deploy,
            # then its rollback, while the replay was under way): the signer's own
            # decision after all.
            return f"{result}: its own request again"
        w.violate(
            "signatures_bind",
            f"run {run_id}: {signed.by}'s signature over call {signed.call_id} of run "
            f"{signed.run_id} ({there[3]}) was accepted for call {call_id} "
            f"({here[3]}): {result}",
            hole="new",
        )
        return result

    return f"replay {signed.by}'s signature on {run_id} {call_id}", op


def _asleep(w: W.World) -> tuple[str, str] | None:
    """The first run (in start order) sleeping on an open timer, and the timer's name."""
    for run_id in w.runs:
        run = w.raw.get_run(run_id)
        if run is None or run.status != "sleeping":
            continue
        for wait in open_waits(Journal(w.raw).records(run_id)):
            if wait.kind == "timer":
                return run_id, wait.name
    return None


@functools.lru_cache(maxsize=4096)
def _confirms(start: str) -> tuple[int, ...]:
    """The orders a run's plan asks to confirm, from the text of its ``run:start`` (the
    actors ask at every step; a text is parsed once)."""
    plan = Record("", RUN_START, 0, start).get("input")
    if not isinstance(plan, str) or not plan.startswith("plan:"):
        return ()
    return tuple(order for step in parse_plan(plan) for tool, order, _ in step if tool == "confirm")


@functools.lru_cache(maxsize=4096)
def _errands(turn: str) -> tuple[str, ...]:
    """The ids of the errand calls a model turn asks for, from the text of its record."""
    calls = (Record("", "model:", 0, turn).get("message") or {}).get("tool_calls") or ()
    return tuple(str(call.get("id")) for call in calls if call.get("name") == ERRAND)


class Answerer(Actor):
    """Staff answering a run's questions, and the payment provider sending its callbacks:
    early (before the run waits), late (after it finished or was cancelled), twice (the same
    value, or another), or with an answer the question's schema refuses."""

    kind = "answerer"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def weight(self, w: W.World) -> int:
        if self.left and self._racing(w, self._targets(w)):
            return 6
        return 2 if self.left else 0

    def _targets(self, w: W.World) -> list[tuple[str, int]]:
        targets = []
        for run_id in w.runs:
            start = Journal(w.raw).get(run_id, "run:start") if is_agent_run(run_id) else None
            if start is not None:
                targets += [(run_id, order) for order in _confirms(start.data)]
        return targets

    def _racing(self, w: W.World, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Targeted (issue 32), in the casts that aim: a wait whose run a cancel is under way
        on (or on a run above it), or a payment whose deadline is near."""
        if not w.aims_forks:
            return []
        cancelling = [
            a.proc.label.split()[-1]
            for a in w.actors
            if a.proc is not None and a.proc.label.startswith("cancel")
        ]
        racing = []
        for run_id, order in targets:
            if any(run_id == c or run_id.startswith(c + "/") for c in cancelling):
                racing.append((run_id, order))
                continue
            wait = Journal(w.raw).get(run_id, f"wait:{wait_name(order)}")
            deadline = wait.get("deadline_ms") if wait is not None else None
            if deadline is not None and 0 <= int(deadline) / 1000 - w.now <= 15:
                racing.append((run_id, order))
        return racing

    def choose(self, w: W.World) -> Op | None:
        targets = self._targets(w)
        if not targets:
            return None
        self.left -= 1
        racing = self._racing(w, targets)
        if racing and w.aim_rng.random() < 0.8:
            w.count("answers racing a cancel or a deadline")
            targets = racing
        run_id, order = targets[w.rng.randrange(len(targets))]
        name = wait_name(order)
        times = 2 if w.rng.random() < 0.3 else 1
        if order % 2 == 0:
            values = [w.rng.choice([*ANSWERS, *ANSWERS, "maybe"]) for _ in range(times)]
            return f"answer {run_id} {name} {values}", lambda: self._answer(w, run_id, name, values)
        payloads = [w.rng.randint(1, 9) for _ in range(times)]
        if order % 4 == 3:
            # A carrier's messages: keys repeat (a redelivery, maybe with another payload).
            sends = [(w.rng.choice("ab"), p) for p in payloads]
            return f"enqueue {run_id} {name} {sends}", lambda: self._enqueue(w, run_id, name, sends)
        # Sometimes staff first wake a sleeping run's timer now (da.wake_timer, "Wake now"):
        # the first run asleep. Decided from the draws above, so the seed's other choices stay.
        nap = _asleep(w) if payloads[0] >= 5 else None
        label = f"signal {run_id} {name} {payloads}"
        if nap is not None:
            label = f"wake {nap[0]} {nap[1]} now, then {label}"
        return label, lambda: self._signal(w, run_id, name, payloads, wake=nap)

    def _enqueue(self, w: W.World, run_id: str, channel: str, sends: list[Any]) -> str:
        did = []
        for key, payload in sends:
            sent = w.messages.setdefault((run_id, channel), [])
            try:
                out = da.enqueue(run_id, channel, key, payload, store=w.store)
            except DurableAgentsError as exc:
                sent.append((key, payload, exc.code))
            else:
                sent.append((key, out.value, "recorded" if out.recorded else "duplicate"))
            did.append(sent[-1][2])
        return ", ".join(did)

    def _answer(self, w: W.World, run_id: str, name: str, values: list[Any]) -> str:
        did = []
        for value in values:
            sent = w.answers.setdefault((run_id, name), [])
            # A person reads the question's page, then answers what it asked: the answer is
            # for that question (the engine refuses it if the run asks another one by now).
            asked = latest_question(Journal(w.store), run_id, name)[1]
            shown = asked.get("prompt") if asked is not None else None
            try:
                out = da.answer_interrupt(
                    run_id, name, value, by=self.name, prompt=shown, store=w.store
                )
            except InterruptAnswerInvalid:
                sent.append((value, "invalid", shown))
            except InterruptAlreadyAnswered:
                sent.append((value, "refused", shown))
            except DurableAgentsError as exc:
                sent.append((value, exc.code, shown))
            else:
                sent.append((value, "recorded" if out.recorded else "same", shown))
            did.append(sent[-1][1])
        return ", ".join(did)

    def _signal(
        self,
        w: W.World,
        run_id: str,
        name: str,
        payloads: list[Any],
        wake: tuple[str, str] | None = None,
    ) -> str:
        did = []
        if wake is not None:
            try:
                woke = da.wake_timer(wake[0], wake[1], by=self.name, store=w.store)
            except DurableAgentsError as exc:
                did.append(f"wake {exc.code}")
            else:
                if woke.recorded:
                    # Early when the run's time has not come, else a staff hand-over of an
                    # overdue timer; both are journaled as the person's decision.
                    w.count("timers woken by staff")
                did.append("woke early" if woke.recorded else "already woke")
        for payload in payloads:
            sent = w.signals.setdefault((run_id, name), [])
            try:
                out = da.signal(run_id, name, payload, store=w.store)
            except DurableAgentsError as exc:
                sent.append((payload, exc.code))
            else:
                sent.append((payload, "recorded" if out.recorded else "duplicate"))
            did.append(sent[-1][1])
        return ", ".join(did)


class Importer(Actor):
    """An operator who imports another site's export as evidence (``durable_agents import``
    without ``--live``: here, a copy of one of this world's runs under a new id, as the
    import writes it), then everyone who acts on the copy: a worker handed it, the admin's
    resume, a person deciding its request or resolving its halt, an answer, a signal, a
    cancel, a fork. Each must be refused by name (``run.imported``); the copy never moves
    (``imports_stay_inert``)."""

    kind = "importer"
    COMMANDS = (
        *("dispatch", "resume", "hand over", "decide", "resolve"),
        *("answer", "signal", "wake", "cancel", "fork"),
    )

    def __init__(self, name: str, imports: int, attacks: int, aimed: int = 2) -> None:
        super().__init__(name)
        self.imports_left = imports
        self.attacks_left = attacks
        self.aimed_left = aimed
        self.n = 0

    def _futures(self, w: W.World) -> list[tuple[str, str, str]]:
        """Sub-runs a parent's journal says it starts next, whose id no run holds yet: an
        errand call in a model turn, with no result, and no row at its sub-run's id (not
        journaled yet, or journaled by a driver that died before the sub-run's row):
        (parent, call, sub-run id)."""
        out = []
        for run_id in w.runs:
            if not is_agent_run(run_id) or w.raw.get(run_id, "run:complete") is not None:
                continue
            names = {rec.name: rec for rec in Journal(w.raw).records(run_id)}
            for name, rec in names.items():
                if not name.startswith("model:"):
                    continue
                for call_id in _errands(rec.data):
                    if f"tool:{call_id}" in names:
                        continue
                    child = names.get(f"child:{call_id}")
                    sub = str(child.get("run_id")) if child is not None else f"{run_id}/{call_id}"
                    if w.raw.get_run(sub) is None:
                        out.append((run_id, call_id, sub))
        return out

    def _sources(self, w: W.World) -> list[str]:
        return [
            r
            for r in w.runs
            if is_agent_run(r)
            and (row := w.raw.get_run(r)) is not None
            and not row.parent_run_id
            and not row.inert
            and w.raw.get(r, "run:start") is not None
        ]

    def weight(self, w: W.World) -> int:
        if self.aimed_left and self._futures(w):
            return 8  # the window lasts a few store calls (or until a dead driver's run moves)
        if self.imports_left and self._sources(w):
            return 2
        return 3 if self.attacks_left and w.imports else 0

    def choose(self, w: W.World) -> Op | None:
        futures = self._futures(w) if self.aimed_left else []
        if futures:
            # An operator imports a file holding a run at the id a parent gives its next
            # sub-run (issue 41): drawn from a stream of its own.
            self.aimed_left -= 1
            parent, call_id, sub = futures[w.aim_import_rng.randrange(len(futures))]
            return (
                f"import a finished sub-run at {sub} (inert)",
                lambda: self._import_at(w, parent, call_id, sub),
            )
        sources = self._sources(w)
        rng = w.import_rng
        if self.imports_left and sources and (not w.imports or rng.random() < 0.4):
            self.imports_left -= 1
            self.n += 1
            source = sources[rng.randrange(len(sources))]
            new = f"imp{self.n}:{source}"
            return f"import {source} as {new} (inert)", lambda: self._import(w, source, new)
        if not self.attacks_left or not w.imports:
            return None
        self.attacks_left -= 1
        run_id = rng.choice(sorted(w.imports))
        what = rng.choice(self.COMMANDS)
        return f"{what} imported {run_id}", lambda: self._attack(w, run_id, what)

    def _import(self, w: W.World, source: str, new: str) -> str:
        """Written to the raw store in one go: the real import is one transaction."""
        row = w.raw.get_run(source)
        assert row is not None
        copy = dataclasses.replace(
            row,
            run_id=new,
            imported=IMPORTED_INERT,
            session_id=None,
            parent_run_id=None,
            root_run_id=None,
            forked_from=None,
            forked_step=None,
        )
        w.raw.create_run(copy)
        for entry in w.raw.load(source):
            w.raw.insert(new, entry.name, entry.data)
        for req in w.raw.list_approval_requests(status=None, run_id=source):
            w.raw.save_approval_request(dataclasses.replace(req, run_id=new))
            w.raw.set_approval_status(new, req.call_id, req.status)
        for halt in w.raw.list_halts(run_id=source, status=None):
            w.raw.save_halt(dataclasses.replace(halt, run_id=new))
            if halt.status == "resolved":
                w.raw.resolve_halt_row(new, halt.op_id, halt.resolution or {}, halt.resolved_by)
            elif halt.status != "open":
                w.raw.orphan_halts(new)  # only orphaned halts are left open here
        w.imports[new] = W.imported_state(w.raw, new, source)
        w.count("runs imported inert")
        return new

    def _import_at(self, w: W.World, parent: str, call_id: str, sub: str) -> str:
        """A file's run at ``sub``, written to the raw store in one go as the import writes
        it: a finished run of the parent's errand agent, with the call's input (so a drive
        of the sub-run would take it for finished), its row naming ``parent`` as its
        parent, and an answer of the file's own."""
        if w.raw.get_run(sub) is not None:
            return "taken meanwhile"
        records = {r.name: r for r in Journal(w.raw).records(parent)}
        call = next(
            c
            for name, rec in records.items()
            if name.startswith("model:")
            for c in (rec.get("message") or {}).get("tool_calls") or ()
            if c.get("id") == call_id
        )
        errand = get_agent(AGENT).tools[ERRAND].subagent_def
        assert errand is not None
        text = json.loads(str(call.get("arguments")))["input"]
        row = w.raw.get_run(parent)
        root = (row.root_run_id if row is not None else None) or parent
        answer = f"done: as the file says ({self.name})"
        usage = {"input_tokens": 10, "output_tokens": 5}
        start = start_body(
            errand.name, text, errand.fingerprint(), None, {"parent": parent, "root": root}
        )
        complete = {"kind": "complete", "answer": answer, "turns": 1, "usage": usage}
        w.raw.create_run(
            RunInfo(
                run_id=sub,
                agent=errand.name,
                status="finished",
                input=text,
                answer=answer,
                turns=1,
                parent_run_id=parent,
                root_run_id=root,
                imported=IMPORTED_INERT,
            )
        )
        for name, data in (
            header(),
            (RUN_START, encode(start)),
            (RUN_COMPLETE, encode({**complete, "spend": usage})),
        ):
            w.raw.insert(sub, name, data)
        w.imports[sub] = W.imported_state(w.raw, sub, f"a file, at {parent}'s sub-run")
        w.aimed_imports[sub] = answer
        w.count("imports placed at a sub-run's future id")
        return sub

    def _attack(self, w: W.World, run_id: str, what: str) -> str:
        raw = w.raw
        requests = raw.list_approval_requests(run_id=run_id)
        halts = raw.list_halts(run_id=run_id)
        waits = sorted(
            {str(e.name.removeprefix("wait:")) for e in raw.load(run_id) if e.name[:5] == "wait:"}
        )
        wait = waits[0] if waits else "w1"
        by = "ann"
        try:
            if what == "dispatch":
                # A Celery message naming it (a forged one, or a stale one from its source).
                did = drive_like_a_worker(w, run_id)
                if did.startswith(("failed", "retry")) or did == "busy":
                    w.count("commands on inert imports refused")
                    return did
                raise AssertionError(did)  # reported below, as every command that went on
            if what == "resume":
                da.resume(run_id, store=w.store)
            elif what == "hand over":
                commands.hand_over(run_id, by=by, store=w.store)
            elif what == "decide":
                call = requests[0].call_id if requests else "c1"
                da.approve(run_id, call, True, by=by, store=w.store)
            elif what == "resolve":
                op = halts[0].op_id if halts else "c1"
                da.resolve_halt(run_id, op, dict(NOT_HAPPENED), is_error=True, by=by, store=w.store)
            elif what == "answer":
                da.answer_interrupt(run_id, wait, ANSWERS[0], by=by, store=w.store)
            elif what == "signal":
                da.signal(run_id, wait, 1, store=w.store)
            elif what == "wake":
                da.wake_timer(run_id, wait, by=by, store=w.store)
            elif what == "cancel":
                da.cancel(run_id, by=by, reason="imported", store=w.store)
            else:
                da.fork(run_id, 1, da.Patch(), by=by, store=w.store)
        except RunImported:
            w.count("commands on inert imports refused")
            return "refused (run.imported)"
        except StorageError:
            return "the store failed"
        except DurableAgentsError as exc:
            return f"refused ({exc.code})"
        except AssertionError as went_on:
            return self._went_on(w, run_id, what, str(went_on))
        return self._went_on(w, run_id, what, "accepted")

    def _went_on(self, w: W.World, run_id: str, what: str, did: str) -> str:
        w.violate(
            "imports_stay_inert",
            f"{what} on inert import {run_id} was not refused: {did}",
            hole="new",
        )
        return did


class Operator(Actor):
    """An operator who deletes finished runs (the admin's delete), and then everyone who
    comes back to a deleted id (issue 41): a client retrying under its run id, staff forking
    under it, the next automatic fork name once a fork was deleted, and the operator's own
    live import of the run's export trimmed right after its decision. Each must be refused
    (``run.spent``) or take another name: no row ever comes back at a deleted id
    (``spent_stay_spent``), and no effect fires twice (``effects_once``)."""

    kind = "operator"
    TRIES = ("retry", "fork as", "fork next", "import live")

    def __init__(self, name: str, deletes: int, tries: int) -> None:
        super().__init__(name)
        self.deletes_left = deletes
        self.tries_left = tries
        # What each deleted run held: its agent's input and its journal, trimmed after the
        # first decision (what the operator's trimmed export carries).
        self.deleted: dict[str, tuple[Any, list[tuple[str, str]]]] = {}

    def _deletable(self, w: W.World) -> list[str]:
        referenced = {
            ref
            for r in w.runs
            if (row := w.raw.get_run(r)) is not None
            for ref in (row.forked_from, row.parent_run_id)
            if ref
        }
        return [
            r
            for r in w.runs
            if is_agent_run(r)
            and r not in self.deleted
            and r not in referenced
            and (row := w.raw.get_run(r)) is not None
            and row.status in TERMINAL_STATUSES
            and not row.parent_run_id
            and not row.session_id
            and not row.inert
            and not any(e.name.startswith("child:") for e in w.raw.load(r))
        ]

    def weight(self, w: W.World) -> int:
        if self.deletes_left and self._deletable(w):
            return 2
        return 2 if self.tries_left and self.deleted else 0

    def choose(self, w: W.World) -> Op | None:
        rng = w.operator_rng
        deletable = self._deletable(w) if self.deletes_left else []
        if deletable and (not self.deleted or rng.random() < 0.5):
            self.deletes_left -= 1
            run_id = deletable[rng.randrange(len(deletable))]
            return f"delete {run_id}", lambda: self._delete(w, run_id)
        if not self.tries_left or not self.deleted:
            return None
        self.tries_left -= 1
        run_id = rng.choice(sorted(self.deleted))
        what = rng.choice(self.TRIES)
        return f"{what} {run_id} (deleted)", lambda: self._try(w, run_id, what)

    def _delete(self, w: W.World, run_id: str) -> str:
        row = w.raw.get_run(run_id)
        if row is None:
            return "gone"
        kept: list[tuple[str, str]] = []
        for entry in w.raw.load(run_id):
            kept.append((entry.name, entry.data))
            if entry.name.startswith("approval:"):
                break
        below = tree.runs_below(w.raw, run_id)
        try:
            commands.delete(run_id, by=self.name, store=w.store)
        except StorageError:
            # Maybe after its commit (the hunter's ``store`` fault): what is gone is gone,
            # and the world must forget it with the runs below it (fresh seed 9200861: its
            # bills were still held against a journal that no longer existed).
            if w.raw.get_run(run_id) is not None:
                raise
            for gone in [run_id, *below]:
                w.forget(gone)
            self.deleted[run_id] = (row.input, kept)
            raise
        for gone in [run_id, *below]:
            w.forget(gone)
        self.deleted[run_id] = (row.input, kept)
        w.count("runs deleted by the operator")
        return "deleted"

    def _try(self, w: W.World, run_id: str, what: str) -> str:
        text, kept = self.deleted[run_id]
        try:
            if what == "retry":
                get_agent(AGENT).start(text, run_id=run_id, store=w.store)
            elif what == "fork as":
                sources = [r for r in w.runs if w.raw.get(r, "run:start") is not None]
                if not sources:
                    return "nothing to fork"
                source = sources[w.operator_rng.randrange(len(sources))]
                da.fork(source, 1, new_run_id=run_id, by=self.name, store=w.store)
            elif what == "fork next":
                return self._fork_next(w)
            else:
                w.raw.create_run(
                    RunInfo(
                        run_id=run_id,
                        agent=AGENT,
                        status=QUEUED,
                        input=text,
                        imported=IMPORTED_LIVE,
                    )
                )
                for name, data in kept:
                    w.raw.insert(run_id, name, data)
                w.dispatch(run_id)
        except RunIdSpent:
            w.count(f"deleted ids refused ({what})")
            return "refused: spent"
        except DurableAgentsError as exc:
            return f"refused ({exc.code})"
        return "taken"

    def _fork_next(self, w: W.World) -> str:
        """Fork a finished run, delete the fork, fork the run again: the second fork never
        takes the deleted one's automatic name (issue 41, item 5)."""
        sources = [
            r
            for r in w.runs
            if is_agent_run(r)
            and (row := w.raw.get_run(r)) is not None
            and row.status in TERMINAL_STATUSES
            and not (row.parent_run_id or row.session_id or row.inert)
        ]
        if not sources:
            w.count("no finished run to fork")
            return "nothing to fork"
        source = sources[w.operator_rng.randrange(len(sources))]
        first = da.fork(source, 1, by=self.name, store=w.store)
        self._delete(w, first)
        again = da.fork(source, 1, by=self.name, store=w.store)
        w.dispatch(again)
        w.count("forks named after a deleted fork")
        return f"forked again as {again}"
