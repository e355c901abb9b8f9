"""A stale driver giving a slot back after a takeover (issue 43), aimed at.

In the casts whose agent has ``max_concurrent_runs`` (``agent.Limits.runs``), eight in ten
(drawn from a stream of their own, ``stale-slot:<seed>``), the staller freezes a driver that
holds its run's slot, up to twice, for 1.5 to 3 leases (1.05 to 1.9 inside a claimed call,
as any stall; its heartbeat with it). The run's lease lapses; recovery or a redelivery hands
the run to another driver, which takes the slot again for the same run (one holder per run)
under its own lease token. The stale driver wakes, loses the run at its next fenced write,
and ends its drive giving its slot back: only under the token it took it with
(``Store.release_slot``), or it frees its successor's slot, and a run waiting for one, or
started next, is driven beside the successor (``limits_hold``). (Freezing only while a run
waits for a slot caught fewer seeds of the same 1,600: 6 against 10.) Before, the window
needed a random stall to fall inside a slot's drive: 1 seed in 600 of CI's.
"""

from __future__ import annotations

import random

from durable_agents.engine.agent import get_agent

from . import world as W
from .actors import Actor, Op
from .agent import AGENT

ODDS = 0.7


# Seven casts in ten, not all: in the others a slot holder that dies is nobody's to wake,
# which is what ``slots-outlive-leases`` needs (with the staller in every cast, CI's 600
# seeds caught it once).


def takes_part(seed: int) -> bool:
    """Whether a limits cast has the staller (``scenario.build``), from its own stream."""
    return random.Random(f"stale-slot:{seed}").random() < ODDS


class SlotStaller(Actor):
    kind = "staller"

    def __init__(self, name: str, seed: int, left: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"stale-slot-ops:{seed}")
        self.left = left
        self.orders = 3  # runs started while a frozen driver's run is taken over
        self.frozen: list[W.Proc] = []

    def _holders(self, w: W.World) -> list[W.Proc]:
        held = w.holding.get(f"agent/{AGENT}", {})
        return [
            p
            for p in held.values()
            if p.actor.kind == "driver"
            and not (p.dead or p.glet.dead or p.lapsed or p.stalled_until)
            and p.attempt_at is None  # outside a claimed call: it may stay frozen long
        ]

    def _taken_over(self, w: W.World) -> list[str]:
        """The runs of drivers it froze that another driver holds by now (its successor
        has taken the run's slot again, or is about to)."""
        out = []
        for proc in self.frozen:
            if proc.dead or proc.glet.dead or not proc.stalled_until or proc.run_id is None:
                continue
            held = w.lease_holders.get(proc.run_id, {})
            if any(p is not proc and until > w.now for p, until in held.values()):
                out.append(proc.run_id)
        return out

    def _due(self, w: W.World) -> W.Proc | None:
        """A frozen driver whose successor drives its run holding the agent's slot, while
        another run waits for one: the moment its waking hurts most."""
        key = f"agent/{AGENT}"
        if not w.raw.list_throttled(key=key, limit=1):
            return None
        return self._succeeded(w)

    def _succeeded(self, w: W.World) -> W.Proc | None:
        """A frozen driver whose successor drives its run, holding the agent's slot."""
        held = w.holding.get(f"agent/{AGENT}", {})
        for proc in self.frozen:
            if proc.dead or proc.glet.dead or not proc.stalled_until or proc.run_id is None:
                continue
            successor = held.get(proc.run_id)
            if successor is not None and successor is not proc and not successor.dead:
                return proc
        return None

    def weight(self, w: W.World) -> int:
        if self._due(w) is not None:
            return 20
        if self.orders and self._succeeded(w) is not None:
            return 8
        return 5 if self.left and self._holders(w) else 0

    def choose(self, w: W.World) -> Op | None:
        due = self._due(w)
        if due is not None:
            # It wakes now (the rest of its freeze cut short): its drive ends at its next
            # fenced write and gives back its slot, while the waiting run wants one.
            self.frozen.remove(due)

            def wake(proc: W.Proc = due) -> str:
                proc.stalled_until = min(proc.stalled_until, w.now)
                w.count("frozen slot holders woken while a run waits for a slot")
                return "woken"

            return f"wake pid {due.pid}, whose successor holds its run's slot", wake
        if self.orders and self._succeeded(w) is not None:
            # While the stale driver is still frozen and its successor holds the run (and
            # its slot), a customer starts another order: it waits for the slot, and is
            # handed over the moment a slot is given back.
            self.orders -= 1
            run_id = f"s{3 - self.orders}"
            plan = f"plan:lookup.{90 + self.orders}.0;notify.{90 + self.orders}.0"
            w.count("runs started while a slot's stale holder is frozen")
            return f"start {run_id} {plan}", lambda: get_agent(AGENT).start(
                plan, run_id=run_id, store=w.store
            )
        holders = self._holders(w)
        if not self.left or not holders:
            return None
        self.left -= 1
        proc = holders[self.rng.randrange(len(holders))]
        return f"freeze pid {proc.pid} ({proc.label}), which holds a slot", lambda: self._freeze(
            w, proc
        )

    def _freeze(self, w: W.World, proc: W.Proc) -> str:
        if proc.dead or proc.glet.dead or proc.lapsed or proc.stalled_until:
            return "moved on"
        ttl = w.config.ttl
        if proc.attempt_at is not None:
            # Inside a claimed call, as any stall: it wakes before a halt on the call is old
            # enough to resolve (HALT_MIN_AGE, two leases).
            until = min(w.now + self.rng.uniform(1.05, 1.9) * ttl, proc.attempt_at + 1.9 * ttl)
        else:
            # Outside one nothing is owed to the frozen process: long enough for recovery
            # to hand the run over and the successor to take the slot before it wakes.
            until = w.now + self.rng.uniform(2.0, 3.5) * ttl
        self.frozen.append(proc)
        proc.lapsed = True
        proc.stalled_until = until
        w.stalls += 1
        w.count("drivers frozen holding a slot")
        return f"frozen until t={until - W.EPOCH:.1f}"
