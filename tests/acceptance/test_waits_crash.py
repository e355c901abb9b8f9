"""SIGKILL around a wait: a driver killed while the run waits (its question journaled, the
run not yet paused), an answerer killed after its answer was journaled but before the run
was handed over, and a driver killed after the answer reached the tool but before the tool's
result. Each time a fresh process goes on; side effects are counted outside the journal."""

from __future__ import annotations

import json

import pytest

from durable_agents.database.store import site_store
from durable_agents.engine import names
from durable_agents.models import ActionLog, Run
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import run_module

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ASK, SHIP = "call_1_1", "call_2_1"


def drive(run_id: str, text: str | None = None, **env: str) -> tuple[int, dict | None]:
    args = ["tests.support.drive", "waiting", run_id] + ([text] if text else [])
    code, out = run_module(*args, **env)
    return code, json.loads(out) if out else None


def answer(run_id: str, value: str, by: str, **env: str) -> tuple[int, dict | None]:
    code, out = run_module(
        "tests.support.answer", run_id, "warehouse", json.dumps(value), by, **env
    )
    return code, json.loads(out) if out else None


def _journaled_once(run_id: str, value: str) -> None:
    store = site_store()
    rec = store.get(run_id, names.interrupt_answer("warehouse"))
    assert rec is not None and json.loads(rec.data)["value"] == value
    assert json.loads(store.get(run_id, names.tool(ASK)).data)["result"] == value
    assert list(ActionLog.objects.filter(run_id=run_id).values_list("action", flat=True)) == [
        "answer"
    ]


def test_a_driver_killed_while_the_run_waits():
    make_user("boss", "approve_toolcall")
    code, _ = drive("w-1", "ship o-7", DURABLE_AGENTS_CRASH_AT="after-wait:warehouse")
    assert code == -9
    assert site_store().get("w-1", names.wait("warehouse")) is not None
    assert Run.objects.get(run_id="w-1").status == "running"  # its driver died mid-pause
    # The answer queues the run (its driver is dead, not paused) and a new process drives.
    assert answer("w-1", "HAM", "boss")[1] == {"recorded": True, "value": "HAM"}
    assert Run.objects.get(run_id="w-1").status in ("queued", "running", "finished")
    assert drive("w-1")[1] == {"status": "finished", "answer": "shipped"}
    assert count_effects("w-1")[SHIP] == 1
    _journaled_once("w-1", "HAM")


def test_an_answer_killed_before_the_hand_over_is_finished_by_answering_again():
    make_user("boss", "approve_toolcall")
    assert drive("w-2", "ship o-7")[1] == {"status": "awaiting_input", "waits": ["warehouse"]}
    code, _ = answer("w-2", "HAM", "boss", DURABLE_AGENTS_CRASH_AT="after-answer:warehouse")
    assert code == -9
    # Journaled, but the run was never queued: it still shows as waiting...
    assert site_store().get("w-2", names.interrupt_answer("warehouse")) is not None
    assert Run.objects.get(run_id="w-2").status == "awaiting_input"
    # ...until the same answer again (a person pressing the button twice) hands it over.
    assert answer("w-2", "HAM", "boss")[1] == {"recorded": False, "value": "HAM"}
    assert drive("w-2")[1] == {"status": "finished", "answer": "shipped"}
    assert count_effects("w-2")[SHIP] == 1
    _journaled_once("w-2", "HAM")


def test_an_answer_killed_before_the_hand_over_is_handed_over_by_the_sweep():
    """Issue 17: nobody answers again; the periodic sweep (``wake_timers``, on beat) sees a
    run awaiting input whose question is answered and hands it over, once."""
    from durable_agents.engine.commands.timers import wake_timers

    make_user("boss", "approve_toolcall")
    assert drive("w-4", "ship o-7")[1] == {"status": "awaiting_input", "waits": ["warehouse"]}
    assert wake_timers() == [], "nothing answered yet"
    code, _ = answer("w-4", "HAM", "boss", DURABLE_AGENTS_CRASH_AT="after-answer:warehouse")
    assert code == -9
    assert Run.objects.get(run_id="w-4").status == "awaiting_input"
    assert wake_timers() == ["w-4"]  # handed over (driven inline here)
    assert Run.objects.get(run_id="w-4").status == "finished"
    assert wake_timers() == []
    assert count_effects("w-4")[SHIP] == 1
    _journaled_once("w-4", "HAM")


def test_a_driver_killed_after_the_answer_before_the_tool_result():
    make_user("boss", "approve_toolcall")
    assert drive("w-3", "ship o-7")[1] == {"status": "awaiting_input", "waits": ["warehouse"]}
    # The answer hands the run to a driver in the answering process (inline dispatch),
    # which is killed inside the tool, after the answer reached it.
    code, _ = answer("w-3", "HAM", "boss", DA_CRASH_AFTER_ANSWER=ASK)
    assert code == -9
    assert site_store().get("w-3", names.interrupt_answer("warehouse")) is not None
    assert site_store().get("w-3", names.tool(ASK)) is None
    assert drive("w-3")[1] == {"status": "finished", "answer": "shipped"}
    assert count_effects("w-3") == {ASK: 3, SHIP: 1}  # asked, killed, re-run: once shipped
    _journaled_once("w-3", "HAM")
