"""Hand-written schedules over the simulator's world: the same store, clock, actors, ledger
and invariants, with the interleaving spelled out instead of drawn from a seed. A seed's
schedule shifts when the engine gains or loses a store call; a directed one names its
points (``tool charge * done``), so it keeps meaning the same thing."""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator
from typing import Any

from .agent import Deploy, Plans
from .invariants import check_all
from .scenario import quiet_phase
from .world import Config, Proc, World, patched


@contextlib.contextmanager
def directed_world(ttl: float = 30.0) -> Iterator[World]:
    w = World(Config(0, faults=frozenset(), ttl=ttl))
    with patched(w):
        try:
            w.plans = Plans(w)
            w.deploy = Deploy()
            w.deploy.activate()
            yield w
        finally:
            w.teardown()


def run(
    w: World, actor: Any, label: str, fn: Callable[[], Any], *, until: str | None = None
) -> Proc:
    """Start ``fn`` as ``actor``'s operation and run it to its end, or until it stands at a
    point matching ``until`` (a glob)."""
    if actor not in w.actors:
        w.actors.append(actor)
    proc = w.start(actor, label, fn)
    while not proc.glet.dead and not (until and fnmatch.fnmatch(proc.point, until)):
        if not proc.ready(w.now):
            w.advance(max(0.1, proc.sleep_until - w.now))
            continue
        w.move(proc, faults=False)
    assert until is None or not proc.glet.dead, f"{label} ended before reaching {until!r}"
    return proc


def deploy(w: World, **changes: Any) -> None:
    from dataclasses import replace

    w.deploy = replace(w.deploy, **changes)
    w.deploys.append((w.now, w.deploy))
    w.deploy.activate()
    w.log("deployer", f"deploys ({w.deploy.describe()})")


def settle_and_check(w: World) -> None:
    """Leases lapse, recovery and workers finish what they can; then every invariant."""
    quiet_phase(w)
    check_all(w)
