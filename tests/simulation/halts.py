"""A halt on a stalled driver's call, resolved as soon as the engine lets it (issue 43).

In four casts in ten with drivers and recovery (drawn from a stream of their own,
``halt-aim:<seed>``; its choices from ``halt-aim-ops:<seed>``), with a worker more, a
process driving a run (a worker, or a webhook's view driving inline) that enters a charge or
a refund — its attempt claimed, its effect not yet made — freezes there, heartbeat and all,
for 1.85 to 1.95 leases since its claim, up to twice (``World.slow_tool`` asks ``freeze``).
Its lease lapses; the on-call (nora), paged about a run left running with nobody's lease on
it, runs a recovery pass by hand (``durable_agents recover``), and a driver finds the claim
without a result and halts the run. She resolves that halt the moment its driver has let
the run go: she checks the ledger, finds no effect yet, and records "did not happen". The
engine refuses her (``halt.too_young``: the attempt is younger than ``HALT_MIN_AGE``, two
leases); she tries again later, once the frozen driver has woken and made its effect (found:
its result). An engine that lets a halt be resolved at once (``halt-min-age-zero``) takes
"did not happen"; the frozen driver then makes its effect, and the model asks for it again
(``results_true``, ``effects_once``). The freeze ends before the halt is old enough, as the
``slow`` fault's does, so with the engine as it is nothing here is beyond the promise.
Before, catching that break needed a slow call, a takeover and a person's resolution to
line up by chance: 2 of CI's 600 seeds.
"""

from __future__ import annotations

import random

from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.ports import RUNNING

from . import world as W
from .actors import Actor, Op, Person

ODDS = 0.4
TRIES = 3  # resolutions of one halt: at once (refused), then later, once the effect landed


def takes_part(seed: int) -> bool:
    """Whether a cast with drivers and recovery has the aim (``scenario.build``), from its
    own stream."""
    return random.Random(f"halt-aim:{seed}").random() < ODDS


class HaltResolver(Actor):
    """The on-call: freezes a driver inside an at-most-once call (the fault, through
    ``World.slow_tool``) and resolves the halt a takeover makes of it at once."""

    kind = "resolver"

    def __init__(self, name: str, seed: int, freezes: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"halt-aim-ops:{seed}")
        self.freezes = freezes
        self.frozen: dict[tuple[str, str], W.Proc] = {}  # (run, call) -> the frozen driver
        self.tries: dict[tuple[str, str], int] = {}
        self.recovered: set[tuple[str, str]] = set()  # freezes whose stuck run was handed on

    def freeze(self, w: W.World, proc: W.Proc, tool: str, run_id: str, call_id: str) -> bool:
        """Inside ``tool`` of ``run_id``, after its claim and before its effect: freeze the
        driver here, if the aim has a freeze left and none is under way."""
        if (
            not self.freezes
            or w.phase != "main"
            or proc.actor.kind not in ("driver", "webhook")  # a worker, or a view driving inline
            or proc.attempt_at is None
            or tool not in ("charge", "refund")
            or w.step > 0.6 * w.config.steps  # too late for a takeover before the end
            or any(p.stalled_until and not p.dead for p in self.frozen.values())
        ):
            return False
        self.freezes -= 1
        proc.lapsed = True
        # Short of HALT_MIN_AGE (two leases) since the claim, as the ``slow`` fault: the
        # effect lands before the engine lets anyone resolve a halt on it.
        until = proc.attempt_at + self.rng.uniform(1.85, 1.95) * w.config.ttl
        proc.stalled_until = until
        self.frozen[(run_id, call_id)] = proc
        self.tries[(run_id, call_id)] = TRIES
        w.count("drivers frozen inside an at-most-once call (halt aim)")
        w.log(self.name, f"FREEZES pid {proc.pid} inside {tool} until t={until - W.EPOCH:.1f}")
        return True

    def _targets(self, w: W.World) -> list[tuple[str, str]]:
        """Open halts on a call a frozen driver is inside (or was), with tries left, whose
        run nobody holds any more (the driver that halted it has let it go)."""
        if not self.frozen:
            return []
        out = []
        for h in w.raw.list_halts():
            if not self.tries.get((h.run_id, h.op_id)):
                continue
            lease = w.raw.get_lease(h.run_id)
            if lease is None or not lease.live:
                out.append((h.run_id, h.op_id))
        return out

    def _stuck(self, w: W.World) -> list[tuple[str, str]]:
        """Freezes whose run is left running with its lease lapsed, not handed on yet."""
        out = []
        for (run_id, call_id), proc in self.frozen.items():
            if (run_id, call_id) in self.recovered or not proc.stalled_until or proc.dead:
                continue
            row, lease = w.raw.get_run(run_id), w.raw.get_lease(run_id)
            if row is not None and row.status == RUNNING and (lease is None or not lease.live):
                out.append((run_id, call_id))
        return out

    def weight(self, w: W.World) -> int:
        if self._stuck(w):
            return 40
        targets = self._targets(w)
        if not targets:
            return 0
        # The first try as soon as the halt is open; the others whenever.
        return 40 if any(self.tries[t] == TRIES for t in targets) else 2

    def choose(self, w: W.World) -> Op | None:
        stuck = self._stuck(w)
        if stuck:
            # Paged about a run that stays running with nobody's lease on it, the on-call
            # runs a recovery pass by hand (``durable_agents recover``): it hands the run to
            # a driver, which finds the claim without a result and halts the run.
            self.recovered.update(stuck)
            w.count("recovery passes run by hand on a frozen driver's run (halt aim)")
            return "recovery pass by hand", lambda: recover(store=w.store)
        targets = self._targets(w)
        if not targets:
            return None
        first = [t for t in targets if self.tries[t] == TRIES]
        run_id, call_id = (first or targets)[self.rng.randrange(len(first or targets))]
        self.tries[(run_id, call_id)] -= 1
        proc = self.frozen[(run_id, call_id)]
        w.count(
            "halts on a frozen call: resolutions tried while it is frozen (halt aim)"
            if proc.stalled_until and not proc.dead
            else "halts on a frozen call: resolutions tried after it woke (halt aim)"
        )
        # A person's resolution: check the ledger, submit at once (``Person._resolve``).
        return Person(self.name, 0, 0)._resolve(w, run_id, call_id)
