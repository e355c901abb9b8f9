"""Sagas on PostgreSQL (issue 16): "cancel and compensate" through the API and the admin,
the run page's timeline showing each undo, and the refusals (a plain cancel of a saga
rolling back, a compensated run), and a saga that aborts by itself withdrawing the request
it waited on. Undos are counted outside the journal (``test_effects``)."""

from __future__ import annotations

import html

import pytest
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

import durable_agents as da
from durable_agents.engine import registry
from durable_agents.models import ActionLog, ApprovalRequest, Decision, Run
from tests.support.admin_pages import shown
from tests.support.agents import (
    count_effects,
    saga_delegator,
    saga_gated,
    saga_tree_gated,
    saga_trip,
)
from tests.support.api import error, staff_with
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BOOKED = {"call_1_1": 1, "call_2_1": 1}
UNDONE = {"compensate:call_2_1": 1, "compensate:call_1_1": 1}


def run_url(run_id: str, suffix: str = "change") -> str:
    return reverse(f"admin:durable_agents_run_{suffix}", args=[quote(run_id)])


def test_api_cancel_and_compensate_undoes_the_bookings_once():
    saga_gated.start("book a trip", run_id="api-saga")
    assert Run.objects.get(run_id="api-saga").status == "awaiting_approval"
    caller = staff_with("durable_agents.cancel_run")
    response = caller.post(
        "/runs/api-saga/cancel", {"reason": "customer withdrew", "compensate": True}
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"run_id": "api-saga", "status": "compensated"}
    assert count_effects("api-saga") == {**BOOKED, **UNDONE}
    run = Run.objects.get(run_id="api-saga")
    assert run.status == "compensated" and run.last_error["code"] == "saga.cancelled"
    assert ApprovalRequest.objects.get(run_id="api-saga").status == "withdrawn"
    [action] = ActionLog.objects.filter(run_id="api-saga", action="cancel")
    assert action.payload == {"reason": "customer withdrew", "compensate": True}
    error(caller.post("/runs/api-saga/cancel", {"compensate": True}), 409, "run.compensated")
    error(caller.post("/runs/api-saga/cancel", {}), 409, "run.compensated")
    assert count_effects("api-saga") == {**BOOKED, **UNDONE}
    # a bad flag is a 4xx with a code, and changes nothing
    saga_gated.start("book a trip", run_id="api-saga-2")
    response = caller.post("/runs/api-saga-2/cancel", {"compensate": "please"})
    assert response.status_code in (400, 422)
    assert Run.objects.get(run_id="api-saga-2").status == "awaiting_approval"
    # listed as compensated by the runs list's status filter
    listed = caller.get("/runs", status="compensated").json()
    assert [r["run_id"] for r in listed["items"]] == ["api-saga"]


def test_admin_cancel_and_compensate_and_the_timeline_shows_each_undo():
    saga_gated.start("book a trip", run_id="adm-saga")
    client = Client()
    client.force_login(make_user("operator", "durable_agents.cancel_run"))
    page = html.unescape(client.get(run_url("adm-saga")).content.decode())
    assert "Cancel and compensate" in page
    response = client.post(run_url("adm-saga", "cancel"), {"reason": "no card", "compensate": "1"})
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(m.startswith("Cancelled; undoing its completed calls") for m in said), said
    assert Run.objects.get(run_id="adm-saga").status == "compensated"
    assert count_effects("adm-saga") == {**BOOKED, **UNDONE}
    page = html.unescape(client.get(run_url("adm-saga")).content.decode())
    assert "Saga aborted by operator" in page
    assert page.index("Undo of call call_2_1 (book_hotel)") < page.index(
        "Undo of call call_1_1 (book_flight)"
    )
    assert "Run compensated" in page and "Cancel and compensate" not in page


def test_an_aborted_saga_is_compensated_and_listed_with_its_cause():
    with pytest.raises(Exception) as info:
        saga_trip.run("plain-saga", "book a trip")
    assert type(info.value).__name__ == "SagaAborted"
    run = Run.objects.get(run_id="plain-saga")
    assert (run.status, run.last_error["code"]) == ("compensated", "saga.aborted")
    assert run.finished_at is not None
    client = Client()
    client.force_login(make_user("viewer", "durable_agents.view_run"))
    changelist = reverse("admin:durable_agents_run_changelist")
    found = client.get(changelist + "?status__exact=compensated").context["cl"].result_list
    assert [r.run_id for r in found] == ["plain-saga"]


def test_api_cancel_and_compensate_of_a_tree_compensates_its_sub_run():
    """The trip waits on its sub-run's gated car: cancel-and-compensate of the trip withdraws
    the sub-run's request and undoes the sub-run's hotel, then the trip's flight, once."""
    saga_tree_gated[0].start("go", run_id="api-tree")
    child = "api-tree/call_2_1"
    assert Run.objects.get(run_id="api-tree").status == "awaiting_approval"
    assert Run.objects.get(run_id=child).status == "awaiting_approval"
    caller = staff_with("durable_agents.cancel_run")
    response = caller.post("/runs/api-tree/cancel", {"reason": "trip off", "compensate": True})
    assert response.status_code == 200, response.content
    assert response.json() == {"run_id": "api-tree", "status": "compensated"}
    assert ApprovalRequest.objects.get(run_id=child).status == "withdrawn"
    assert Run.objects.get(run_id=child).status == "compensated"
    assert count_effects(child) == {"call_1_1": 1, "compensate:call_1_1": 1}
    assert count_effects("api-tree") == {"call_1_1": 1, "compensate:call_1_1": 1}
    # the sub-run's own cancel is refused now: it is over
    error(caller.post(f"/runs/{child}/cancel", {}), 409, "run.compensated")


def test_admin_offers_cancel_and_compensate_for_undos_only_a_sub_agent_has():
    saga_delegator.start("go", run_id="adm-tree")
    child = "adm-tree/call_1_1"
    assert Run.objects.get(run_id=child).status == "awaiting_approval"
    client = Client()
    client.force_login(make_user("operator", "durable_agents.cancel_run"))
    page = html.unescape(client.get(run_url("adm-tree")).content.decode())
    assert "Cancel and compensate" in page
    client.post(run_url("adm-tree", "cancel"), {"reason": "off", "compensate": "1"})
    assert Run.objects.get(run_id="adm-tree").status == "compensated"
    assert Run.objects.get(run_id=child).status == "compensated"
    assert count_effects(child) == {"call_1_1": 1, "compensate:call_1_1": 1}
    page = html.unescape(client.get(run_url("adm-tree")).content.decode())
    assert "Undo of call call_1_1" in page


@pytest.fixture
def redeploy():
    """``redeploy()``: ``saga-gated`` deployed again with other instructions under
    ``on_drift="error"`` (a run it started before fails for good when driven, so its saga
    aborts by itself). The original is registered again afterwards."""

    def deploy() -> da.Agent:
        return da.Agent(
            saga_gated.name,
            saga_gated.model,
            "Book the cheapest trip.",
            list(saga_gated.tools.values()),
            saga=True,
            on_drift="error",
        )

    try:
        yield deploy
    finally:
        registry.register(saga_gated)


def test_a_saga_aborting_by_itself_withdraws_its_request_on_every_path(redeploy):
    """The charge awaits approval when the saga aborts on its own (not a cancel): its request
    is withdrawn, and a late decision is refused as orphaned by the engine, the API and the
    admin alike; nothing is charged, the bookings are undone once."""
    saga_gated.start("book a trip", run_id="abort-req")
    req = ApprovalRequest.objects.get(run_id="abort-req")
    assert req.status == "pending"
    with pytest.raises(da.SagaAborted):
        redeploy().run("abort-req", None)
    assert Run.objects.get(run_id="abort-req").status == "compensated"
    assert ApprovalRequest.objects.get(pk=req.pk).status == "withdrawn"
    decisions = Decision.objects.count()
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("abort-req", req.call_id, True, by=make_user("eve", superuser=True))
    caller = staff_with("durable_agents.approve_toolcall")
    error(
        caller.post(f"/runs/abort-req/approvals/{req.call_id}", {"approved": True}),
        409,
        "approval.orphaned",
    )
    client = Client()
    client.force_login(make_user("alice", "durable_agents.approve_toolcall"))
    url = reverse("admin:durable_agents_approvalrequest_decide", args=[req.pk])
    response = client.post(url, {"decision": "approve", "shown": shown(req)})
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("approval.orphaned" in m for m in messages), messages
    assert Decision.objects.count() == decisions
    assert Run.objects.get(run_id="abort-req").status == "compensated"
    assert count_effects("abort-req") == {**BOOKED, **UNDONE}
