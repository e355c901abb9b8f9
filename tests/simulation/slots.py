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

from . import world as W
from .actors import Actor, Op
from .agent import AGENT

ODDS = 0.8


def takes_part(seed: int) -> bool:
    """Whether a limits cast has the staller (``scenario.build``), from its own stream."""
    return random.Random(f"stale-slot:{seed}").random() < ODDS


class SlotStaller(Actor):
    kind = "staller"

    def __init__(self, name: str, seed: int, left: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"stale-slot-ops:{seed}")
        self.left = left

    def _holders(self, w: W.World) -> list[W.Proc]:
        held = w.holding.get(f"agent/{AGENT}", {})
        return [
            p
            for p in held.values()
            if p.actor.kind == "driver"
            and not (p.dead or p.glet.dead or p.lapsed or p.stalled_until)
        ]

    def weight(self, w: W.World) -> int:
        return 5 if self.left and self._holders(w) else 0

    def choose(self, w: W.World) -> Op | None:
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
            until = w.now + self.rng.uniform(1.5, 3.0) * ttl
        proc.lapsed = True
        proc.stalled_until = until
        w.stalls += 1
        w.count("drivers frozen holding a slot")
        return f"frozen until t={until - W.EPOCH:.1f}"
