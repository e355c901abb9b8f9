"""Holes the simulator found in issue 10, kept as tests: the seeds that first showed them,
and the same schedules written out by hand (a seed's schedule moves when the engine's
store calls change; a hand-written one does not).

They fail until the fixes land: hole 1 (a schema change on resume after a crash inside an
at-most-once tool records an invented error, and the model charges again) and hole 2 (a
fork of a run whose call is in flight runs the call again)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.agent import get_agent

from .actors import Driver, Person, drive_like_a_worker
from .agent import AGENT
from .directed import deploy, directed_world, run, settle_and_check
from .runner import replay_command
from .scenario import simulate
from .world import Config

HOLE_1_SEEDS = (70, 158, 175)  # on the engine of commit 68165b7
HOLE_2_SEEDS = (44, 123, 8)  # in-flight charges (44, 123), a notify under a new key (8)


def _assert_holds(seed: int, invariants: set[str], hole: str) -> None:
    world = simulate(Config(seed))
    found = [v for v in world.violations if v.invariant in invariants and v.hole == hole]
    if found:
        pytest.fail(
            "\n".join(str(v) for v in found) + "\nreplay: " + replay_command(world.config),
            pytrace=False,
        )


@pytest.mark.parametrize("seed", HOLE_1_SEEDS)
def test_seeds_of_hole_1_keep_the_promise(seed):
    _assert_holds(seed, {"effects_once", "results_true"}, "1")


@pytest.mark.parametrize("seed", HOLE_2_SEEDS)
def test_seeds_of_hole_2_keep_the_promise(seed):
    _assert_holds(seed, {"effects_once"}, "2")


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
