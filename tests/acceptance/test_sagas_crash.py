"""Sagas across SIGKILL (issue 16): a saga whose third step fails undoes the two before,
latest first, each once, whatever process dies where: right after the abort, between the
two undos, inside an undo (which then halts for a person, never undoes twice). Effects and
undos are counted outside the journal (``test_effects``)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import run_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DONE = {"call_1_1": 1, "call_2_1": 1, "call_3_1": 1}
UNDONE = {"compensate:call_2_1": 1, "compensate:call_1_1": 1}


def drive(run_id: str, **env: str) -> tuple[int, dict | None]:
    return run_json("tests.support.drive", "saga-trip", run_id, "go", **env)


def names(run_id: str) -> list[str]:
    return [r.name for r in Journal(DjangoStore()).records(run_id)]


def assert_compensated(run_id: str, out: dict | None) -> None:
    assert out == {
        "status": "compensated",
        "code": "saga.aborted",
        "undone": ["call_2_1", "call_1_1"],
    }, out
    assert count_effects(run_id) == {**DONE, **UNDONE}
    journal = names(run_id)
    assert journal.index("saga:abort") < journal.index("compensate:call_2_1")
    assert journal.index("compensate:call_2_1") < journal.index("compensate:call_1_1")
    assert journal.count("model:4") == 0  # never the forward path after the abort
    row = Run.objects.get(run_id=run_id)
    assert (row.status, row.last_error["code"]) == ("compensated", "saga.aborted")


@pytest.mark.timeout(120)
def test_a_saga_undoes_its_two_bookings_in_reverse_order():
    code, out = drive("saga-plain")
    assert code == 0
    assert_compensated("saga-plain", out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "point", ["after-saga-abort", "after-compensate:call_2_1", "after-attempt:compensate:call_1_1"]
)
def test_sigkill_during_the_rollback_resumes_the_rollback(point):
    run_id = f"saga-kill-{point.replace(':', '-')}"
    assert drive(run_id, DURABLE_AGENTS_CRASH_AT=point)[0] == -9
    assert Run.objects.get(run_id=run_id).status == "compensating"
    _, out = drive(run_id)
    if point.startswith("after-attempt"):
        # killed with the undo claimed and not run: its outcome is a person's to record
        assert out == {"status": "halted", "halts": ["compensate:call_1_1"]}, out
        assert count_effects(run_id).get("compensate:call_1_1") is None
        da.resolve_halt(
            run_id,
            "compensate:call_1_1",
            {"cancelled": "F-LIS"},
            evidence={"airline": "cancelled by hand"},
            by=_staff(),
        )
        row = Run.objects.get(run_id=run_id)
        assert row.status == "compensated", row.status
        assert count_effects(run_id) == {**DONE, "compensate:call_2_1": 1}
        return
    assert_compensated(run_id, out)


@pytest.mark.timeout(120)
def test_sigkill_inside_an_undo_halts_and_never_undoes_twice():
    run_id = "saga-kill-inside"
    assert drive(run_id, DA_CRASH_INSIDE="compensate:call_2_1")[0] == -9
    assert count_effects(run_id) == {**DONE, "compensate:call_2_1": 1}
    for _ in range(2):
        _, out = drive(run_id)
        assert out == {"status": "halted", "halts": ["compensate:call_2_1"]}, out
    assert count_effects(run_id) == {**DONE, "compensate:call_2_1": 1}
    da.resolve_halt(
        run_id,
        "compensate:call_2_1",
        {"cancelled": "H-LIS"},
        evidence={"hotel": "booking H-LIS cancelled"},
        by=_staff(),
    )
    assert Run.objects.get(run_id=run_id).status == "compensated"
    assert count_effects(run_id) == {**DONE, **UNDONE}


def _staff():
    return make_user("saga-staff", "resolve_halt")


@pytest.mark.timeout(120)
def test_sigkill_right_after_a_saga_aborted_by_itself_leaves_nothing_to_approve():
    """The charge awaits approval when a deploy (``on_drift="error"``) makes the saga abort by
    itself; its driver is killed right after journaling the abort. A decision now is refused
    as orphaned (the request withdrawn, the run left rolling back); the resumed rollback
    undoes both bookings once and the card is never charged."""
    run_id = "saga-kill-gated"
    drive_gated = ("tests.support.drive", "saga-gated", run_id, "go")
    assert run_json(*drive_gated)[1] == {"status": "awaiting_approval", "calls": ["call_3_1"]}
    v2 = {"DA_SAGA_GATED_V2": "1"}
    assert run_json(*drive_gated, DURABLE_AGENTS_CRASH_AT="after-saga-abort", **v2)[0] == -9
    store = DjangoStore()
    assert Run.objects.get(run_id=run_id).status == "compensating"
    with pytest.raises(da.ApprovalOrphaned):
        da.approve(run_id, "call_3_1", True, by=make_user("saga-approver", superuser=True))
    assert store.get_approval_request(run_id, "call_3_1").status == "withdrawn"
    assert Run.objects.get(run_id=run_id).status == "compensating"
    _, out = run_json(*drive_gated, **v2)
    assert out == {
        "status": "compensated",
        "code": "saga.aborted",
        "undone": ["call_2_1", "call_1_1"],
    }
    assert count_effects(run_id) == {"call_1_1": 1, "call_2_1": 1, **UNDONE}
    assert "approval:call_3_1" not in names(run_id)
