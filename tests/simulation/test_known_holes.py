"""Holes 1 and 2 of issue 10, kept as tests: seeds that find them when their fixes are
reverted, and the same schedules written out by hand.

A seed's schedule moves whenever the engine gains or loses a store call, so a seed is tied to
a version of the code: each seed test checks that its schedule still *reaches* the hole's
situation (and fails, saying so, once it does not), and that the promise holds there. The
hand-written schedules name their points and keep their meaning. docs/simulation.md gives the
exact reverts and how to find current seeds again.

Hole 1: a schema change on resume after a crash inside an at-most-once tool recorded an
invented "invalid arguments" error, and the model charged again. Hole 2: a fork of a run
whose call was in flight ran the call again (and under a new idempotency key)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.agent import get_agent
from durable_agents.engine.journal import Journal

from .actors import Driver, Person, drive_like_a_worker
from .agent import AGENT, KEYED, Deploy
from .directed import deploy, directed_world, run, settle_and_check
from .invariants import _in_flight
from .runner import replay_command
from .scenario import simulate
from .world import Config, World

# Seeds that broke the promise as hole 1 / hole 2 on this engine with that fix reverted
# (docs/simulation.md, "Holes 1 and 2, reverted"), and keep it with the fix. Hole 2: a call
# kept by a fork run again by the fork (seed 236: a notify, under a new key).
HOLE_1_SEEDS = (5, 271, 419)
HOLE_2_SEEDS = (70, 194, 236, 518)


def reaches_hole_1(w: World) -> bool:
    """A drive met a charge whose outcome was unknown (it halted on it: the fixed engine's
    answer) while the code deployed would refuse the arguments it was claimed with: a new
    required ``currency`` it lacks (or one it has that is gone again), or no charge tool.
    (The process that claimed the call may have run older code than was deployed by then:
    a process keeps the code it started with.)"""
    for halt in w.raw.list_halts(status=None):
        if halt.tool_name != "charge" or halt.attempted_at is None or halt.created_at is None:
            continue
        claimed, met = halt.attempted_at.timestamp(), halt.created_at.timestamp()
        active = [Deploy()]
        for t, version in w.deploys:
            if t <= claimed:
                active = [version]
            elif t <= met:
                active.append(version)
        arguments = halt.arguments if isinstance(halt.arguments, dict) else {}
        if any(v.no_charge or v.currency != ("currency" in arguments) for v in active):
            return True
    # The same situation met by an engine without the fix: an error result for a charge
    # that had been claimed, saying its arguments no longer fit or its tool is gone.
    for run_id in w.runs:
        names = {r.name: r for r in Journal(w.raw).records(run_id)}
        for name, record in names.items():
            error = str((record.get("result") or {}) if name.startswith("tool:") else "")
            claimed = f"attempt:{name[5:]}:1" in names
            if claimed and ("invalid arguments for charge" in error or "unknown tool" in error):
                return True
    return False


def reaches_hole_2(w: World) -> bool:
    """A fork was made while a call it kept was in flight in its source (an attempt and no
    result), or a keyed call ran in a run and in a fork of it."""
    for fork_id, snapshot in w.fork_snapshots.items():
        calls = {e.name.split(":")[1] for e in snapshot if e.name.startswith("attempt:")}
        record = w.raw.get(fork_id, "fork")
        if record is not None and any(_in_flight(snapshot, c) for c in calls):
            return True
    runs_by_call: dict[str, set[str]] = {}
    for e in w.ledger:
        if e.tool in KEYED:
            runs_by_call.setdefault(e.call, set()).add(e.run)
    return any(len(runs) > 1 for runs in runs_by_call.values())


# The seeds were found before waits existed: without the answerer they draw what they drew
# (and without what came after: the targeted adversaries and the hunter's faults).
BEFORE_WAITS = frozenset(
    {"client", "driver", "recovery", "person", "deployer", "webhook", "stepper"}
)
BEFORE_HUNT = frozenset({"crash", "stall", "split"})


def _assert_reaches_and_holds(seed: int, reaches, hole: str) -> None:
    world = simulate(Config(seed, actors=BEFORE_WAITS, faults=BEFORE_HUNT))
    if not reaches(world):
        pytest.fail(
            f"seed {seed} no longer reaches hole {hole}'s situation: the engine's store calls "
            "changed its schedule. Find current seeds with the fix reverted "
            "(docs/simulation.md, 'Holes 1 and 2, reverted') and update this file.",
            pytrace=False,
        )
    if world.violations:
        pytest.fail(
            "\n".join(str(v) for v in world.violations)
            + "\nreplay: "
            + replay_command(world.config),
            pytrace=False,
        )


@pytest.mark.parametrize("seed", HOLE_1_SEEDS)
def test_seeds_of_hole_1_reach_it_and_keep_the_promise(seed):
    _assert_reaches_and_holds(seed, reaches_hole_1, "1")


@pytest.mark.parametrize("seed", HOLE_2_SEEDS)
def test_seeds_of_hole_2_reach_it_and_keep_the_promise(seed):
    _assert_reaches_and_holds(seed, reaches_hole_2, "2")


def _assert_no_violations(w):
    if w.violations:
        pytest.fail("\n".join(w.format_trace() + [str(v) for v in w.violations]), pytrace=False)


def _crash_inside_the_charge(w):
    client, driver = Driver("client"), Driver("driver1")
    run(
        w,
        client,
        "start r1",
        lambda: get_agent(AGENT).start("plan:charge.1.20", run_id="r1", store=w.store),
    )
    w.queue.clear()
    proc = run(
        w, driver, "drive r1", lambda: drive_like_a_worker(w, "r1"), until="tool charge * done"
    )
    w.crash(proc)  # the money moved; the result was never recorded
    w.queue.clear()
    return driver


def test_a_deploy_between_crash_and_resume_does_not_charge_twice():
    """Hole 1: the charge ran, its process died, the next deploy made ``currency``
    required. Resuming must halt on the live attempt, not record 'invalid arguments'."""
    with directed_world() as w:
        driver = _crash_inside_the_charge(w)
        deploy(w, currency=True)
        w.advance_by(2 * w.config.ttl + 1)
        run(w, driver, "drive r1", lambda: drive_like_a_worker(w, "r1"))
        settle_and_check(w)
        _assert_no_violations(w)
        assert sum(e.effect for e in w.ledger if e.tool == "charge") == 1


def test_a_fork_of_a_run_with_a_call_in_flight_does_not_run_it_again():
    """Hole 2: the charge ran, its process died, a person forked the run at the step that
    asked for it. The fork must halt on the call too, not charge again."""
    with directed_world() as w:
        driver = _crash_inside_the_charge(w)
        w.advance_by(2 * w.config.ttl + 1)
        person = Person("ann", forks=1, cancels=0)
        label, op = person._fork(w, "r1", step=1, patch=da.Patch())
        fork_id = run(w, person, label, op).result
        w.queue.clear()
        run(w, driver, f"drive {fork_id}", lambda: drive_like_a_worker(w, fork_id))
        settle_and_check(w)
        _assert_no_violations(w)
        assert sum(e.effect for e in w.ledger if e.tool == "charge") == 1
