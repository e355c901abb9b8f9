"""The staff admin on PostgreSQL, through Django's test client: who may do what, what each
action does to a run (through engine commands only), the journal timeline, and list pages
whose query count does not grow with the page size."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.models import (
    ActionLog,
    ApiKey,
    ApprovalRequest,
    ApproverKey,
    Decision,
    Halt,
    JournalEntry,
    Lease,
    Run,
)
from tests.support.admin_pages import client_for, messages_of, shown, text_of
from tests.support.agents import count_effects, echo, gated, halting, quorum
from tests.support.broker import broker_down
from tests.support.journals import journal
from tests.support.people import make_user
from tests.support.procs import drive_in_child

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


# -- helpers ------------------------------------------------------------------------------


def run_url(run_id: str, suffix: str = "change") -> str:
    return reverse(f"admin:durable_agents_run_{suffix}", args=[quote(run_id)])


def approval_url(req: ApprovalRequest, suffix: str = "change") -> str:
    return reverse(f"admin:durable_agents_approvalrequest_{suffix}", args=[req.pk])


def halt_url(halt: Halt, suffix: str = "change") -> str:
    return reverse(f"admin:durable_agents_halt_{suffix}", args=[halt.pk])


def waiting_for_approval(run_id: str) -> ApprovalRequest:
    gated.start("refund order 7", run_id=run_id)
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    return ApprovalRequest.objects.get(run_id=run_id)


def halted_in_process(run_id: str) -> Halt:
    halting.start("charge card 4242", run_id=run_id)
    assert Run.objects.get(run_id=run_id).status == "halted"
    return Halt.objects.get(run_id=run_id)


def queued(run_id: str, agent: str = "echo") -> None:
    DjangoStore().create_run(RunInfo(run_id=run_id, agent=agent, input="where is order 7?"))


# -- who may see the pages ----------------------------------------------------------------

CHANGELISTS = {
    "run": "durable_agents.view_run",
    "approvalrequest": "durable_agents.approve_toolcall",
    "halt": "durable_agents.resolve_halt",
    "actionlog": "durable_agents.view_actionlog",
}


@pytest.mark.parametrize("model", sorted(CHANGELISTS))
def test_changelists_need_staff_and_a_permission(model):
    url = reverse(f"admin:durable_agents_{model}_changelist")
    login = reverse("admin:login")
    anonymous = client_for(None).get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(login)
    outsider = make_user("outsider", CHANGELISTS[model], staff=False)
    assert client_for(outsider).get(url)["Location"].startswith(login)
    assert client_for(make_user("bare")).get(url).status_code == 403
    assert client_for(make_user("holder", CHANGELISTS[model])).get(url).status_code == 200
    root = make_user("root", superuser=True)
    assert client_for(root).get(url).status_code == 200


# -- the permission matrix on every action ------------------------------------------------


def _setup_action(action: str) -> dict[str, Any]:
    """A run in the state the action applies to, the URL and data to POST, the permission
    the action needs, the view permission a staff member may hold without it, and two
    checks: state untouched, state changed."""
    if action in ("approve", "deny"):
        req = waiting_for_approval(f"m-{action}")
        return {
            "page": approval_url(req),
            "url": approval_url(req, "decide"),
            "data": {"shown": shown(req), "decision": action, "note": "checked"},
            "perm": "durable_agents.approve_toolcall",
            "view": "durable_agents.view_approvalrequest",
            "button": 'id="da-decide"',
            "untouched": lambda: (
                ApprovalRequest.objects.get(pk=req.pk).status == "pending"
                and not Decision.objects.exists()
                and "approval:call_1_1" not in journal(req.run_id)
            ),
            "changed": lambda: Run.objects.get(run_id=req.run_id).status == "finished",
        }
    if action == "resolve":
        halt = halted_in_process("m-resolve")
        return {
            "page": halt_url(halt),
            "url": halt_url(halt, "resolve"),
            "data": {"result": '{"charged": false}', "is_error": "on"},
            "perm": "durable_agents.resolve_halt",
            "view": "durable_agents.view_halt",
            "button": 'id="da-resolve"',
            "untouched": lambda: (
                Halt.objects.get(pk=halt.pk).status == "open"
                and "tool:call_1_1" not in journal(halt.run_id)
            ),
            "changed": lambda: Run.objects.get(run_id=halt.run_id).status == "finished",
        }
    if action == "cancel":
        req = waiting_for_approval("m-cancel")
        return {
            "page": run_url(req.run_id),
            "url": run_url(req.run_id, "cancel"),
            "data": {"reason": "customer withdrew"},
            "perm": "durable_agents.cancel_run",
            "view": "durable_agents.view_run",
            "button": 'id="da-operate"',
            "untouched": lambda: Run.objects.get(run_id=req.run_id).status == "awaiting_approval",
            "changed": lambda: (
                Run.objects.get(run_id=req.run_id).status == "cancelled"
                and ApprovalRequest.objects.get(pk=req.pk).status == "withdrawn"
            ),
        }
    assert action == "resume"
    queued("m-resume")
    return {
        "page": run_url("m-resume"),
        "url": run_url("m-resume", "resume"),
        "data": {},
        "perm": "durable_agents.cancel_run",
        "view": "durable_agents.view_run",
        "button": 'id="da-operate"',
        "untouched": lambda: (
            Run.objects.get(run_id="m-resume").status == "queued"
            and not JournalEntry.objects.filter(run_id="m-resume").exists()
        ),
        "changed": lambda: Run.objects.get(run_id="m-resume").status == "finished",
    }


ACTIONS = ["approve", "deny", "resolve", "cancel", "resume"]


@pytest.mark.parametrize("who", ["anonymous", "non_staff", "staff_without", "staff_with", "root"])
@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_needs_its_permission(action, who):
    case = _setup_action(action)
    users = {
        "anonymous": None,
        "non_staff": make_user("ns", case["perm"], staff=False),
        "staff_without": make_user("viewer", case["view"]),
        "staff_with": make_user("operator", case["perm"]),
        "root": make_user("root", superuser=True),
    }
    client = client_for(users[who])
    allowed = who in ("staff_with", "root")
    if who in ("staff_without", "staff_with", "root"):
        page = client.get(case["page"])
        assert page.status_code == 200
        assert (case["button"] in page.content.decode()) == allowed
    assert not ActionLog.objects.exists()
    response = client.post(case["url"], case["data"])
    if who in ("anonymous", "non_staff"):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    elif who == "staff_without":
        assert response.status_code == 403
    else:
        assert response.status_code == 302, text_of(response)
    if allowed:
        assert case["changed"](), messages_of(response)
        log = ActionLog.objects.get(action=action)  # logged under the action's own name
        assert log.actor == users[who].get_username()
    else:
        assert case["untouched"]()
        assert not ActionLog.objects.exists()


def test_a_get_on_an_action_url_changes_nothing():
    req = waiting_for_approval("get-decide")
    client = client_for(make_user("root", superuser=True))
    assert client.get(approval_url(req, "decide")).status_code == 405
    assert client.get(run_url(req.run_id, "cancel")).status_code == 405
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    assert not ActionLog.objects.exists()


# -- approvals ----------------------------------------------------------------------------


def test_approve_in_the_admin_runs_the_call_once_and_the_run_finishes():
    req = waiting_for_approval("adm-approve")
    alice = make_user("alice", "durable_agents.approve_toolcall")
    queue = client_for(alice).get(reverse("admin:durable_agents_approvalrequest_changelist"))
    page = text_of(queue)
    assert "adm-approve" in page and "refund" in page and "0 of 1 approved" in page
    # The tool's summary above the arguments (the run's input is on the call's page).
    assert '"order_id": "7"' in page and "Refund 5.00 to order 7" in page

    response = client_for(alice).post(
        approval_url(req, "decide"),
        {"shown": shown(req), "decision": "approve", "note": "customer is right"},
    )
    assert response.status_code == 302
    assert any("approved" in m for m in messages_of(response))
    run = Run.objects.get(run_id="adm-approve")
    assert (run.status, run.answer) == ("finished", "refunded")
    assert count_effects("adm-approve") == {"call_1_1": 1}
    record = journal("adm-approve")["approval:call_1_1"]
    assert (record["approved"], record["by"], record["note"]) == (
        True,
        "alice",
        "customer is right",
    )
    assert list(ActionLog.objects.values_list("actor", "action", "target")) == [
        ("alice", "approve", "call_1_1")
    ]
    # The pending queue is empty now; "All" still lists the decided call.
    changelist = reverse("admin:durable_agents_approvalrequest_changelist")
    assert "adm-approve" not in text_of(client_for(alice).get(changelist))
    assert "adm-approve" in text_of(client_for(alice).get(changelist + "?status=all"))

    # A second, different decision is refused with a message and changes nothing.
    bob = make_user("bob", "durable_agents.approve_toolcall")
    before = journal("adm-approve")
    response = client_for(bob).post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "deny", "note": "no"}
    )
    assert response.status_code == 302
    assert any("already approved" in m for m in messages_of(response))
    assert journal("adm-approve") == before
    assert ApprovalRequest.objects.get(pk=req.pk).status == "approved"
    assert ActionLog.objects.count() == 1 and Decision.objects.count() == 1
    # The same decision again is the standing one: nothing new happens.
    response = client_for(bob).post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "approve"}
    )
    assert any("already approved; nothing changed" in m for m in messages_of(response))
    assert journal("adm-approve") == before and ActionLog.objects.count() == 1
    assert count_effects("adm-approve") == {"call_1_1": 1}


def _shown(page: Any) -> str:
    """The ``shown`` field a decision form carries (the arguments the page showed)."""
    found = re.search(r'name="shown" value="([^"]*)"', page.content.decode())
    assert found is not None, "the decision form carries no shown arguments"
    return html.unescape(found.group(1))


def test_a_decision_in_the_admin_is_for_the_arguments_its_page_showed():
    """Every decision form posts back the arguments it showed (the call's page, the run
    page's banner; a queue row's buttons in their URL). A deploy asks the call again about
    other arguments between the page view and the submit: the decision is refused, and
    nothing is written."""
    req = waiting_for_approval("adm-shown")
    alice = make_user("alice", "durable_agents.approve_toolcall", "durable_agents.view_run")
    on_page = _shown(client_for(alice).get(approval_url(req)))
    on_run = _shown(client_for(alice).get(run_url("adm-shown")))
    assert json.loads(on_page) == json.loads(on_run) == {"order_id": "7", "cents": 500}
    queue = text_of(
        client_for(alice).get(reverse("admin:durable_agents_approvalrequest_changelist"))
    )
    row = re.search(r'formaction="([^"]*back=queue[^"]*)"', queue)
    assert row is not None and "shown_sha256=" in row.group(1)

    store = DjangoStore()
    asked = store.get_approval_request("adm-shown", "call_1_1")
    store.save_approval_request(
        replace(
            asked, arguments={"order_id": "7", "cents": 900}, previous_arguments=asked.arguments
        )
    )
    before = (journal("adm-shown"), Decision.objects.count(), ActionLog.objects.count())
    posts = [
        (approval_url(req, "decide"), {"decision": "approve", "shown": on_page}),
        (approval_url(req, "decide"), {"decision": "deny", "note": "no", "shown": on_run}),
        (html.unescape(row.group(1)), {"decision": "approve"}),
    ]
    for url, data in posts:
        response = client_for(alice).post(url, data)
        assert response.status_code == 302
        assert any("approval.arguments_changed" in m for m in messages_of(response)), url
    assert (journal("adm-shown"), Decision.objects.count(), ActionLog.objects.count()) == before
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    assert count_effects("adm-shown") == {}
    # A garbled one is a form error (none at all is refused: tests/integration/test_admin_trust).
    garbled = client_for(alice).post(
        approval_url(req, "decide"), {"decision": "approve", "shown": "{not json"}
    )
    assert garbled.status_code == 200 and "came back garbled" in text_of(garbled)
    assert Decision.objects.count() == before[1]


def test_deciding_for_a_cancelled_run_is_refused_as_orphaned():
    req = waiting_for_approval("adm-orphan")
    da.cancel("adm-orphan", by=make_user("ops", superuser=True), reason="customer left")
    client = client_for(make_user("alice", "durable_agents.approve_toolcall"))
    response = client.post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "approve"}
    )
    assert any("approval.orphaned" in m for m in messages_of(response))
    assert Run.objects.get(run_id="adm-orphan").status == "cancelled"
    assert "approval:call_1_1" not in journal("adm-orphan")
    assert count_effects("adm-orphan") == {}
    assert not ActionLog.objects.filter(action__in=["approve", "deny"]).exists()


def test_deny_with_a_note_is_what_the_model_reads():
    req = waiting_for_approval("adm-deny")
    root = make_user("root", superuser=True)
    response = client_for(root).post(
        approval_url(req, "decide"),
        {"shown": shown(req), "decision": "deny", "note": "refunds over 4€ need a manager"},
    )
    assert response.status_code == 302
    run = Run.objects.get(run_id="adm-deny")
    assert (run.status, run.answer) == ("finished", "refunded")  # the script's next turn
    result = journal("adm-deny")["tool:call_1_1"]
    assert result["is_error"] is True
    assert result["result"]["error"] == "denied"
    assert result["result"]["note"] == "refunds over 4€ need a manager"
    assert result["result"]["by"] == "root"
    assert count_effects("adm-deny") == {}  # the refund never ran
    assert ActionLog.objects.get().action == "deny"
    page = text_of(client_for(root).get(run_url("adm-deny")))
    assert "Call call_1_1 denied by root" in page and "refunds over 4€ need a manager" in page


def test_a_quorum_in_the_admin_and_engine_refusals_as_messages():
    finance = Group.objects.create(name="finance")
    perm = "durable_agents.approve_toolcall"
    alice, bob, carol = (make_user(n, perm) for n in ("alice", "bob", "carol"))
    finance.user_set.add(alice, bob)  # carol may approve, but not this group's calls
    quorum.start("pay a-1", run_id="adm-quorum")
    req = ApprovalRequest.objects.get(run_id="adm-quorum")
    decide = approval_url(req, "decide")
    changelist = reverse("admin:durable_agents_approvalrequest_changelist")

    response = client_for(carol).post(decide, {"shown": shown(req), "decision": "approve"})
    assert any("approval.not_eligible" in m for m in messages_of(response))
    assert not Decision.objects.exists() and not ActionLog.objects.exists()

    response = client_for(alice).post(
        decide, {"shown": shown(req), "decision": "approve", "note": "ok"}
    )
    assert any("1 of 2 approved so far" in m for m in messages_of(response))
    assert "1 of 2 approved (group finance)" in text_of(client_for(bob).get(changelist))
    assert Run.objects.get(run_id="adm-quorum").status == "awaiting_approval"

    response = client_for(alice).post(decide, {"shown": shown(req), "decision": "deny"})
    assert any("approval.already_decided" in m for m in messages_of(response))
    assert list(Decision.objects.values_list("approver", "approved")) == [("alice", True)]
    assert ActionLog.objects.count() == 1

    response = client_for(bob).post(decide, {"shown": shown(req), "decision": "approve"})
    run = Run.objects.get(run_id="adm-quorum")
    assert (run.status, run.answer) == ("finished", "paid")
    tally = journal("adm-quorum")["approval:call_1_1"]["tally"]
    assert tally["approved_by"] == ["alice", "bob"]
    assert sorted(ActionLog.objects.values_list("actor", flat=True)) == ["alice", "bob"]


def test_edit_and_approve_in_the_admin_checks_the_schema_then_runs_the_edit():
    req = waiting_for_approval("adm-edit")
    alice = make_user("alice", "durable_agents.approve_toolcall")
    page = text_of(client_for(alice).get(approval_url(req, "change")))
    assert "Approve with edits" in page and "Edited arguments" in page
    decide = approval_url(req, "decide")
    for bad, says in (
        ('{"order_id": "7", "cents": "lots"}', "cents"),
        ("{not json", "Not valid JSON"),
        ("[1, 2]", "JSON object"),
    ):
        response = client_for(alice).post(
            decide, {"shown": shown(req), "decision": "edit", "edit": bad}
        )
        assert response.status_code == 200 and says in text_of(response)
    assert not Decision.objects.exists() and not ActionLog.objects.exists()
    assert Run.objects.get(run_id="adm-edit").status == "awaiting_approval"

    edit = '{"order_id": "7", "cents": 250}'
    response = client_for(alice).post(
        decide, {"shown": shown(req), "decision": "edit", "edit": edit, "note": "half"}
    )
    assert response.status_code == 302
    assert Run.objects.get(run_id="adm-edit").status == "finished"
    assert journal("adm-edit")["tool:call_1_1"]["result"] == {"refunded": 250}
    edited = journal("adm-edit")["approval:call_1_1"]["edited"]
    assert edited["original"] == {"order_id": "7", "cents": 500} and edited["by"] == ["alice"]
    assert count_effects("adm-edit") == {"call_1_1": 1}
    assert "edited arguments" in text_of(client_for(alice).get(approval_url(req, "change")))


def test_the_run_page_asks_for_the_decision_it_waits_on():
    req = waiting_for_approval("adm-banner")
    alice = make_user("alice", "durable_agents.approve_toolcall", "durable_agents.cancel_run")
    page = text_of(client_for(alice).get(run_url("adm-banner")))
    assert "A person is needed" in page and "0 of 1 approved" in page
    assert 'name="back" value="run"' in page and 'da-approve"' in page
    # Editing is on the call's page, where the whole arguments are in the edit box.
    assert f'href="{approval_url(req, "change")}#da-decide"' in page
    assert 'value="Resume"' not in page  # resuming would only pause again
    response = client_for(alice).post(
        approval_url(req, "decide"),
        {
            "shown": shown(req),
            "decision": "edit",
            "edit": '{"order_id": "7", "cents": 100}',
            "back": "run",
        },
    )
    assert response.status_code == 302 and response["Location"] == run_url("adm-banner")
    assert journal("adm-banner")["tool:call_1_1"]["result"] == {"refunded": 100}
    page = text_of(client_for(alice).get(run_url("adm-banner")))
    assert "A person is needed" not in page

    halt = halted_in_process("adm-banner-halt")
    page = text_of(client_for(alice).get(run_url("adm-banner-halt")))
    assert "A person is needed" in page and "Record what happened" in page
    assert f"/halt/{halt.pk}/" in page


def test_an_invalid_decision_form_changes_nothing():
    req = waiting_for_approval("adm-bad-form")
    client = client_for(make_user("root", superuser=True))
    response = client.post(approval_url(req, "decide"), {"shown": shown(req), "decision": "maybe"})
    assert response.status_code == 200 and "Select a valid choice" in text_of(response)
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    assert not ActionLog.objects.exists()


# -- halts --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_resolve_a_real_halt_in_the_admin():
    """A driver process is killed inside a side effect; a second one resumes and halts; staff
    record the outcome in the admin and the run continues without running the effect again."""
    code, _ = drive_in_child("adm-halt", crash_inside="call_1_1")
    assert code == -9
    code, out = drive_in_child("adm-halt")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "halted"
    halt = Halt.objects.get(run_id="adm-halt", op_id="call_1_1")
    # The resume halted on the unknown outcome before running anything else.
    assert count_effects("adm-halt") == {"call_1_1": 1}

    root = make_user("root", superuser=True)
    client = client_for(root)
    queue = text_of(client.get(reverse("admin:durable_agents_halt_changelist")))
    assert "adm-halt" in queue and '"item": "x"' in queue and "crashed" in queue
    page = text_of(client.get(halt_url(halt)))
    assert "attempt:call_1_1:1" in page and 'id="da-resolve"' in page

    # Invalid JSON: a form error, nothing recorded.
    response = client.post(halt_url(halt, "resolve"), {"result": "{done: yes", "evidence": ""})
    assert response.status_code == 200 and "The result is not valid JSON" in text_of(response)
    response = client.post(halt_url(halt, "resolve"), {"result": "{}", "evidence": "NaN"})
    assert response.status_code == 200 and "The evidence is not valid JSON" in text_of(response)
    assert Halt.objects.get(pk=halt.pk).status == "open"
    assert "tool:call_1_1" not in journal("adm-halt") and not ActionLog.objects.exists()

    # A driver holding the lease: the engine refuses, the page says why.
    store = DjangoStore()
    assert store.acquire_lease("adm-halt", "someone", "their-token", 30)
    in_flight = text_of(client.get(reverse("admin:durable_agents_halt_changelist")))
    assert 'alt="True"' in in_flight  # the "driver holds lease" column
    response = client.post(halt_url(halt, "resolve"), {"result": '{"done": "x"}'})
    assert response.status_code == 200 and "halt.in_flight" in text_of(response)
    assert Halt.objects.get(pk=halt.pk).status == "open" and not ActionLog.objects.exists()
    store.release_lease("adm-halt", "their-token")

    # Too young for the minimum age asked for.
    response = client.post(halt_url(halt, "resolve"), {"result": "{}", "min_age": "3600"})
    assert response.status_code == 200 and "halt.too_young" in text_of(response)

    response = client.post(
        halt_url(halt, "resolve"),
        {"result": '{"done": "x"}', "evidence": '{"provider_ref": "op-19"}', "min_age": "0"},
    )
    assert response.status_code == 302, text_of(response)
    run = Run.objects.get(run_id="adm-halt")
    assert (run.status, run.answer) == ("finished", "all done")
    record = journal("adm-halt")["tool:call_1_1"]
    assert record["reconciled"] is True and record["by"] == "root"
    assert record["result"] == {"done": "x"} and record["evidence"] == {"provider_ref": "op-19"}
    assert count_effects("adm-halt") == {"call_1_1": 1, "call_1_2": 1, "call_2_1": 1}
    assert list(ActionLog.objects.values_list("action", "target")) == [("resolve", "call_1_1")]
    halt.refresh_from_db()
    assert (halt.status, halt.resolved_by) == ("resolved", "root")
    # Resolving again with another outcome is refused.
    response = client.post(halt_url(halt, "resolve"), {"result": '{"done": "y"}'})
    assert response.status_code == 200 and "halt.already_resolved" in text_of(response)
    assert ActionLog.objects.count() == 1
    assert journal("adm-halt")["tool:call_1_1"]["result"] == {"done": "x"}


def test_halt_queue_opens_on_open_halts():
    halted_in_process("hq-open")
    halt = halted_in_process("hq-resolved")
    root = make_user("root", superuser=True)
    da.resolve_halt("hq-resolved", halt.op_id, {"charged": False}, by="root")
    client = client_for(root)
    changelist = reverse("admin:durable_agents_halt_changelist")
    page = text_of(client.get(changelist))
    assert "hq-open" in page and "hq-resolved" not in page
    page = text_of(client.get(changelist + "?status=resolved"))
    assert "hq-resolved" in page and "hq-open" not in page


# -- runs ---------------------------------------------------------------------------------


def test_run_page_shows_the_journal_timeline_lease_and_history():
    echo.start("where is order 7?", run_id="tl-echo")
    req = waiting_for_approval("tl-gated")
    root = make_user("root", superuser=True)
    client = client_for(root)
    client.post(
        approval_url(req, "decide"),
        {"shown": shown(req), "decision": "approve", "note": "fine by me"},
    )

    page = text_of(client.get(run_url("tl-echo")))
    assert "Model turn 1" in page and "Tool call <code>call_1_1</code>" in page
    assert "<strong>lookup</strong>" in page
    assert '"order_id": "7"' in page  # arguments, pretty-printed
    assert "Result of call call_1_1 (lookup)" in page and '"status": "shipped"' in page
    assert "Run finished" in page and "order 7 shipped" in page
    assert "No lease: no driver holds this run." in page
    assert 'id="da-operate"' not in page  # a finished run has nothing to operate

    page = text_of(client.get(run_url("tl-gated")))
    assert "Call call_1_1 approved by root" in page and "fine by me" in page
    assert "Attempt 1 of call call_1_1 claimed" in page
    assert '"refunded": 500' in page and "refunded" in page
    assert "<td>root</td><td>approve</td><td>call_1_1</td>" in page  # the action history


def test_run_ids_with_derived_characters_open():
    run_id = "chat-1>turn/2"
    Journal(DjangoStore()).write(
        run_id, "run:start", {"kind": "start", "agent": "echo", "input": "hi"}
    )
    client = client_for(make_user("root", superuser=True))
    response = client.get(run_url(run_id))
    assert response.status_code == 200 and "Run started by agent 'echo'" in text_of(response)


def test_changelist_counts_and_filters():
    waiting_for_approval("cl-gated")
    halted_in_process("cl-halted")
    echo.start("where is order 7?", run_id="cl-echo")
    client = client_for(make_user("viewer", "durable_agents.view_run"))
    changelist = reverse("admin:durable_agents_run_changelist")
    response = client.get(changelist)
    rows = {r.run_id: r for r in response.context["cl"].result_list}
    assert (rows["cl-gated"].n_pending_approvals, rows["cl-gated"].n_open_halts) == (1, 0)
    assert (rows["cl-halted"].n_pending_approvals, rows["cl-halted"].n_open_halts) == (0, 1)
    assert (rows["cl-echo"].n_pending_approvals, rows["cl-echo"].n_open_halts) == (0, 0)
    filtered = client.get(changelist + "?status__exact=halted").context["cl"].result_list
    assert [r.run_id for r in filtered] == ["cl-halted"]
    searched = client.get(changelist + "?q=cl-ech").context["cl"].result_list
    assert [r.run_id for r in searched] == ["cl-echo"]
    by_agent = client.get(changelist + "?agent=gated").context["cl"].result_list
    assert [r.run_id for r in by_agent] == ["cl-gated"]


def test_runs_are_read_only_even_for_superusers():
    queued("ro-run")
    client = client_for(make_user("root", superuser=True))
    assert client.get(reverse("admin:durable_agents_run_add")).status_code == 403
    response = client.post(run_url("ro-run"), {"status": "finished", "answer": "forged"})
    assert response.status_code == 403
    assert Run.objects.get(run_id="ro-run").status == "queued"
    for model in ("actionlog", "halt", "approvalrequest"):
        assert client.get(reverse(f"admin:durable_agents_{model}_add")).status_code == 403


def test_cancel_and_resume_refusals_are_messages():
    echo.start("where is order 7?", run_id="op-finished")
    client = client_for(make_user("operator", "durable_agents.cancel_run"))
    response = client.post(run_url("op-finished", "cancel"), {"reason": "late"})
    assert any("already finished" in m for m in messages_of(response))
    response = client.post(run_url("op-finished", "resume"))
    assert any("Not handed to a driver: op-finished (finished)" in m for m in messages_of(response))
    assert not ActionLog.objects.exists()
    # A driver holds the run: cancel waits for it.
    queued("op-busy")
    DjangoStore().acquire_lease("op-busy", "someone", "tok", 30)
    response = client.post(run_url("op-busy", "cancel"), {"reason": "x"})
    assert any("is being driven" in m for m in messages_of(response))
    assert Run.objects.get(run_id="op-busy").status == "queued"
    assert not ActionLog.objects.exists()


def test_bulk_resume_and_cancel_actions():
    queued("bulk-1")
    queued("bulk-2")
    waiting_for_approval("bulk-3")
    changelist = reverse("admin:durable_agents_run_changelist")
    viewer = client_for(make_user("viewer", "durable_agents.view_run"))
    response = viewer.post(
        changelist, {"action": "resume_selected", "_selected_action": ["bulk-1"]}
    )
    assert Run.objects.get(run_id="bulk-1").status == "queued"  # no such action for viewers
    assert not ActionLog.objects.exists()

    operator = client_for(make_user("operator", "durable_agents.cancel_run"))
    response = operator.post(
        changelist, {"action": "resume_selected", "_selected_action": ["bulk-1", "bulk-2"]}
    )
    assert response.status_code == 302
    assert set(Run.objects.filter(run_id__startswith="bulk-").values_list("status", flat=True)) == {
        "finished",
        "awaiting_approval",
    }
    operator.post(changelist, {"action": "cancel_selected", "_selected_action": ["bulk-3"]})
    assert Run.objects.get(run_id="bulk-3").status == "cancelled"
    assert sorted(ActionLog.objects.values_list("action", "run_id")) == [
        ("cancel", "bulk-3"),
        ("resume", "bulk-1"),
        ("resume", "bulk-2"),
    ]


def test_deleting_runs_is_logged():
    echo.start("where is order 7?", run_id="del-1")
    waiting_for_approval("del-2")
    halted_in_process("del-3")
    viewer = client_for(make_user("viewer", "durable_agents.view_run"))
    assert viewer.post(run_url("del-1", "delete"), {"post": "yes"}).status_code == 403
    assert Run.objects.filter(run_id="del-1").exists()

    root = client_for(make_user("root", superuser=True))
    confirm = text_of(root.get(run_url("del-1", "delete")))
    assert "Run: del-1 (" in confirm and "journal entries" in confirm
    response = root.post(run_url("del-1", "delete"), {"post": "yes"})
    assert response.status_code == 302
    assert not Run.objects.filter(run_id="del-1").exists()
    assert not JournalEntry.objects.filter(run_id="del-1").exists()
    response = root.post(
        reverse("admin:durable_agents_run_changelist"),
        {"action": "delete_selected", "_selected_action": ["del-2", "del-3"], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Run.objects.filter(run_id__in=["del-2", "del-3"]).exists()
    assert not Halt.objects.exists() and not ApprovalRequest.objects.exists()
    logged = sorted(ActionLog.objects.filter(action="delete").values_list("actor", "run_id"))
    assert logged == [("root", "del-1"), ("root", "del-2"), ("root", "del-3")]


def test_action_log_is_read_only():
    queued("al-1")
    DjangoStore().log_action(da.engine.ports.ActionInfo("x", "resume", "al-1"))
    row = ActionLog.objects.get()
    client = client_for(make_user("root", superuser=True))
    url = reverse("admin:durable_agents_actionlog_change", args=[row.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"actor": "forged"}).status_code == 403
    delete = reverse("admin:durable_agents_actionlog_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ActionLog.objects.get().actor == "x"
    changelist = reverse("admin:durable_agents_actionlog_changelist")
    assert "al-1" in text_of(client.get(changelist + "?action=resume&q=al-1"))


# -- query counts -------------------------------------------------------------------------


def _rows(start: int, stop: int) -> None:
    """Runs with a pending approval (with a decision), an open halt, a live lease and an
    action log row each."""
    later = timezone.now() + timedelta(hours=1)
    ids = [f"qc-{i:04d}" for i in range(start, stop)]
    Run.objects.bulk_create(
        [Run(run_id=i, agent="gated", status="awaiting_approval", input={"n": i}) for i in ids]
    )
    requests = ApprovalRequest.objects.bulk_create(
        [
            ApprovalRequest(
                run_id=i,
                call_id="call_1_1",
                tool_name="refund",
                arguments={"order_id": i},
                policy={"kind": "quorum", "need": 2, "group": "g"},
                start_seq=1,
            )
            for i in ids
        ]
    )
    Decision.objects.bulk_create(
        [Decision(request=r, approver="a", approved=True) for r in requests]
    )
    Halt.objects.bulk_create(
        [Halt(run_id=i, op_id="call_1_2", tool_name="act", arguments={"item": i}) for i in ids]
    )
    Lease.objects.bulk_create(
        [Lease(run_id=i, holder="h", token="t", expires_at=later, renewed_at=later) for i in ids]
    )
    ActionLog.objects.bulk_create(
        [ActionLog(actor="a", action="resume", run_id=i, payload={"via": "test"}) for i in ids]
    )


@pytest.mark.parametrize(
    "model,marker",
    [
        ("run", "qc-0009"),
        ("approvalrequest", "1 of 2 approved"),
        ("halt", "call_1_2"),
        ("actionlog", "qc-0009"),
        ("apikey", ""),
    ],
)
def test_list_pages_cost_the_same_for_10_and_200_rows(model, marker):
    client = client_for(make_user("root", superuser=True))
    url = reverse(f"admin:durable_agents_{model}_changelist")
    _rows(0, 10)
    ApiKey.objects.bulk_create(
        [
            ApiKey(user=User.objects.get(), name=f"k{i}", prefix=f"p{i}", key_hash="h")
            for i in range(10)
        ]
    )
    client.get(url)  # warm caches (content types, permissions)
    with CaptureQueriesContext(connection) as small:
        response = client.get(url)
    assert response.status_code == 200 and marker in text_of(response)
    assert len(response.context["cl"].result_list) == 10
    _rows(10, 200)
    ApiKey.objects.bulk_create(
        [
            ApiKey(user=User.objects.get(), name=f"k{i}", prefix=f"p{i}", key_hash="h")
            for i in range(10, 200)
        ]
    )
    with CaptureQueriesContext(connection) as large:
        response = client.get(url)
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 100  # a full page
    assert len(small) == len(large), [q["sql"] for q in large]


# -- keys ---------------------------------------------------------------------------------


def test_api_key_is_shown_once_and_stored_as_a_hash():
    root = make_user("root", superuser=True)
    client = client_for(root)
    response = client.post(
        reverse("admin:durable_agents_apikey_add"), {"user": root.pk, "name": "billing"}
    )
    assert response.status_code == 200
    raw = response.context["raw_key"]
    assert raw in response.content.decode() and "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get()
    assert key.prefix == raw[:8] and key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert len(raw) >= 40
    for url in (
        reverse("admin:durable_agents_apikey_change", args=[key.pk]),
        reverse("admin:durable_agents_apikey_changelist"),
    ):
        assert raw not in client.get(url).content.decode()
    assert not any(raw in m for m in messages_of(response))

    changelist = reverse("admin:durable_agents_apikey_changelist")
    viewer = client_for(make_user("viewer", "durable_agents.view_apikey"))
    viewer.post(changelist, {"action": "revoke", "_selected_action": [key.pk]})
    assert ApiKey.objects.get().revoked_at is None
    client.post(changelist, {"action": "revoke", "_selected_action": [key.pk]})
    assert ApiKey.objects.get().revoked_at is not None
    # Nothing about a key can be edited.
    change = reverse("admin:durable_agents_apikey_change", args=[key.pk])
    assert client.post(change, {"name": "other"}).status_code == 403


def test_approver_keys_must_be_32_byte_base64():
    client = client_for(make_user("root", superuser=True))
    alice = make_user("alice", "durable_agents.approve_toolcall").pk
    add = reverse("admin:durable_agents_approverkey_add")
    bad = client.post(add, {"user": alice, "public_key": "not base64!"})
    assert bad.status_code == 200 and "not valid base64" in text_of(bad)
    short = client.post(add, {"user": alice, "public_key": base64.b64encode(b"x" * 31).decode()})
    assert short.status_code == 200 and "exactly 32 bytes" in text_of(short)
    assert not ApproverKey.objects.exists()
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    good = client.post(add, {"user": alice, "public_key": base64.b64encode(raw).decode()})
    assert good.status_code == 302
    key = ApproverKey.objects.get()
    assert base64.b64decode(key.public_key) == raw and key.user_id == alice
    client.post(
        reverse("admin:durable_agents_approverkey_changelist"),
        {"action": "revoke", "_selected_action": [key.pk]},
    )
    assert ApproverKey.objects.get().revoked_at is not None


# -- a broker that is down ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_failed_hand_over_is_a_warning_and_the_decision_stands():
    """Approve, resolve and resume with the broker down: what staff did is recorded, and the
    page warns that the run could not reach a worker (and how it will) instead of a 500."""
    req = waiting_for_approval("bd-approve")  # inline dispatch, before the broker goes down
    halt = halted_in_process("bd-halt")
    queued("bd-resume")
    client = client_for(make_user("root", superuser=True))
    with broker_down():
        response = client.post(
            approval_url(req, "decide"), {"shown": shown(req), "decision": "approve"}, follow=True
        )
        assert response.status_code == 200
        page = text_of(response)
        assert (
            "Call call_1_1 of run bd-approve is approved (recorded), but the run could not be"
            in page
        )
        assert "beat recovery hands it to a worker" in page and "handed to a driver" not in page
        assert ApprovalRequest.objects.get(pk=req.pk).status == "approved"
        assert Run.objects.get(run_id=req.run_id).status == "queued"  # recovery re-enqueues it
        assert journal("bd-approve")["approval:call_1_1"]["approved"] is True

        response = client.post(
            halt_url(halt, "resolve"), {"result": '{"charged": true}'}, follow=True
        )
        assert response.status_code == 200
        page = text_of(response)
        assert "The outcome of call call_1_1 is recorded and run bd-halt queued, but" in page
        assert "beat recovery hands it to a worker" in page
        assert Halt.objects.get(pk=halt.pk).status == "resolved"
        assert Run.objects.get(run_id="bd-halt").status == "queued"  # recovery re-enqueues it

        response = client.post(run_url("bd-resume", "resume"), follow=True)
        assert response.status_code == 200
        page = text_of(response)
        assert "The resume of run bd-resume is logged, but the run could not be handed" in page
        assert "beat recovery hands it to a worker" in page and "Handed to a driver" not in page
        assert ActionLog.objects.filter(action="resume", run_id="bd-resume").exists()

    # The broker is back (inline dispatch here): Resume gets the approved run going, as the
    # warning said.
    response = client.post(run_url("bd-approve", "resume"))
    assert any("Handed to a driver: bd-approve" in m for m in messages_of(response))
    assert Run.objects.get(run_id="bd-approve").status == "finished"
    assert count_effects("bd-approve") == {"call_1_1": 1}


def test_run_page_details_are_json_and_close_comes_last():
    req = waiting_for_approval("rp-json")
    client = client_for(make_user("root", superuser=True))
    client.post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "approve", "note": "fine"}
    )
    page = text_of(client.get(run_url("rp-json")))
    assert '<code>{"note": "fine", "signed": false}</code>' in page
    assert page.index('id="da-history"') < page.index('class="submit-row"')


def test_a_halt_refusal_is_shown_once():
    halt = halted_in_process("hr-once")
    store = DjangoStore()
    assert store.acquire_lease("hr-once", "someone", "their-token", 30)
    client = client_for(make_user("root", superuser=True))
    response = client.post(halt_url(halt, "resolve"), {"result": "{}"})
    assert response.status_code == 200
    assert text_of(response).count("halt.in_flight") == 1
    assert not messages_of(response)


# -- the approval page reads as a decision ------------------------------------------------


def test_the_approval_page_shows_summary_description_policy_and_decisions():
    req = waiting_for_approval("adm-read")
    alice = make_user("alice", "durable_agents.approve_toolcall")
    page = text_of(client_for(alice).get(approval_url(req, "change")))
    assert "Refund 5.00 to order 7" in page
    assert "Refund an order (staff approve first)." in page
    assert "needs one approval: 0 of 1 so far" in page and '{"kind": "single"}' not in page
    assert "Arguments as JSON" in page  # the raw JSON, behind a toggle
    client_for(alice).post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "deny", "note": "no"}
    )
    page = text_of(client_for(alice).get(approval_url(req, "change")))
    assert (
        '<td data-label="who">alice</td><td data-label="decision">denied</td>'
        '<td data-label="note">no</td><td data-label="edited">no</td>'
    ) in page


def test_the_approval_page_titles_fields_from_the_schema_and_words_a_quorum():
    finance = Group.objects.create(name="finance")
    alice = make_user("alice", "durable_agents.approve_toolcall")
    finance.user_set.add(alice)
    quorum.start("pay a-1", run_id="adm-read-q")
    req = ApprovalRequest.objects.get(run_id="adm-read-q")
    client_for(alice).post(
        approval_url(req, "decide"), {"shown": shown(req), "decision": "approve"}
    )
    page = text_of(client_for(alice).get(approval_url(req, "change")))
    fields = re.sub(r"(\s*<[^>]+>\s*)+", "|", page[page.index('<dl class="da-shown">') :])
    assert "|Invoice|inv-1|" in fields and "|Cents|9,900|" in fields
    assert "needs 2 approvals from group finance: 1 of 2 so far" in page


def test_a_summary_that_fails_falls_back_to_the_fields():
    from durable_agents.admin.readable import fields_of, summary_of

    def boom(args: dict) -> str:
        raise KeyError("cents")

    for bad in (boom, lambda args: 42, lambda args: "  "):
        tool = da.tool(requires_approval=True, summary=bad)(_titled)
        assert summary_of(tool, {"order_id": "7", "cents": 1}) is None
    tool = da.tool(_titled)
    assert fields_of(tool, {"cents": 1, "order_id": "7", "extra": [1]}) == [
        ("Order Id", "7"),  # pydantic titles every field
        ("Cents", "1"),
        ("Extra", "[1]"),
    ]
    with pytest.raises(da.ConfigError):
        da.tool(summary="not a function")(_titled)


def _titled(order_id: str, cents: int) -> dict:
    """A tool for the fallback."""
    return {}
