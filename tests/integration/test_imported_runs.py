"""An inert import is evidence on every path (docs/replay.md, "Imports"): no engine command,
API view, admin page, management command, Celery task, recovery pass or sweep drives it,
decides it, answers, signals, wakes, resolves, cancels or forks it, and no list of work
shows it. Each run here waited on a person when it was exported: an approval, a question,
a halt."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.commands.halts import resolve_halt
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.runs import cancel, hand_over
from durable_agents.engine.commands.timers import wake_timer, wake_timers
from durable_agents.engine.commands.waits import answer_interrupt, enqueue, signal
from durable_agents.engine.errors import RunImported
from durable_agents.models import ActionLog, ApprovalRequest, Halt, JournalEntry, Run
from durable_agents.tasks import drive_run
from durable_agents.transfer import export_lines, import_lines
from tests.support.admin_pages import client_for, text_of
from tests.support.agents import echo, gated
from tests.support.api import as_session, error
from tests.support.inbox_agents import asks_staff, unsure_transfer
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BOSS = ("approve_toolcall", "resolve_halt", "cancel_run", "fork_run", "view_run", "import_runs")


def _reimport(run_id: str, by) -> None:
    """Export the run, forget it, and import it back (inert)."""
    text = list(export_lines(run_id))
    Run.objects.filter(run_id=run_id).delete()
    ActionLog.objects.filter(run_id=run_id).delete()
    import_lines(text, by=by)
    assert Run.objects.get(run_id=run_id).imported == "inert"


@pytest.fixture
def boss():
    return make_user("boss", *BOSS)


@pytest.fixture
def inert(boss):
    with pytest.raises(da.ApprovalPending):
        gated.run("ir-wait", "refund order 7")
    with pytest.raises(da.InterruptPending):
        asks_staff.run("ir-ask", "refund o-9")
    with pytest.raises(da.OutcomeUnknown):
        unsure_transfer.run("ir-halt", "move 42")
    for run_id in ("ir-wait", "ir-ask", "ir-halt"):
        _reimport(run_id, boss)
    return {
        "call": ApprovalRequest.objects.get(run_id="ir-wait").call_id,
        "halt": Halt.objects.get(run_id="ir-halt").op_id,
    }


def _written() -> tuple[int, int]:
    return JournalEntry.objects.count(), ActionLog.objects.count()


def test_no_engine_command_acts_on_an_inert_import(inert, boss):
    before = _written()
    refusals = {
        "approve": lambda: da.approve("ir-wait", inert["call"], approved=True, by=boss),
        "deny": lambda: da.approve("ir-wait", inert["call"], approved=False, by=boss),
        "answer": lambda: answer_interrupt("ir-ask", "exception", "grant", by=boss),
        "signal": lambda: signal("ir-wait", "payment", {"paid": True}),
        "enqueue": lambda: enqueue("ir-wait", "inbox", "k1", {"n": 1}),
        "wake": lambda: wake_timer("ir-wait", "cool-off", by=boss),
        "resolve": lambda: resolve_halt("ir-halt", inert["halt"], {"ok": True}, by=boss),
        "cancel": lambda: cancel("ir-wait", by=boss),
        "hand over": lambda: hand_over("ir-wait", by=boss),
        "resume": lambda: da.resume("ir-wait"),
        "drive": lambda: gated.run("ir-wait", "refund order 7"),
        "start": lambda: gated.start("refund order 7", run_id="ir-wait"),
        "fork": lambda: da.fork("ir-wait", from_step=1, patch=da.Patch()),
    }
    for what, call in refusals.items():
        with pytest.raises(RunImported) as refused:
            call()
        assert refused.value.code == "run.imported", what
        assert "imported as evidence" in str(refused.value), what
    assert _written() == before, "a refusal writes nothing"
    assert Run.objects.get(run_id="ir-wait").status == "awaiting_approval"
    # Reading stays open: replay calls no model and no tool.
    assert da.replay("ir-wait").identical


def test_workers_recovery_and_sweeps_leave_an_inert_import_alone(inert):
    before = _written()
    assert drive_run("ir-wait") == "imported"  # the Celery task, run in this process
    assert recover(interval=0) == []
    assert wake_timers() == []
    store = site_store()
    assert not {"ir-wait", "ir-ask", "ir-halt"} & {r.run_id for r in store.list_unfinished()}
    assert not store.list_approval_requests() and not store.list_halts()
    assert store.list_approval_requests(run_id="ir-wait")  # its own rows, read by its id
    assert not {"ir-wait", "ir-ask", "ir-halt"} & {r.run_id for r in da.pending()}
    out = StringIO()
    call_command("durable_agents", "runs", stdout=out)
    assert "ir-" not in out.getvalue()
    assert _written() == before


def test_the_management_command_refuses_to_act_on_an_inert_import(inert, boss):
    for args in (
        ["approve", "ir-wait", inert["call"], "--by", "boss"],
        ["deny", "ir-wait", inert["call"], "--by", "boss"],
        ["cancel", "ir-wait", "--by", "boss"],
        ["resolve", "ir-halt", inert["halt"], "--result", "{}", "--by", "boss"],
    ):
        with pytest.raises(CommandError, match=r"run\.imported"):
            call_command("durable_agents", *args, stdout=StringIO())


def test_the_api_refuses_and_does_not_list_an_inert_import(inert, boss):
    api = as_session(boss)
    call = inert["call"]
    error(api.post(f"/runs/ir-wait/approvals/{call}", {"approved": True}), 409, "run.imported")
    error(api.post("/runs/ir-wait/resume"), 409, "run.imported")
    error(api.post("/runs/ir-wait/cancel", {}), 409, "run.imported")
    error(api.post("/runs/ir-wait/signals/payment", {"payload": 1}), 409, "run.imported")
    error(
        api.post("/runs/ir-ask/interrupts/exception/answer", {"value": "grant"}),
        409,
        "run.imported",
    )
    error(
        api.post(f"/runs/ir-halt/halts/{inert['halt']}/resolve", {"result": {}}),
        409,
        "run.imported",
    )
    assert api.get("/approvals").json()["count"] == 0
    assert api.get("/halts").json()["count"] == 0
    assert api.get("/approvals", run_id="ir-wait").json()["count"] == 1  # evidence, by id


def test_the_admin_shows_an_inert_import_read_only(inert, boss):
    client = client_for(boss)
    page = text_of(client.get("/admin/durable_agents/run/ir-wait/change/"))
    assert "Imported evidence (inert)" in page
    assert "Imported by <strong>boss</strong>" in page and "unverified" in page
    assert 'id="da-operate"' not in page and 'id="da-needed"' not in page
    # No link to a queue page to decide on.
    assert not re.search(r"/admin/durable_agents/approvalrequest/\d+/", page)
    inbox = text_of(client.get("/admin/durable_agents/inbox/"))
    assert "ir-wait" not in inbox and "ir-halt" not in inbox and "ir-ask" not in inbox
    queue = text_of(client.get("/admin/durable_agents/approvalrequest/"))
    assert "ir-wait" not in queue
    runs = text_of(client.get("/admin/durable_agents/run/"))
    assert "imported evidence" in runs
    verify = text_of(client.get("/admin/durable_agents/run/ir-wait/verify/"))
    assert "unverified" in verify and "imported; no trusted signed head" in verify
    assert "Not signed by this site" in verify
    ask = text_of(client.get("/admin/durable_agents/run/ir-ask/change/"))
    assert "Imported evidence (inert)" in ask and "da-answer" not in ask


def test_an_imported_session_transcript_takes_no_message(boss):
    session = echo.session("ir-chat")
    session.send("what about order 7")
    journal = session.journal_id
    text = list(export_lines(journal))
    Run.objects.filter(run_id=journal).delete()
    import_lines(text, by=boss)
    with pytest.raises(RunImported):
        echo.session("ir-chat").send("and order 8")
    with pytest.raises(RunImported):
        echo.session("ir-chat").fork(1)


def test_importing_needs_a_user_who_may_import(boss):
    echo.run("ir-perm", "what about order 7")
    text = list(export_lines("ir-perm"))
    Run.objects.filter(run_id="ir-perm").delete()
    before = _written()
    for by, code in (("nobody-here", "actor.unknown"), ("clerk", "actor.forbidden")):
        if by == "clerk":
            make_user("clerk", "view_run")
        out = StringIO()
        with pytest.raises(CommandError, match=code.replace(".", r"\.")):
            call_command(
                "durable_agents",
                "import",
                "--by",
                by,
                "-",
                stdin=StringIO("\n".join(text)),
                stdout=out,
            )
    assert _written() == before and not Run.objects.filter(run_id="ir-perm").exists()
    call_command("durable_agents", "import", "--by", "boss", "-", stdin=StringIO("\n".join(text)))
    [logged] = ActionLog.objects.filter(run_id="ir-perm")
    assert (logged.actor, logged.actor_id, logged.action) == ("boss", str(boss.pk), "import")
    assert json.dumps(logged.payload["runs"]) == '["ir-perm"]'
