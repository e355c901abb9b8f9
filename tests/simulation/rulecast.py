"""Approval rules in the world (issue 42, "The net").

In four casts in ten with people and the answerer (drawn from a stream of their own,
``rules:<seed>``; its choices from ``rules-ops:<seed>``), refunds are gated by a company's
policy (``agent.rules_policy``): up to 15 they go through, up to 30 one lead decides, above
that two of finance, above 70 they are refused; every request is reminded after 60 s,
escalated to the on-call group after 120 s and expires after 240 s (``on_expiry`` drawn per
cast: deny, cancel or halt). Besides the people (leads and finance):

* **the on-call** (otto) decides pending refunds too: refused until a request escalated;
* **the sweepers** (two of beat's timer sweeps) take the deadline steps due, racing each
  other and the people, and crash mid-step as any process may;
* **the clock** (tic) jumps to the next deadline step of a pending request, across each
  one: remind, escalate, expire, so people decide right at an expiry;
* **delegations** (lena, the team head): bob away with ann deciding for him, ann away
  with dee deciding for her; recorded for a few minutes and revoked early at times;
* **the deputies** (dee for ann, ann for bob) approve pending refunds for their approver
  (``for_approver=``), whoever else voted;
* **the rules deployer** (rex) deploys the rules' next version while a refund waits (the
  thresholds move up: what waits must need no less for it).

The people's edits in these casts double or halve the amount, across thresholds both ways.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import durable_agents as da
from durable_agents.engine.commands.delegations import delegate
from durable_agents.engine.commands.delegations import revoke as revoke_delegation
from durable_agents.engine.journal import Journal

from . import world as W
from .actors import Actor, Op, Person
from .agent import FINANCE, LEADS, ONCALL
from .invariants import sweep_reaches_down

ON_EXPIRY = ("deny", "deny", "cancel", "halt")


def takes_part(config: W.Config) -> bool:
    """Whether this seed's cast gates refunds by rules (``scenario.build``)."""
    if "person" not in config.actors or "answerer" not in config.actors:
        return False
    return random.Random(f"rules:{config.seed}").random() < config.rules


def expiry_of(seed: int) -> str:
    return random.Random(f"rules-expiry:{seed}").choice(ON_EXPIRY)


def cast(w: W.World, people: list[str]) -> list[Actor]:
    """The rules cast's groups and actors (people are the cast's persons)."""
    w.rules_rng = random.Random(f"rules-ops:{w.config.seed}")
    w.groups = {LEADS: [*people, "edith"], FINANCE: [*people, "edith"], ONCALL: ["otto"]}
    w.eligible = [*people, "edith", "otto"]
    if w.keys:
        for name in ("edith", "otto"):
            w.give_key(name)  # sign as the people do
    # Refunds are most of what these casts are about: more of them in the plans.
    w.plans.tools += ["refund", "refund", "refund"]
    actors: list[Actor] = [
        Editor("edith", 5),
        OnCall("otto"),
        Sweeper("sweep1"),
        Sweeper("sweep2"),
        Clock("tic", 8),
        RulesDeployer("rex", 2),
    ]
    if len(people) >= 2:
        actors += [
            Delegations("lena", [(people[1], people[0]), (people[0], "dee")]),
            Deputy("dee", people[0]),
            Deputy(people[0], people[1], own=True),
        ]
    return actors


def _pending(w: W.World) -> list[Any]:
    return [r for r in w.raw.list_approval_requests() if r.policy.get("rule")]


class OnCall(Person):
    """The on-call group's member: decides pending refunds, and may only once a request
    escalated to them (refused before: ``approval.not_eligible``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, 0, 0)
        self.resumes_left = 0

    def weight(self, w: W.World) -> int:
        return 2 if _pending(w) else 0

    def choose(self, w: W.World) -> Op | None:
        requests = _pending(w)
        if not requests:
            return None
        req = requests[w.rules_rng.randrange(len(requests))]
        if req.policy.get("escalated_to"):
            w.count("rules: refunds decided by the on-call after escalation")
        approve = w.rules_rng.random() < 0.75
        edit = approve and w.rules_rng.random() < 0.3
        return self._decide(w, req.run_id, req.call_id, approve, edit=edit)


class Editor(Person):
    """A lead who is in finance too, and edits what she approves across a threshold: a
    refund of one lead's range up into finance's quorum, or down into the lead's range (or
    below, where the rules allow it); each must be decided under the rule of the edit,
    without lowering what the request needed when asked."""

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name, 0, 0)
        self.resumes_left = 0
        self.left = left
        self.done: set[tuple[str, str]] = set()

    def _targets(self, w: W.World) -> list[Any]:
        found = [r for r in _pending(w) if (r.run_id, r.call_id) not in self.done]
        # Before anyone voted: an edit disagreeing with a vote already cast is refused.
        fresh = [r for r in found if not w.raw.list_decisions(r.run_id, r.call_id)]
        return fresh or found

    def weight(self, w: W.World) -> int:
        return 12 if self.left and self._targets(w) else 0

    def choose(self, w: W.World) -> Op | None:
        targets = self._targets(w)
        if not targets:
            return None
        self.left -= 1
        req = targets[w.rules_rng.randrange(len(targets))]
        self.done.add((req.run_id, req.call_id))
        w.count("rules: edits across a threshold")
        return self._decide(w, req.run_id, req.call_id, True, edit=True)


class Sweeper(Actor):
    """Beat's timer sweep, run as soon as a deadline step is due (two of them race)."""

    kind = "sweeper"

    def weight(self, w: W.World) -> int:
        now = w.raw.now()
        due = [r for r in w.raw.list_approval_requests() if r.due_at and r.due_at <= now]
        return 3 if due else 0

    def choose(self, w: W.World) -> Op | None:
        from durable_agents.engine.commands.timers import wake_timers

        w.count("rules: sweeps with a deadline step due")
        return "timer sweep", lambda: sweep_reaches_down(w, lambda: wake_timers(store=w.store))


class Clock(Actor):
    """Jumps the virtual clock to the next deadline step of a pending request."""

    kind = "clock"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def _next(self, w: W.World) -> Any:
        now = w.raw.now()
        ahead = [r.due_at for r in _pending(w) if r.due_at and r.due_at > now]
        return min(ahead) if ahead else None

    def weight(self, w: W.World) -> int:
        return 2 if self.left and self._next(w) is not None else 0

    def choose(self, w: W.World) -> Op | None:
        at = self._next(w)
        if at is None:
            return None
        self.left -= 1
        jump = (at - w.raw.now()).total_seconds() + w.rules_rng.choice((0.0, 0.5, 3.0))
        w.advance_by(max(0.0, jump))
        w.count("rules: clock jumps to a deadline step")
        return f"clock +{jump:.1f}s", lambda: "jumped"


class RulesDeployer(Actor):
    """Deploys the rules' other version while a refund waits under them."""

    kind = "deployer"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left

    def weight(self, w: W.World) -> int:
        return 2 if self.left and _pending(w) else 0

    def choose(self, w: W.World) -> Op | None:
        import dataclasses

        self.left -= 1
        new = dataclasses.replace(w.deploy, rules=3 - w.deploy.rules)
        w.count("rules: deploys of other rules while a refund waits")
        waiting = _pending(w)
        run_id = waiting[w.rules_rng.randrange(len(waiting))].run_id

        def op() -> str:
            w.deploy = new
            w.deploys.append((w.now, new))
            new.activate()
            # Staff press *resume* on a run that waits, to see whether the new rules apply
            # to it (they must not: it keeps the rule it was asked under).
            try:
                da.resume(run_id, store=w.store)
            except da.Pause:
                pass
            return new.describe()

        return f"deploy ({new.describe()})", op


class Delegations(Actor):
    """The team head: records who decides for whom (for a few minutes), and revokes early."""

    kind = "delegations"

    def __init__(self, name: str, pairs: list[tuple[str, str]]) -> None:
        super().__init__(name)
        self.todo = list(pairs)
        self.standing: list[int] = []
        self.revokes = 2

    def weight(self, w: W.World) -> int:
        if self.todo and _pending(w):
            return 5
        return 1 if self.standing and self.revokes else 0

    def choose(self, w: W.World) -> Op | None:
        if self.todo and (not self.standing or w.rules_rng.random() < 0.7):
            approver, deputy = self.todo.pop(0)
            ends = w.raw.now() + timedelta(seconds=w.rules_rng.choice((90, 300, 600, 900)))

            def record() -> str:
                info = delegate(approver, deputy, None, ends, by=self.name, store=w.store)
                self.standing.append(int(info.id or 0))
                w.count("rules: delegations recorded")
                return f"delegation {info.id}"

            return f"delegate {approver} -> {deputy}", record
        if not self.standing or not self.revokes:
            return None
        self.revokes -= 1
        number = self.standing.pop(w.rules_rng.randrange(len(self.standing)))

        def revoke() -> str:
            revoke_delegation(number, by=self.name, store=w.store)
            w.count("rules: delegations revoked")
            return "revoked"

        return f"revoke delegation {number}", revoke


class Deputy(Actor):
    """A deputy approving pending refunds for their approver (``for_approver=``)."""

    kind = "deputy"

    def __init__(self, name: str, approver: str, own: bool = False) -> None:
        super().__init__(name)
        self.approver = approver
        self.own = own  # an approver too, voting from another tab as well
        self.left = 5
        self.tried: set[tuple[str, str]] = set()

    def _targets(self, w: W.World) -> list[Any]:
        now = w.raw.now()
        if not any(
            d.deputy == self.name and d.approver == self.approver and d.in_force(now)
            for d in w.raw.list_delegations()
        ):
            return []
        found = [r for r in _pending(w) if (r.run_id, r.call_id) not in self.tried]
        # A deputy who is an approver too looks first at what they voted on themselves, then
        # at what needs more than one vote and has one.
        own = [
            r
            for r in found
            if any(d.approver == self.name for d in w.raw.list_decisions(r.run_id, r.call_id))
        ]
        many = [r for r in found if r.policy.get("kind") == "quorum"]
        if self.own:  # votes for the approver and for themselves, from two tabs
            return own or many or found
        # Another deputy leaves a quorum nobody voted on yet to its members first (the
        # editor's edits).
        voted = [r for r in many if w.raw.list_decisions(r.run_id, r.call_id)]
        return voted or [r for r in found if r.policy.get("kind") != "quorum"]

    def weight(self, w: W.World) -> int:
        return 8 if self.left and self._targets(w) else 0

    def choose(self, w: W.World) -> Op | None:
        targets = self._targets(w)
        if not targets:
            return None
        self.left -= 1
        req = targets[w.rules_rng.randrange(len(targets))]
        self.tried.add((req.run_id, req.call_id))
        run_id, call_id, approver = req.run_id, req.call_id, self.approver

        def op() -> str:
            request = w.store.get_approval_request(run_id, call_id)
            if request is None:
                return "gone"
            seen = request.arguments
            w.submitted.append((run_id, call_id, approver, seen))
            outcome = da.approve(
                run_id,
                call_id,
                True,
                by=self.name,
                for_approver=approver,
                arguments=seen,
                store=w.store,
            )
            w.count("rules: decisions by a deputy taken")
            if (
                self.own
                and outcome.status == "pending"
                and request.policy.get("kind") == "quorum"
                and not any(d.approver == self.name for d in w.raw.list_decisions(run_id, call_id))
            ):
                # Their other tab: the deputy, an approver too, votes for themselves as well
                # (refused: one person counts once, whoever they decide for).
                w.count("rules: deputies voting for themselves too")
                w.submitted.append((run_id, call_id, self.name, seen))
                outcome = da.approve(
                    run_id, call_id, True, by=self.name, arguments=seen, store=w.store
                )
            if outcome.status == "approved":
                again = request.previous_arguments is not None
                from durable_agents.engine.approvals import decision_name

                standing = Journal(w.raw).get(run_id, decision_name(call_id, seen, again=again))
                by = str(standing.get("by")) if standing is not None else approver
                rows = [d for d in w.raw.list_decisions(run_id, call_id) if d.approver == by]
                ran_as = rows[0].arguments if rows and rows[0].arguments is not None else seen
                w.approved.setdefault((run_id, call_id), []).append(ran_as)
            return outcome.status

        return f"approve {run_id} {call_id} for {approver}", op
