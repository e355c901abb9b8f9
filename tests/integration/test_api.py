"""The ninja API on PostgreSQL with inline dispatch: who may call what, approvals (1-of-1,
quorum, signed), halts, cancel and resume, error codes, and constant query counts.

Mounted by tests/urls.py at /api/agents/.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, get_args
from urllib.parse import quote

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import durable_agents as da
from durable_agents.api.auth import issue_api_key
from durable_agents.api.schemas import RunStatus
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import STATUSES, RunInfo
from durable_agents.models import (
    ActionLog,
    ApiKey,
    ApprovalRequest,
    ApproverKey,
    Decision,
    Halt,
    JournalEntry,
    Run,
)
from tests.support.agents import count_effects, echo, gated, halting, quorum
from tests.support.api import (
    API,
    Caller,
    as_session,
    error,
    session,
    staff_with,
    with_key,
)
from tests.support.people import make_user
from tests.support.signing import keypair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# -- helpers ------------------------------------------------------------------------


def snapshot() -> tuple[int, ...]:
    return (
        Run.objects.count(),
        JournalEntry.objects.count(),
        Decision.objects.count(),
        ActionLog.objects.count(),
        Halt.objects.filter(status="resolved").count(),
        ApprovalRequest.objects.exclude(status="pending").count(),
    )


def sign(
    private: Ed25519PrivateKey, run_id: str, call_id: str, approver: str, ok: bool, note: str = ""
) -> str:
    """What an external approver's client does: build the format-2 bytes from the pending
    request (its incarnation, from the run's start) and sign them."""
    request = ApprovalRequest.objects.get(run_id=run_id, call_id=call_id)
    start = JournalEntry.objects.get(run_id=run_id, name="run:start")
    message = da.decision_bytes(
        incarnation=json.loads(start.data)["incarnation"],
        run_id=run_id,
        call_id=call_id,
        tool_name=request.tool_name,
        arguments=request.arguments,
        approver_id=str(User.objects.get(username=approver).pk),
        approved=ok,
        note=note,
    )
    return base64.b64encode(private.sign(message)).decode()


def register_key(username: str, public: str) -> ApproverKey:
    return ApproverKey.objects.create(
        user=User.objects.get(username=username), public_key=public, confirmed_at=timezone.now()
    )


# -- who may call what --------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: Callable[[], str]
    body: Callable[[], Any]
    permission: str  # one permission that allows it (the table may allow others too)
    success: int


def _signed_body() -> dict:
    private, public = keypair()
    make_user("ext-approver", "durable_agents.approve_toolcall", staff=False)
    register_key("ext-approver", public)
    sig = sign(private, "m-gated", "call_1_1", "ext-approver", True)
    return {"approver": "ext-approver", "approved": True, "signature": sig}


ROUTES = {
    "list runs": Route("get", lambda: "/runs", dict, "durable_agents.view_run", 200),
    "run detail": Route("get", lambda: "/runs/m-gated", dict, "durable_agents.view_run", 200),
    "run journal": Route(
        "get", lambda: "/runs/m-echo/journal", dict, "durable_agents.view_run", 200
    ),
    "start run": Route(
        "post",
        lambda: "/runs",
        lambda: {"agent": "echo", "input": "where is order 7?", "run_id": "m-new"},
        "durable_agents.add_run",
        202,
    ),
    "resume run": Route(
        "post", lambda: "/runs/m-gated/resume", dict, "durable_agents.cancel_run", 202
    ),
    "cancel run": Route(
        "post",
        lambda: "/runs/m-gated/cancel",
        lambda: {"reason": "test"},
        "durable_agents.cancel_run",
        200,
    ),
    "list approvals": Route(
        "get", lambda: "/approvals", dict, "durable_agents.view_approvalrequest", 200
    ),
    "decide": Route(
        "post",
        lambda: "/runs/m-gated/approvals/call_1_1",
        lambda: {"approved": True, "note": "ok"},
        "durable_agents.approve_toolcall",
        200,
    ),
    "decide signed": Route(
        "post",
        lambda: "/runs/m-gated/approvals/call_1_1/signed",
        _signed_body,
        "durable_agents.view_approvalrequest",
        200,
    ),
    "list halts": Route("get", lambda: "/halts", dict, "durable_agents.view_halt", 200),
    "resolve halt": Route(
        "post",
        lambda: "/runs/m-halt/halts/call_1_1/resolve",
        lambda: {"result": {"charged": True}, "evidence": {"gateway_id": "g-1"}},
        "durable_agents.resolve_halt",
        200,
    ),
}

PRINCIPALS = ["anonymous", "non-staff", "staff without permission", "permitted", "api key"]
PRINCIPALS += ["revoked api key"]


@pytest.fixture
def scenario():
    echo.start("where is order 7?", run_id="m-echo")
    gated.start("refund order 7", run_id="m-gated")
    halting.start("charge card c-1", run_id="m-halt")
    assert Run.objects.get(run_id="m-gated").status == "awaiting_approval"
    assert Run.objects.get(run_id="m-halt").status == "halted"


def _caller(principal: str, permission: str | None) -> Caller:
    perms = (permission,) if permission else ()
    if principal == "anonymous":
        return Caller(Client(), {})
    if principal == "non-staff":
        return as_session(make_user("visitor", *perms, staff=False))
    if principal == "staff without permission":
        return as_session(make_user("viewer"))
    if principal == "permitted":
        return as_session(make_user("operator", *perms))
    caller = with_key(make_user("robot", *perms))
    if principal == "revoked api key":
        ApiKey.objects.update(revoked_at=timezone.now())
    return caller


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_who_may_call_each_route(scenario, route, principal):
    spec = ROUTES[route]
    caller = _caller(principal, spec.permission)
    body = spec.body()
    before = snapshot()
    path = spec.path()
    response = caller.get(path) if spec.method == "get" else caller.post(path, body)

    refused = {
        "anonymous": (401, "auth.required"),
        "non-staff": (403, "auth.not_staff"),
        "revoked api key": (401, "auth.key_revoked"),
    }
    if principal == "staff without permission" and spec.permission:
        refused[principal] = (403, "auth.forbidden")
    if principal in refused:
        body = error(response, *refused[principal])
        if principal == "staff without permission":
            assert spec.permission in body["message"]
        assert snapshot() == before  # refused: nothing written
        return
    assert response.status_code == spec.success, response.content
    assert response["Content-Type"] == "application/json; charset=utf-8"


def test_api_keys_update_last_used_and_are_refused_for_bad_or_inactive_users():
    user = make_user("robot", "durable_agents.view_run")
    key, raw = issue_api_key(user, "ci")
    assert key.last_used_at is None and key.key_hash != raw and len(key.prefix) == 8
    assert Client().get(API + "/runs", headers={"X-API-Key": raw}).status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    error(
        Client().get(API + "/runs", headers={"X-API-Key": raw[:-1] + "!"}), 401, "auth.invalid_key"
    )
    error(Client().get(API + "/runs", headers={"X-API-Key": "x" * 500}), 401, "auth.invalid_key")
    # Same prefix, different key: found by prefix, refused by the hash.
    error(
        Client().get(API + "/runs", headers={"X-API-Key": raw[:8] + "A" * 30}),
        401,
        "auth.invalid_key",
    )
    User.objects.filter(pk=user.pk).update(is_active=False)
    error(Client().get(API + "/runs", headers={"X-API-Key": raw}), 401, "auth.inactive")
    User.objects.filter(pk=user.pk).update(is_active=True, is_staff=False)
    error(Client().get(API + "/runs", headers={"X-API-Key": raw}), 403, "auth.not_staff")


def test_a_bad_api_key_is_refused_even_with_a_staff_session():
    client = session(make_user("viewer", "durable_agents.view_run"))
    assert client.get(API + "/runs").status_code == 200
    error(client.get(API + "/runs", headers={"X-API-Key": "nope-nope"}), 401, "auth.invalid_key")


def test_session_writes_need_the_csrf_token_and_api_keys_do_not():
    user = make_user("operator", "durable_agents.add_run")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = json.dumps({"agent": "echo", "input": "hi", "run_id": "csrf-1"})
    response = client.post(API + "/runs", body, content_type="application/json")
    error(response, 403, "auth.csrf")
    assert not Run.objects.filter(run_id="csrf-1").exists()
    anonymous = Client(enforce_csrf_checks=True)
    error(
        anonymous.post(API + "/runs", body, content_type="application/json"), 401, "auth.required"
    )
    _, raw = issue_api_key(user, "ci")
    response = Client(enforce_csrf_checks=True).post(
        API + "/runs", body, content_type="application/json", headers={"X-API-Key": raw}
    )
    assert response.status_code == 202


# -- runs ---------------------------------------------------------------------------


def test_start_read_and_journal_of_a_run():
    caller = staff_with("durable_agents.add_run")
    response = caller.post("/runs", {"agent": "echo", "input": "where is order 7?", "run_id": "r1"})
    assert response.status_code == 202 and response.json() == {"run_id": "r1"}
    detail = caller.get("/runs/r1").json()
    assert detail["status"] == "finished" and detail["answer"] == "order 7 shipped"
    assert detail["input"] == "where is order 7?" and detail["approvals"] == []
    journal = caller.get("/runs/r1/journal").json()
    names = [r["name"] for r in journal["records"]]
    assert names == ["@journal", "run:start", "model:1", "tool:call_1_1", "model:2", "run:complete"]
    start = journal["records"][1]
    assert start["kind"] == "start" and start["data"]["input"] == "where is order 7?"
    seqs = [r["seq"] for r in journal["records"]]
    assert seqs == sorted(seqs)
    tail = caller.get("/runs/r1/journal", after=seqs[2], limit=2).json()["records"]
    assert [r["seq"] for r in tail] == seqs[3:5]
    action = ActionLog.objects.get(action="start")
    assert (action.actor, action.run_id) == ("operator", "r1")
    # Same id, same input: handed over again, not a second run.
    again = caller.post("/runs", {"agent": "echo", "input": "where is order 7?", "run_id": "r1"})
    assert again.status_code == 202 and Run.objects.filter(run_id="r1").count() == 1
    generated = caller.post("/runs", {"agent": "echo", "input": "hi"}).json()["run_id"]
    assert generated.startswith("echo-")


def test_list_runs_filters_and_pages():
    for i in range(5):
        Run.objects.create(run_id=f"list-{i}", agent="echo" if i % 2 else "gated", status="queued")
    Run.objects.filter(run_id="list-4").update(status="failed")
    caller = staff_with()
    page = caller.get("/runs", limit=2).json()
    assert page["count"] == 5 and len(page["items"]) == 2 and page["limit"] == 2
    everything = [r["run_id"] for r in caller.get("/runs").json()["items"]]
    assert everything[:2] == [r["run_id"] for r in page["items"]]
    second = caller.get("/runs", limit=2, offset=2).json()["items"]
    assert [r["run_id"] for r in second] == everything[2:4]
    assert {r["run_id"] for r in caller.get("/runs", agent="echo").json()["items"]} == {
        "list-1",
        "list-3",
    }
    failed = caller.get("/runs", status="failed").json()
    assert [r["run_id"] for r in failed["items"]] == ["list-4"] and failed["count"] == 1
    error(caller.get("/runs", status="exploded"), 422, "request.invalid")
    assert set(get_args(RunStatus)) == set(STATUSES)  # the filter knows every status
    error(caller.get("/runs", limit=0), 422, "request.invalid")
    error(caller.get("/runs", limit=10_000), 422, "request.invalid")


def test_derived_run_ids_with_slashes_are_addressable():
    DjangoStore().create_run(RunInfo(run_id="chat-1>turn/2", agent="echo", input="hi"))
    caller = staff_with("durable_agents.cancel_run")
    for path in ("/runs/chat-1>turn/2", "/runs/" + quote("chat-1>turn/2", safe="")):
        assert caller.get(path).json()["run_id"] == "chat-1>turn/2"
    assert caller.get("/runs/chat-1>turn/2/journal").json()["records"] == []
    assert caller.post("/runs/chat-1>turn/2/cancel", {}).json()["status"] == "cancelled"


def test_resume_hands_an_unfinished_run_to_a_driver():
    store = DjangoStore()
    store.create_run(RunInfo(run_id="res-1", agent="echo", input="where is order 7?"))
    caller = staff_with("durable_agents.cancel_run")
    response = caller.post("/runs/res-1/resume")
    assert response.status_code == 202 and response.json() == {"run_id": "res-1"}
    assert Run.objects.get(run_id="res-1").status == "finished"  # inline dispatch drove it
    assert ActionLog.objects.filter(action="resume", run_id="res-1", actor="operator").exists()
    error(caller.post("/runs/res-1/resume"), 409, "run.finished")
    error(caller.post("/runs/nope/resume"), 404, "run.not_found")
    store.create_run(RunInfo(run_id="res-ghost", agent="ghost", input="boo"))
    before = snapshot()
    error(caller.post("/runs/res-ghost/resume"), 404, "agent.not_found")
    assert snapshot() == before


def test_cancel_withdraws_approvals_and_a_later_decision_is_orphaned():
    gated.start("refund order 7", run_id="can-1")
    caller = staff_with("durable_agents.cancel_run", "durable_agents.approve_toolcall")
    response = caller.post("/runs/can-1/cancel", {"reason": "customer withdrew"})
    assert response.status_code == 200 and response.json() == {
        "run_id": "can-1",
        "status": "cancelled",
    }
    assert Run.objects.get(run_id="can-1").status == "cancelled"
    assert caller.post("/runs/can-1/cancel", {}).status_code == 200  # already cancelled
    before = Decision.objects.count()
    error(
        caller.post("/runs/can-1/approvals/call_1_1", {"approved": True}), 409, "approval.orphaned"
    )
    assert Decision.objects.count() == before
    error(caller.post("/runs/can-1/resume"), 409, "run.cancelled")
    echo.start("where is order 7?", run_id="can-done")
    error(caller.post("/runs/can-done/cancel", {}), 409, "run.finished")


def test_cancel_is_refused_while_a_driver_holds_the_run():
    gated.start("refund order 7", run_id="busy-1")
    DjangoStore().acquire_lease("busy-1", "another worker", "their-token", 30)
    caller = staff_with("durable_agents.cancel_run")
    error(caller.post("/runs/busy-1/cancel", {}), 409, "run.busy")
    assert Run.objects.get(run_id="busy-1").status == "awaiting_approval"


# -- approvals ----------------------------------------------------------------------


def test_approve_then_the_same_decision_again_then_a_different_one():
    gated.start("refund order 7", run_id="ap-1")
    caller = staff_with("durable_agents.approve_toolcall")
    pending = caller.get("/approvals").json()
    assert pending["count"] == 1
    item = pending["items"][0]
    assert (item["run_id"], item["call_id"], item["tool_name"]) == ("ap-1", "call_1_1", "refund")
    assert item["arguments"] == {"order_id": "7", "cents": 500}
    assert item["progress"] == {
        "need": 1,
        "approved_by": [],
        "denied_by": [],
        "eligible": None,
        "pending": None,
        "deputies": {},
    }
    detail = caller.get("/runs/ap-1").json()
    assert [a["call_id"] for a in detail["approvals"]] == ["call_1_1"]

    response = caller.post("/runs/ap-1/approvals/call_1_1", {"approved": True, "note": "fine"})
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert Run.objects.get(run_id="ap-1").status == "finished"
    again = caller.post("/runs/ap-1/approvals/call_1_1", {"approved": True})
    assert again.status_code == 200 and again.json()["status"] == "approved"
    body = error(
        caller.post("/runs/ap-1/approvals/call_1_1", {"approved": False}),
        409,
        "approval.already_decided",
    )
    assert body["details"]["standing"]["approved"] is True
    assert body["details"]["standing"]["by"] == "operator"
    assert caller.get("/approvals").json()["count"] == 0
    decided = caller.get("/approvals", status="approved").json()["items"]
    assert decided[0]["decisions"][0]["approver"] == "operator"
    assert decided[0]["progress"]["approved_by"] == ["operator"]


def test_a_decision_can_say_which_arguments_it_was_shown():
    """``arguments``: what the decider saw in the approvals list. If a deploy asked the
    call again about others meanwhile, 409 ``approval.arguments_changed`` and nothing is
    recorded; with what the call asks now, the decision is taken."""
    gated.start("refund order 7", run_id="ap-shown")
    caller = staff_with("durable_agents.approve_toolcall")
    [item] = [i for i in caller.get("/approvals").json()["items"] if i["run_id"] == "ap-shown"]
    seen = item["arguments"]
    assert item["tool_digest"] == ""  # a Python tool: its decision is about the arguments
    store = DjangoStore()
    asked = store.get_approval_request("ap-shown", "call_1_1")
    now = {"order_id": "7", "cents": 900}
    store.save_approval_request(replace(asked, arguments=now, previous_arguments=asked.arguments))
    # Asked again about an MCP tool's next definition: the list says which one.
    store.save_approval_request(
        replace(asked, arguments=now, previous_arguments=now, tool_digest="v2")
    )
    [item] = [i for i in caller.get("/approvals").json()["items"] if i["run_id"] == "ap-shown"]
    assert (item["tool_digest"], item["previous_arguments"]) == ("v2", now)
    store.save_approval_request(replace(asked, arguments=now, previous_arguments=asked.arguments))
    before = snapshot()
    url = "/runs/ap-shown/approvals/call_1_1"
    body = error(
        caller.post(url, {"approved": True, "arguments": seen}), 409, "approval.arguments_changed"
    )
    assert "other arguments" in body["message"]
    assert snapshot() == before and count_effects("ap-shown") == {}
    taken = caller.post(url, {"approved": False, "note": "no", "arguments": now})
    assert taken.status_code == 200 and taken.json()["status"] == "denied"


def test_a_denial_becomes_a_rejection_and_the_run_goes_on():
    gated.start("refund order 7", run_id="deny-1")
    caller = staff_with("durable_agents.approve_toolcall")
    response = caller.post("/runs/deny-1/approvals/call_1_1", {"approved": False, "note": "no"})
    assert response.status_code == 200 and response.json()["status"] == "denied"
    run = Run.objects.get(run_id="deny-1")
    assert run.status == "finished"
    journal = caller.get("/runs/deny-1/journal").json()["records"]
    result = next(r for r in journal if r["name"] == "tool:call_1_1")
    assert result["data"]["is_error"] is True


def test_the_three_decision_kinds_through_the_api():
    caller = staff_with("durable_agents.approve_toolcall")
    gated.start("refund order 7", run_id="kind-deny")
    note = "refund 2.00 at most"
    response = caller.post("/runs/kind-deny/approvals/call_1_1", {"approved": False, "note": note})
    assert response.status_code == 200 and response.json()["status"] == "denied"
    journal = caller.get("/runs/kind-deny/journal").json()["records"]
    result = next(r for r in journal if r["name"] == "tool:call_1_1")["data"]["result"]
    assert result["message"] == f"a person denied this call: {note}"

    gated.start("refund order 7", run_id="kind-edit")
    before = snapshot()
    url = "/runs/kind-edit/approvals/call_1_1"
    for bad in (
        {"approved": True, "edit": {"order_id": "7", "cents": "lots"}},
        {"approved": False, "edit": {"order_id": "7", "cents": 1}},
    ):
        error(caller.post(url, bad), 400, "approval.edit_invalid")
    assert caller.post(url, {"approved": True, "edit": [1]}).status_code in (400, 422)
    assert snapshot() == before
    edit = {"order_id": "7", "cents": 200}
    response = caller.post("/runs/kind-edit/approvals/call_1_1", {"approved": True, "edit": edit})
    assert response.status_code == 200 and response.json()["status"] == "approved"
    decided = caller.get("/approvals", status="approved", run_id="kind-edit").json()["items"]
    assert decided[0]["decisions"][0]["arguments"] == edit
    assert decided[0]["arguments"] == {"order_id": "7", "cents": 500}
    journal = caller.get("/runs/kind-edit/journal").json()["records"]
    record = next(r for r in journal if r["name"] == "approval:call_1_1")["data"]
    assert record["edited"]["arguments"] == edit and record["edited"]["by"] == ["operator"]
    ran = next(r for r in journal if r["name"] == "tool:call_1_1")["data"]
    assert ran["result"] == {"refunded": 200}
    assert count_effects("kind-edit") == {"call_1_1": 1}


def test_deciding_what_does_not_exist_or_with_bad_input():
    gated.start("refund order 7", run_id="ap-bad")
    caller = staff_with("durable_agents.approve_toolcall")
    before = snapshot()
    error(caller.post("/runs/ap-bad/approvals/nope", {"approved": True}), 404, "approval.not_found")
    error(
        caller.post("/runs/nope/approvals/call_1_1", {"approved": True}), 404, "approval.not_found"
    )
    error(
        caller.post("/runs/ap-bad/approvals/call_1_1", {"approved": "yes"}), 422, "request.invalid"
    )
    error(caller.post("/runs/ap-bad/approvals/call_1_1", {}), 422, "request.invalid")
    error(
        caller.post("/runs/ap-bad/approvals/call_1_1", {"approved": True, "extra": 1}),
        422,
        "request.invalid",
    )
    error(caller.post("/runs/ap-bad/approvals/call_1_1", raw="{not json"), 400, "request.invalid")
    error(
        caller.post("/runs/ap-bad/approvals/call_1_1", {"approved": True, "note": "a\x00b"}),
        422,
        "request.invalid",
    )
    assert snapshot() == before


@pytest.fixture
def finance():
    for name in ("ann", "bob", "cat"):
        make_user(name, groups=("finance",))
    group = Group.objects.get(name="finance")
    readers = ("view_run", "view_halt")
    group.permissions.add(
        *Permission.objects.filter(
            codename__in=("approve_toolcall", *readers), content_type__app_label="durable_agents"
        )
    )
    make_user(  # not in finance
        "dan", "durable_agents.approve_toolcall", *(f"durable_agents.{p}" for p in readers)
    )
    return {
        name: with_key(User.objects.get(username=name)) for name in ("ann", "bob", "cat", "dan")
    }


def test_quorum_counts_each_approver_once_and_passes_at_need(finance):
    quorum.start("pay invoice inv-1", run_id="q-1")
    path = "/runs/q-1/approvals/call_1_1"
    first = finance["ann"].post(path, {"approved": True})
    assert first.status_code == 200 and first.json()["status"] == "pending"
    again = finance["ann"].post(path, {"approved": True})
    assert again.json()["status"] == "pending"
    assert again.json()["tally"]["approved_by"] == ["ann"]
    progress = finance["dan"].get("/approvals", run_id="q-1").json()["items"][0]["progress"]
    assert progress == {
        "need": 2,
        "approved_by": ["ann"],
        "denied_by": [],
        "eligible": ["ann", "bob", "cat"],
        "pending": ["bob", "cat"],
        "deputies": {},
    }
    assert count_effects("q-1") == {}
    done = finance["bob"].post(path, {"approved": True})
    assert done.json()["status"] == "approved"
    assert sorted(done.json()["tally"]["approved_by"]) == ["ann", "bob"]
    assert (
        count_effects("q-1") == {"call_1_1": 1}
        and Run.objects.get(run_id="q-1").status == "finished"
    )


def test_quorum_ends_denied_once_it_cannot_pass(finance):
    quorum.start("pay invoice inv-1", run_id="q-deny")
    path = "/runs/q-deny/approvals/call_1_1"
    assert finance["ann"].post(path, {"approved": False}).json()["status"] == "pending"
    final = finance["bob"].post(path, {"approved": False})
    assert final.json()["status"] == "denied"
    assert count_effects("q-deny") == {} and Run.objects.get(run_id="q-deny").status == "finished"
    body = error(finance["cat"].post(path, {"approved": True}), 409, "approval.already_decided")
    assert body["details"]["standing"]["approved"] is False


def test_an_ineligible_approver_is_refused(finance):
    quorum.start("pay invoice inv-1", run_id="q-inel")
    before = snapshot()
    error(
        finance["dan"].post("/runs/q-inel/approvals/call_1_1", {"approved": True}),
        403,
        "approval.not_eligible",
    )
    assert snapshot() == before


def test_signed_decisions_count_only_when_the_signature_verifies(finance):
    quorum.start("pay invoice inv-1", run_id="q-sig")
    quorum.start("pay invoice inv-1", run_id="q-other")
    private, public = keypair()
    register_key("cat", public)
    # Staff who may read approvals, without approve_toolcall: the signature decides.
    relay = staff_with("durable_agents.view_approvalrequest", name="relay")
    path = "/runs/q-sig/approvals/call_1_1/signed"
    before = snapshot()

    bad = {"approver": "cat", "approved": True, "signature": base64.b64encode(b"x" * 64).decode()}
    error(relay.post(path, bad), 400, "approval.bad_signature")
    error(relay.post(path, dict(bad, signature="not base64!")), 400, "approval.bad_signature")
    # A valid signature, but for the same call of another run.
    other = sign(private, "q-other", "call_1_1", "cat", True)
    error(relay.post(path, dict(bad, signature=other)), 400, "approval.bad_signature")
    # Signed "deny" sent as "approve".
    denial = sign(private, "q-sig", "call_1_1", "cat", False)
    error(relay.post(path, dict(bad, signature=denial)), 400, "approval.bad_signature")
    # Signed by cat, claimed for bob (no key).
    good = sign(private, "q-sig", "call_1_1", "cat", True)
    error(
        relay.post(path, dict(bad, approver="bob", signature=good)), 400, "approval.bad_signature"
    )
    assert snapshot() == before

    # The note is signed too: a relay cannot add or change it.
    error(
        relay.post(path, dict(bad, signature=good, note="signed off")),
        400,
        "approval.bad_signature",
    )
    noted = sign(private, "q-sig", "call_1_1", "cat", True, note="signed off")
    response = relay.post(path, dict(bad, signature=noted, note="signed off"))
    assert response.status_code == 200 and response.json()["status"] == "pending"
    decision = Decision.objects.get(request__run_id="q-sig")
    assert (decision.approver, decision.approved, decision.signature) == ("cat", True, noted)
    assert (
        finance["ann"].post("/runs/q-sig/approvals/call_1_1", {"approved": True}).json()["status"]
        == "approved"
    )
    assert count_effects("q-sig") == {"call_1_1": 1} and count_effects("q-other") == {}


def test_a_signed_decision_of_an_ineligible_approver_is_refused(finance):
    quorum.start("pay invoice inv-1", run_id="q-sig-dan")
    private, public = keypair()
    register_key("dan", public)
    body = {
        "approver": "dan",
        "approved": True,
        "signature": sign(private, "q-sig-dan", "call_1_1", "dan", True),
    }
    error(
        staff_with("durable_agents.view_approvalrequest", name="relay").post(
            "/runs/q-sig-dan/approvals/call_1_1/signed", body
        ),
        403,
        "approval.not_eligible",
    )
    assert not Decision.objects.exists()


# -- halts --------------------------------------------------------------------------


def test_resolving_a_halt_records_the_outcome_and_continues_the_run():
    halting.start("charge card c-1", run_id="h-1")
    caller = staff_with("durable_agents.resolve_halt")
    halts = caller.get("/halts").json()
    assert halts["count"] == 1
    halt = halts["items"][0]
    assert (halt["run_id"], halt["call_id"], halt["tool_name"]) == ("h-1", "call_1_1", "charge")
    assert halt["status"] == "open" and halt["attempt"] == "attempt:call_1_1:1"
    assert [h["call_id"] for h in caller.get("/runs/h-1").json()["halts"]] == ["call_1_1"]

    path = "/runs/h-1/halts/call_1_1/resolve"
    error(caller.post(path, {"result": {"charged": True}, "min_age": 3600}), 409, "halt.too_young")
    store = DjangoStore()
    store.acquire_lease("h-1", "another worker", "their-token", 30)
    error(caller.post(path, {"result": {"charged": True}}), 409, "halt.in_flight")
    store.release_lease("h-1", "their-token")

    body = {"result": {"charged": True}, "evidence": {"gateway_id": "g-1"}, "min_age": 0}
    response = caller.post(path, body)
    assert response.status_code == 200, response.content
    out = response.json()
    assert out["result"] == {"charged": True} and out["evidence"] == {"gateway_id": "g-1"}
    assert out["by"] == "operator" and out["is_error"] is False
    run = Run.objects.get(run_id="h-1")
    assert (run.status, run.answer) == ("finished", "charged")
    assert caller.get("/halts").json()["count"] == 0
    resolved = caller.get("/halts", status="resolved").json()["items"]
    assert resolved[0]["resolved_by"] == "operator"
    assert caller.post(path, body).status_code == 200  # the same outcome again: accepted
    standing = error(
        caller.post(path, {"result": {"charged": False}}), 409, "halt.already_resolved"
    )
    assert standing["details"]["result"] == {"charged": True}


def test_resolving_what_is_not_halted_or_with_bad_input():
    halting.start("charge card c-1", run_id="h-bad")
    caller = staff_with("durable_agents.resolve_halt")
    before = snapshot()
    error(caller.post("/runs/h-bad/halts/nope/resolve", {"result": 1}), 409, "halt.no_live_attempt")
    error(caller.post("/runs/nope/halts/call_1_1/resolve", {"result": 1}), 404, "run.not_found")
    path = "/runs/h-bad/halts/call_1_1/resolve"
    error(caller.post(path, {}), 422, "request.invalid")  # result is required
    error(caller.post(path, {"result": 1, "is_error": "no"}), 422, "request.invalid")
    error(caller.post(path, {"result": 1, "min_age": -1}), 422, "request.invalid")
    error(caller.post(path, {"result": "\x00"}), 422, "request.invalid")
    error(caller.post(path, raw='{"result": NaN}'), 400, "protocol.encoding")
    assert snapshot() == before


# -- bad input ----------------------------------------------------------------------


def test_bad_starts_write_nothing():
    caller = staff_with("durable_agents.add_run")
    before = snapshot()
    error(caller.post("/runs", {"agent": "nobody", "input": "hi"}), 404, "agent.not_found")
    error(
        caller.post("/runs", {"agent": "echo", "input": "hi", "run_id": "bad id!"}),
        400,
        "config.run_id",
    )
    error(
        caller.post("/runs", {"agent": "echo", "input": "hi", "run_id": ""}), 400, "config.run_id"
    )
    error(
        caller.post("/runs", {"agent": "echo", "input": "hi", "run_id": "a>b"}),
        400,
        "config.run_id",
    )
    error(caller.post("/runs", {"agent": "echo", "input": None}), 400, "config.input_missing")
    error(caller.post("/runs", {"agent": "echo"}), 422, "request.invalid")
    body = error(
        caller.post("/runs", {"agent": "echo", "input": "hi", "colour": "red"}),
        422,
        "request.invalid",
    )
    assert any("colour" in str(d["loc"]) for d in body["detail"])
    error(caller.post("/runs", {"agent": "echo", "input": {"a": "\x00"}}), 422, "request.invalid")
    error(caller.post("/runs", {"agent": "echo", "input": "\ud800"}), 422, "request.invalid")
    error(caller.post("/runs", raw='{"agent": "echo", "input": 1e999}'), 400, "protocol.encoding")
    error(caller.post("/runs", raw="{oops"), 400, "request.invalid")
    error(caller.post("/runs", raw="[1, 2]"), 422, "request.invalid")
    assert snapshot() == before
    echo.start("first question", run_id="taken")
    before = snapshot()
    error(
        caller.post("/runs", {"agent": "echo", "input": "second question", "run_id": "taken"}),
        409,
        "config.input_mismatch",
    )
    error(
        caller.post("/runs", {"agent": "gated", "input": "first question", "run_id": "taken"}),
        409,
        "config.agent_mismatch",
    )
    assert snapshot() == before


def test_bad_ids_in_paths_and_queries():
    caller = staff_with(
        "durable_agents.cancel_run", "durable_agents.approve_toolcall", "durable_agents.view_halt"
    )
    error(caller.get("/runs/nope"), 404, "run.not_found")
    error(caller.get("/runs/nope/journal"), 404, "run.not_found")
    error(caller.get("/runs/" + quote("bad id!")), 400, "config.run_id")
    error(caller.get("/runs/" + quote("a\x00b")), 400, "config.run_id")
    error(caller.get("/runs/" + "x" * 401), 400, "config.run_id")
    error(caller.post("/runs/" + quote("bad id!") + "/cancel", {}), 400, "config.run_id")
    error(caller.get("/approvals", run_id="bad id!"), 400, "config.run_id")
    error(caller.get("/halts", run_id="a\x00"), 400, "config.run_id")
    error(caller.get("/runs", agent="a\x00"), 422, "request.invalid")
    error(
        caller.post("/runs/x/approvals/" + quote("a\x00"), {"approved": True}),
        400,
        "config.call_id",
    )


def test_openapi_schema_is_served_to_staff():
    error(Client().get("/api/openapi.json"), 401, "auth.required")
    error(session(make_user("visitor", staff=False)).get("/api/docs"), 403, "auth.not_staff")
    staff = session(make_user("viewer"))
    docs = staff.get("/api/docs")
    assert docs.status_code == 200
    page = docs.content.decode()
    # Swagger UI from ninja's own static files: the page works offline.
    assert "/static/ninja/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    response = staff.get("/api/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    for path in (
        "/api/agents/runs",
        "/api/agents/runs/{run_id}",
        "/api/agents/runs/{run_id}/journal",
        "/api/agents/runs/{run_id}/resume",
        "/api/agents/runs/{run_id}/cancel",
        "/api/agents/approvals",
        "/api/agents/runs/{run_id}/approvals/{call_id}",
        "/api/agents/runs/{run_id}/approvals/{call_id}/signed",
        "/api/agents/halts",
        "/api/agents/runs/{run_id}/halts/{call_id}/resolve",
    ):
        assert path in paths, path
    schemes = schema["components"]["securitySchemes"]
    assert {"type": "apiKey", "in": "header", "name": "X-API-Key"} in schemes.values()
    assert paths["/api/agents/runs"]["post"]["responses"]["202"]


def test_a_setting_publishes_the_api_docs(settings):
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "PUBLIC_API_DOCS": True}
    assert Client().get("/api/openapi.json").status_code == 200
    assert Client().get("/api/docs").status_code == 200


# -- query counts -------------------------------------------------------------------


def _queries(caller: Caller, path: str, **params: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = caller.get(path, limit=500, **params)
    assert response.status_code == 200, response.content
    return len(captured)


def _runs(start: int, stop: int) -> None:
    Run.objects.bulk_create(
        Run(run_id=f"qc-{i}", agent="echo", status="awaiting_approval") for i in range(start, stop)
    )


def _approvals(start: int, stop: int) -> None:
    _runs(start, stop)
    requests = ApprovalRequest.objects.bulk_create(
        ApprovalRequest(
            run_id=f"qc-{i}",
            call_id="call_1_1",
            tool_name="pay",
            arguments={"invoice": str(i)},
            policy={"kind": "quorum", "need": 2, "group": "finance"}
            if i % 2
            else {"kind": "single"},
            start_seq=1,
        )
        for i in range(start, stop)
    )
    Decision.objects.bulk_create(
        Decision(request=r, approver=name, approved=True)
        for r in requests
        for name in ("ann", "bob")
    )


def _halts(start: int, stop: int) -> None:
    _runs(start, stop)
    Halt.objects.bulk_create(
        Halt(run_id=f"qc-{i}", op_id="call_1_1", tool_name="charge", attempt="attempt:call_1_1:1")
        for i in range(start, stop)
    )


@pytest.mark.parametrize(
    "path,fill",
    [("/runs", _runs), ("/approvals", _approvals), ("/halts", _halts)],
)
def test_list_pages_cost_the_same_with_10_or_200_rows(finance, path, fill):
    for caller in (finance["dan"], as_session(User.objects.get(username="ann"))):
        fill(0, 10)
        assert caller.get(path).json()["count"] == 10
        small = _queries(caller, path)
        fill(10, 200)
        page = caller.get(path, limit=500).json()
        assert page["count"] == len(page["items"]) == 200
        assert _queries(caller, path) == small
        Run.objects.all().delete()


def test_run_detail_costs_the_same_with_1_or_20_approvals_and_halts(finance):
    caller = finance["dan"]
    Run.objects.create(run_id="qc-detail", agent="pay", status="awaiting_approval")

    def add(start: int, stop: int) -> None:
        for i in range(start, stop):
            request = ApprovalRequest.objects.create(
                run_id="qc-detail",
                call_id=f"call_{i}",
                tool_name="pay",
                policy={"kind": "quorum", "need": 2, "group": "finance"},
                start_seq=1,
            )
            Decision.objects.create(request=request, approver="ann", approved=True)
            Halt.objects.create(run_id="qc-detail", op_id=f"call_{i}", tool_name="charge")

    add(0, 1)
    with CaptureQueriesContext(connection) as one:
        assert len(caller.get("/runs/qc-detail").json()["approvals"]) == 1
    add(1, 20)
    with CaptureQueriesContext(connection) as twenty:
        detail = caller.get("/runs/qc-detail").json()
    assert len(detail["approvals"]) == len(detail["halts"]) == 20
    assert len(one) == len(twenty)
