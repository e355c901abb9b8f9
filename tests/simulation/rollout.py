"""A signed approval, a deploy before its drive, and the signature replayed on the call asked
again (issue 43), aimed at.

In half the casts whose people hold keys (the answerer's casts with people; drawn from a
stream of their own, ``rollout:<seed>``; its choices from ``rollout-ops:<seed>``), the people
sign eight unedited decisions in ten, and an insider (oscar) who knows when deploys roll out
times one: as soon as a person's signed approval of a refund is journaled and the refund has
not run, up to twice, he ships a deploy that gives ``refund`` a defaulted ``reason`` (or
takes it away). The drive that takes the approval computes other arguments, so it asks the
call again, showing the approved ones as ``previous_arguments``. Then he submits the signed
approval's signature on the call asked again, up to twice (``actors.replay``): a signature
binds the arguments asked about now, so it must be refused. The people sign their own
decisions on it too, which must be taken. An engine that checks a signature against the
arguments the call asked about first (``signature-over-earlier-arguments``) takes the replay
and refuses the people (``signatures_bind``). Before, that needed the interceptor's deploy to
fall between an approval and its drive by chance: 4 seeds in 2,000.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from durable_agents.engine.approvals import decision_name
from durable_agents.engine.journal import Journal
from durable_agents.engine.records import encode

from . import world as W
from .actors import Actor, Op, Person, replay
from .agent import AGENT

ODDS = 0.8


def takes_part(seed: int) -> bool:
    """Whether a cast whose people hold keys has the insider (``scenario.build``), from its
    own stream."""
    return random.Random(f"rollout:{seed}").random() < ODDS


def _ours(w: W.World, run_id: str) -> bool:
    """A run of the agent whose ``refund`` a deploy changes (an errand's sub-run is not)."""
    row = w.raw.get_run(run_id)
    return row is not None and row.agent == AGENT


class Rollout(Actor):
    kind = "rollout"

    def __init__(self, name: str, seed: int, deploys: int, replays: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"rollout-ops:{seed}")
        self.deploys = deploys
        self.replays = replays
        self.timed: set[tuple[str, str]] = set()  # (run, call) a deploy was timed to
        self.replayed: set[tuple[W.Signed, str]] = set()

    def _marks(self, w: W.World) -> list[tuple[str, str]]:
        """Refunds a signed approval may yet be taken for, on arguments the deployed code
        would ask about as they are: pending and asked for the first time (a person may sign
        its approval), or approved with a signature, journaled, and not run."""
        journal = Journal(w.raw)
        reason = bool(w.deploy.reason)
        out = [
            (req.run_id, req.call_id)
            for req in w.raw.list_approval_requests()
            if req.tool_name == "refund"
            and req.previous_arguments is None
            and isinstance(req.arguments, dict)
            and ("reason" in req.arguments) == reason
            and _ours(w, req.run_id)
        ]
        for signed in w.signatures:
            args = signed.arguments
            if (
                not signed.approved
                or signed.tool_name != "refund"
                or not isinstance(args, dict)
                or ("reason" in args) != reason
                or journal.get(signed.run_id, f"tool:{signed.call_id}") is not None
            ):
                continue
            record = journal.get(signed.run_id, decision_name(signed.call_id, args, again=False))
            if record is not None and record.get("approved") and _ours(w, signed.run_id):
                out.append((signed.run_id, signed.call_id))
        return [m for m in out if m not in self.timed]

    def _asked_again(self, w: W.World) -> list[tuple[W.Signed, Any]]:
        """A signed approval's call asked again about other arguments, pending: the request
        shows the signed arguments as its ``previous_arguments``."""
        out = []
        for req in w.raw.list_approval_requests():
            if req.previous_arguments is None:
                continue
            for signed in w.signatures:
                if (
                    (signed, encode(req.arguments)) not in self.replayed
                    and (signed.run_id, signed.call_id) == (req.run_id, req.call_id)
                    and encode(signed.arguments) == encode(req.previous_arguments)
                ):
                    out.append((signed, req))
        return out

    def weight(self, w: W.World) -> int:
        if self.replays and self._asked_again(w):
            return 20
        if self.deploys and self._marks(w):
            return 60  # before the approval, or before a driver takes it
        return 0

    def choose(self, w: W.World) -> Op | None:
        targets = self._asked_again(w) if self.replays else []
        if targets:
            self.replays -= 1
            signed, req = targets[self.rng.randrange(len(targets))]
            self.replayed.add((signed, encode(req.arguments)))
            w.count("replays of a signed approval on its call asked again (rollout)")
            return replay(w, signed, req.run_id, req.call_id)
        marks = self._marks(w) if self.deploys else []
        if not marks:
            return None
        self.deploys -= 1
        self.timed.update(marks)
        new = dataclasses.replace(w.deploy, reason=not w.deploy.reason)
        w.count("deploys timed to a refund's approval (rollout)")

        def op() -> str:
            w.deploy = new
            w.deploys.append((w.now, new))
            new.activate()
            return new.describe()

        return f"deploy ({new.describe()}) under a refund's approval", op


class PromptApprover(Actor):
    """The cast's first person, on call for refunds: approves each refund asked for the first
    time as soon as it is pending (as they read it, unedited; signed as they sign), up to
    twice, so that the approval is journaled while the seed still runs its actors."""

    kind = "approver"

    def __init__(self, name: str, left: int) -> None:
        super().__init__(name)
        self.left = left
        self.decided: set[tuple[str, str]] = set()

    def _pending(self, w: W.World) -> list[tuple[str, str]]:
        return [
            (req.run_id, req.call_id)
            for req in w.raw.list_approval_requests()
            if req.tool_name == "refund"
            and req.previous_arguments is None
            and req.policy.get("kind") != "quorum"
            and (req.run_id, req.call_id) not in self.decided
        ]

    def weight(self, w: W.World) -> int:
        return 20 if self.left and self._pending(w) else 0

    def choose(self, w: W.World) -> Op | None:
        pending = self._pending(w) if self.left else []
        if not pending:
            return None
        self.left -= 1
        run_id, call_id = pending[0]
        self.decided.add((run_id, call_id))
        w.count("refunds approved at once (rollout)")
        label, op = Person(self.name, 0, 0)._decide(w, run_id, call_id, True)
        # One request, as a resolution is: read the page and submit it, nobody moving in
        # between (the process may still crash), so the approval is journaled in time.
        op.exclusive = True  # type: ignore[attr-defined]
        return label, op
