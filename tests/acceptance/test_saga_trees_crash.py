"""A saga spanning a sub-agent, across SIGKILL (issue 16): the trip books a flight, its
sub-run books a hotel and a car, the card is declined; the car, the hotel (in the sub-run's
own journal, under its own lease) and the flight are undone, each once, whichever process
dies where in the nested rollback. Killed inside the sub-run's undo, the tree halts for a
person and the undo is never run again. Effects and undos are counted outside the journal
(``test_effects``)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.simulation.invariants import saga_violations
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import run_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]

# The trip's own effects (the flight, the declined charge) and the sub-run's (hotel, car).
TRIP_DONE = {"call_1_1": 1, "call_3_1": 1}
CHILD_DONE = {"call_1_1": 1, "call_2_1": 1}
TRIP_UNDONE = {"compensate:call_1_1": 1}
CHILD_UNDONE = {"compensate:call_2_1": 1, "compensate:call_1_1": 1}


def drive(run_id: str, **env: str) -> tuple[int, dict | None]:
    return run_json("tests.support.drive", "saga-tree", run_id, "go", **env)


def names(run_id: str) -> list[str]:
    return [r.name for r in Journal(DjangoStore()).records(run_id)]


def assert_compensated(run_id: str, out: dict | None) -> None:
    child = f"{run_id}/call_2_1"
    assert out == {
        "status": "compensated",
        "code": "saga.aborted",
        "undone": ["call_2_1", "call_1_1"],
    }, out
    assert count_effects(run_id) == {**TRIP_DONE, **TRIP_UNDONE}
    assert count_effects(child) == {**CHILD_DONE, **CHILD_UNDONE}
    trip, sub = names(run_id), names(child)
    # the sub-run's rollback (car, then hotel) before the trip's flight
    assert sub.index("compensate:call_2_1") < sub.index("compensate:call_1_1")
    assert trip.index("compensate:call_2_1") < trip.index("compensate:call_1_1")
    assert trip.count("model:4") == 0 and sub.count("model:3") == 1  # no forward step again
    for rid in (run_id, child):
        assert saga_violations(Journal(DjangoStore()).records(rid)) == [], rid
        row = Run.objects.get(run_id=rid)
        assert row.status == "compensated", (rid, row.status)


def test_a_saga_undoes_its_sub_runs_bookings_then_its_own():
    code, out = drive("tree-plain")
    assert code == 0
    assert_compensated("tree-plain", out)


@pytest.mark.parametrize(
    "point",
    [
        "after-saga-abort",
        "after-subrun-abort:{run}/call_2_1",
        "after-compensate:call_2_1",  # the sub-run's car undo recorded (it rolls back first)
        "after-compensated:{run}/call_2_1",  # the sub-run ended; the trip has not recorded it
    ],
)
def test_sigkill_anywhere_in_the_nested_rollback_resumes_it(point):
    run_id = "tree-kill-" + point.split(":")[0]
    assert drive(run_id, DURABLE_AGENTS_CRASH_AT=point.format(run=run_id))[0] == -9
    assert Run.objects.get(run_id=run_id).status == "compensating"
    _, out = drive(run_id)
    assert_compensated(run_id, out)


def test_sigkill_inside_a_sub_runs_undo_halts_the_tree_and_never_undoes_twice():
    run_id = "tree-kill-inside"
    child = f"{run_id}/call_2_1"
    assert drive(run_id, DA_CRASH_INSIDE="compensate:call_2_1")[0] == -9
    assert count_effects(child) == {**CHILD_DONE, "compensate:call_2_1": 1}
    for _ in range(2):
        _, out = drive(run_id)
        assert out == {"status": "halted", "halts": ["compensate:call_2_1"]}, out
    assert count_effects(child) == {**CHILD_DONE, "compensate:call_2_1": 1}
    assert count_effects(run_id) == TRIP_DONE  # the flight waits: nothing undone out of order
    assert Run.objects.get(run_id=run_id).status == "halted"
    assert Run.objects.get(run_id=child).status == "halted"
    da.resolve_halt(  # the test settings dispatch inline: the sub-run, then the trip, go on
        child,
        "compensate:call_2_1",
        {"cancelled": "C-LIS"},
        evidence={"rental": "cancelled by phone"},
        by=make_user("tree-staff", "resolve_halt"),
    )
    assert Run.objects.get(run_id=child).status == "compensated"
    assert Run.objects.get(run_id=run_id).status == "compensated"
    assert count_effects(child) == {**CHILD_DONE, **CHILD_UNDONE}
    assert count_effects(run_id) == {**TRIP_DONE, **TRIP_UNDONE}
