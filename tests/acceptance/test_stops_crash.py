"""Work that spans runs is durable work (issue 29), on PostgreSQL with real processes: a
cancel killed (SIGKILL) between its own record and its sub-runs', a rollback killed midway,
a sub-run busy in another process when its root is cancelled or aborted, an answer given to
a question the tool no longer asks, an undo of an edited call. Effects are counted outside
the journal (``test_effects``); each test fails on the engine before the change."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.models import ApprovalRequest, Run
from tests.simulation.invariants import saga_violations
from tests.support.agents import count_effects, effects_connection
from tests.support.people import make_user
from tests.support.procs import ROOT, run_json, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]

CALL = "call_1_1"


@pytest.fixture(autouse=True)
def ann():
    return make_user("ann", "cancel_run", "approve_toolcall", "resolve_halt")


def drive(agent: str, run_id: str, text: str | None = None, **env: str) -> tuple[int, dict]:
    return run_json("tests.support.drive", agent, run_id, *([text] if text else []), **env)


def child(*args: str, **env: str) -> tuple[int, dict]:
    return run_json("tests.support.tree_child", *args, **env)


def status(run_id: str) -> str:
    return Run.objects.get(run_id=run_id).status


def keys(run_id: str) -> list[tuple[str, str]]:
    with effects_connection() as conn:
        rows = conn.execute(
            "SELECT tool, key FROM test_effects WHERE run_id = %s ORDER BY id", [run_id]
        ).fetchall()
    return [(tool, key) for tool, key in rows]


def journal(run_id: str) -> list[str]:
    return [r.name for r in Journal(DjangoStore()).records(run_id)]


# -- 1. a cancel cascade killed halfway ---------------------------------------------------


def gated_tree(run_id: str) -> tuple[str, str]:
    """``gtree-root`` -> middle -> leaf, whose ``wire_money`` awaits approval."""
    middle, leaf = f"{run_id}/{CALL}", f"{run_id}/{CALL}/{CALL}"
    assert drive("gtree-root", run_id, "go")[1]["status"] == "awaiting_approval"
    return middle, leaf


def test_a_cancel_killed_after_its_record_leaves_no_sub_run_whose_approval_fires():
    middle, leaf = gated_tree("cc-1")
    assert child("cancel", "cc-1", DURABLE_AGENTS_CRASH_AT="after-cancel:cc-1")[0] == -9
    assert status("cc-1") == "cancelled"
    assert (status(middle), status(leaf)) == ("awaiting_approval", "awaiting_approval")
    # Approving the leaf's wire (another process) is refused: nothing new starts under a
    # cancelled root; its drive records the leaf's own cancel, which hands the middle over.
    assert child("approve", leaf, CALL)[1] == {"status": "refused", "code": "approval.orphaned"}
    assert count_effects(leaf) == {}
    assert (status(middle), status(leaf)) == ("cancelled", "cancelled")
    cause = Journal(DjangoStore()).get(leaf, names.RUN_CANCELLED).get("cause")
    assert cause == {"code": "run.ancestor_cancelled", "run_id": "cc-1"}
    assert ApprovalRequest.objects.get(run_id=leaf).status == "withdrawn"


def test_the_sweep_finishes_a_cancel_killed_after_its_record():
    middle, leaf = gated_tree("cc-2")
    assert child("cancel", "cc-2", DURABLE_AGENTS_CRASH_AT="after-cancel:cc-2")[0] == -9
    time.sleep(1.1)  # the killed canceller's lease on the root lapses (1 s in its process)
    woken = wake_timers()
    assert set(woken) >= {leaf}
    assert (status(middle), status(leaf)) == ("cancelled", "cancelled")
    assert not ApprovalRequest.objects.filter(status="pending").exists()
    assert wake_timers() == []
    assert count_effects(leaf) == {}


# -- 2. an answer for a question nobody was shown -------------------------------------------


def test_a_yes_to_100_cents_never_refunds_5000_after_a_crash():
    assert drive("ask-refund", "aq-1", "go")[1] == {
        "status": "awaiting_input",
        "waits": ["confirm"],
    }
    # Staff answer what they were shown; the process dies before handing the run over.
    code, _ = child(
        "answer",
        "aq-1",
        "confirm",
        "yes",
        "Refund 100 cents on o-7?",
        DURABLE_AGENTS_CRASH_AT="after-answer:confirm",
    )
    assert code == -9
    # A deploy since: the tool now works out 5000 cents owed, and asks about that.
    assert drive("ask-refund", "aq-1", DA_OWED="5000")[1]["status"] == "awaiting_input"
    assert count_effects("aq-1") == {}
    [listed] = [p for p in da.pending() if p.run_id == "aq-1"]
    assert [w.prompt for w in listed.waits] == ["Refund 5000 cents on o-7?"]
    # The page shown before is refused; an answer to the new question counts.
    stale = child("answer", "aq-1", "confirm", "yes", "Refund 100 cents on o-7?", DA_OWED="5000")
    assert stale[1] == {"status": "refused", "code": "interrupt.question_changed"}
    fresh = child("answer", "aq-1", "confirm", "yes", "Refund 5000 cents on o-7?", DA_OWED="5000")
    assert fresh[1] == {"status": "recorded"}
    assert status("aq-1") == "finished"
    assert keys("aq-1") == [("refund_5000", keys("aq-1")[0][1])]


# -- 3. a rollback killed midway ---------------------------------------------------------


@pytest.mark.parametrize("point", ["after-saga-abort", "after-compensate:call_2_1"])
def test_recovery_finishes_a_rollback_killed_midway(point):
    run_id = "rb-" + point.split(":")[0]
    assert drive("saga-trip", run_id, "go", DURABLE_AGENTS_CRASH_AT=point)[0] == -9
    assert status(run_id) == "compensating"
    time.sleep(1.1)  # the killed driver's lease lapses
    assert recover(interval=0) == [run_id]
    assert status(run_id) == "compensated"
    assert count_effects(run_id) == {
        "call_1_1": 1,
        "call_2_1": 1,
        "call_3_1": 1,
        "compensate:call_2_1": 1,
        "compensate:call_1_1": 1,
    }
    assert saga_violations(Journal(DjangoStore()).records(run_id)) == []
    assert recover(interval=0) == []


# -- 4. a sub-run busy when its root is aborted or cancelled ------------------------------


def approve_while_held(
    tmp_path: Path, run_id: str, child_run: str, then: callable
) -> subprocess.Popen[str]:
    """Approve the sub-run's car in another process, which drives it; inside the car's
    call (its effect fired), run ``then`` here; let the call finish; return the process."""
    hold = tmp_path / "hold"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.tree_child", "approve", child_run, "call_2_1"],
        cwd=ROOT,
        env=subprocess_env(DA_LEASE_TTL="5", DA_HOLD_FILE=str(hold)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not Path(f"{hold}.inside").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sub-run never got inside its call"
        time.sleep(0.05)
    then()
    Path(f"{hold}.go").write_text("go")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return proc


def test_cancel_and_compensate_stops_a_busy_sub_run_before_its_next_step(tmp_path):
    run_id, child_run = "busy-1", "busy-1/call_2_1"
    assert drive("stop-trip", run_id, "go")[1]["status"] == "awaiting_approval"
    approve_while_held(
        tmp_path,
        run_id,
        child_run,
        lambda: da.cancel(run_id, compensate=True, reason="called off", by="ann"),
    )
    # The car was in flight: it is undone with the rest; the SMS after it never went out.
    assert count_effects(child_run) == {
        "call_1_1": 1,
        "call_2_1": 1,
        "compensate:call_2_1": 1,
        "compensate:call_1_1": 1,
    }
    assert count_effects(run_id) == {"call_1_1": 1, "compensate:call_1_1": 1}
    assert (status(run_id), status(child_run)) == ("compensated", "compensated")
    assert names.model(3) not in journal(child_run)  # no step after the car
    for rid in (run_id, child_run):
        assert saga_violations(Journal(DjangoStore()).records(rid)) == [], rid


def test_a_plain_cancel_stops_a_busy_sub_run_before_it_asks_anything_new(tmp_path):
    run_id, child_run = "busy-2", "busy-2/call_2_1"
    assert drive("stop-plain", run_id, "go")[1]["status"] == "awaiting_approval"
    approve_while_held(tmp_path, run_id, child_run, lambda: da.cancel(run_id, by="ann"))
    assert count_effects(child_run) == {"call_1_1": 1, "call_2_1": 1}
    assert (status(run_id), status(child_run)) == ("cancelled", "cancelled")
    assert not ApprovalRequest.objects.filter(status="pending").exists()
    assert names.tool("call_2_1") in journal(child_run)  # the car's result is kept


# -- 5. the undo gets the arguments the call ran with -------------------------------------


def test_the_undo_of_an_edited_idempotent_call_releases_the_seat_it_booked():
    assert drive("seat-saga", "seat-1", "go")[1]["status"] == "awaiting_approval"
    # Approved with an edit: 2B is booked; the process dies right after its result.
    code, _ = child(
        "approve",
        "seat-1",
        CALL,
        '{"seat": "2B"}',
        DURABLE_AGENTS_CRASH_AT=f"after-result:{CALL}",
    )
    assert code == -9
    assert drive("seat-saga", "seat-1")[1]["status"] == "compensated"
    assert keys("seat-1") == [("book_seat", "2B"), ("release_seat", "2B")]
