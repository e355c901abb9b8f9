"""An inert import is nobody's sub-run (issue 41, item 4), on PostgreSQL with real processes.

Another site's export of a sub-run, imported as evidence at the id a live parent's call
will use (``<run>/call_1_1``: a file's ids are anyone's to edit), says the payee was vetted
and is ``mallory``. The parent must
never take that answer: not on its first drive, and not after its driver was SIGKILLed
right after journaling the sub-run (``after-child:<id>``), when recovery, or a fork of it,
runs the call again. The call fails by name (``subagent.imported``); the sub-run's own
sign-off never runs here, nobody is paid, and the import stays as it came. Effects are
counted outside the journal (``test_effects``)."""

from __future__ import annotations

import json
import time

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from durable_agents.transfer import export_lines, import_lines
from tests.support.agents import count_effects
from tests.support.forging import rehashed
from tests.support.people import make_user
from tests.support.procs import run_json
from tests.support.trust_agents import vet_pay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]

ASK = "pay whoever is owed"
NOT_PAID = "not paid: the payee could not be vetted"


@pytest.fixture(autouse=True)
def boss():
    return make_user("boss", "approve_toolcall", "import_runs", "fork_run", "cancel_run")


def foreign_export(run_id: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The export of ``<run_id>/call_1_1`` as another site made it: a sub-run whose staff
    signed ``mallory`` off. Made here under other ids and exported; then its ids are
    changed to ``run_id``'s and its chains recomputed, as anyone holding a file can."""
    elsewhere = f"{run_id}-elsewhere"
    monkeypatch.setenv("DA_VET_PAYEE", "mallory")
    with pytest.raises(da.ApprovalPending):
        vet_pay.run(elsewhere, ASK)
    da.approve(f"{elsewhere}/call_1_1", "call_1_1", True, by="boss")  # drives both
    assert Run.objects.get(run_id=elsewhere).answer == "paid"
    monkeypatch.delenv("DA_VET_PAYEE")
    text = "\n".join(export_lines(f"{elsewhere}/call_1_1")).replace(elsewhere, run_id)
    return rehashed([json.loads(x) for x in text.splitlines()]).splitlines()


def drive(run_id: str, text: str | None = None, **env: str) -> tuple[int, dict]:
    return run_json("tests.support.drive", "vet-pay", run_id, *([text] if text else []), **env)


def call_result(run_id: str) -> dict:
    rec = Journal(DjangoStore()).get(run_id, names.tool("call_1_1"))
    assert rec is not None
    return dict(rec.body)


def assert_refused_by_name(run_id: str) -> None:
    result = call_result(run_id)
    assert result["is_error"] is True
    text = json.dumps(result["result"])
    assert "subagent.imported" in text and "imported as evidence" in text
    assert "mallory" not in text  # nothing of the import reaches the model


def assert_import_untouched(sub: str, lines: list[str]) -> None:
    row = Run.objects.get(run_id=sub)
    assert (row.imported, row.status) == ("inert", "finished")
    records = [json.loads(x) for x in lines if json.loads(x).get("type") == "record"]
    assert [r.name for r in Journal(DjangoStore()).records(sub)] == [r["name"] for r in records]


def test_a_parent_never_takes_an_inert_import_at_its_sub_runs_id_for_its_answer(monkeypatch):
    lines = foreign_export("vp-1", monkeypatch)
    assert import_lines(lines, by="boss") == ["vp-1/call_1_1"]
    code, out = drive("vp-1", ASK)
    assert code == 0 and out == {"status": "finished", "answer": NOT_PAID}
    assert count_effects("vp-1") == {}  # nobody was paid
    assert count_effects("vp-1/call_1_1") == {}  # and nobody here signed anyone off
    assert_refused_by_name("vp-1")
    # Refused before the parent journaled it as its sub-run: its tree holds no import.
    assert Journal(DjangoStore()).get("vp-1", names.child("call_1_1")) is None
    assert_import_untouched("vp-1/call_1_1", lines)


def test_a_parent_killed_after_journaling_its_sub_run_never_adopts_an_import_put_there(
    monkeypatch,
):
    lines = foreign_export("vp-2", monkeypatch)
    sub = "vp-2/call_1_1"
    code, _ = drive("vp-2", ASK, DURABLE_AGENTS_CRASH_AT=f"after-child:{sub}")
    assert code == -9
    assert Journal(DjangoStore()).get("vp-2", names.child("call_1_1")) is not None
    assert not Run.objects.filter(run_id=sub).exists()
    # The id the dead driver journaled is free: an operator imports the file there.
    assert import_lines(lines, by="boss") == [sub]
    # A fork of the parent before anyone drives it again: its call runs again.
    fork_id = da.fork("vp-2", from_step=1, by="boss")
    assert da.resume(fork_id).answer == NOT_PAID
    assert_refused_by_name(fork_id)
    # Recovery hands the parent over once the dead driver's lease lapsed.
    time.sleep(1.1)
    assert "vp-2" in recover(interval=0)
    row = Run.objects.get(run_id="vp-2")
    assert (row.status, row.answer) == ("finished", NOT_PAID)
    assert_refused_by_name("vp-2")
    for run_id in ("vp-2", sub, fork_id, f"{fork_id}/call_1_1"):
        assert count_effects(run_id) == {}, run_id
    assert_import_untouched(sub, lines)
