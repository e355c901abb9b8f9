"""The example site's stock desk (``example_project/stock.py``): an agent whose tools are the
warehouse's MCP server (``example_project/stock_server.py``, a real subprocess over stdio).
Its tools are listed from the server; its gated reservation waits in the admin's inbox, is
approved there, and fires once — counted by the server, outside the journal."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.urls import reverse

import durable_agents as da
from durable_agents.models import ApprovalRequest, Run
from example_project import agents
from example_project.stock import stock_desk, warehouse
from tests.support.admin_pages import client_for
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

INBOX = "/admin/durable_agents/inbox/"
APPROVER = ("durable_agents.view_run", "durable_agents.approve_toolcall")


def reservations() -> list[dict]:
    return agents.effects("reservation")


@pytest.fixture
def desk():
    yield stock_desk
    warehouse.close()


def test_the_desk_lists_the_servers_tools_and_a_reservation_approved_in_the_inbox_fires_once(
    desk,
):
    tools = desk.tools
    assert set(tools) == {"warehouse__stock_level", "warehouse__reserve_stock"}
    assert tools["warehouse__stock_level"].origin["class"] == "read_only"  # trusted hint
    reserve = tools["warehouse__reserve_stock"]
    assert reserve.origin["class"] == "side_effect" and reserve.safety.requires_approval
    before = len(reservations())

    with pytest.raises(da.ApprovalPending):
        desk.run("ex-stock", "Reserve two mugs for order 7.")
    request = ApprovalRequest.objects.get(run_id="ex-stock")
    assert (request.tool_name, request.arguments) == (
        "warehouse__reserve_stock",
        {"sku": "mug-7", "quantity": 2},
    )
    assert len(reservations()) == before  # nothing reserved before the decision

    client = client_for(make_user("ann", *APPROVER))
    page = client.get(INBOX).content.decode()
    assert f'id="approval-{request.pk}"' in page and "MCP server warehouse" in html.unescape(page)
    shown = html.unescape(re.search(r'name="shown" value="([^"]*)"', page).group(1))
    assert json.loads(shown) == request.arguments
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
    response = client.post(
        decide, {"decision": "approve", "back": "inbox", "shown": shown, "note": "in stock"}
    )
    assert response.status_code == 302 and response["Location"] == INBOX

    assert Run.objects.get(run_id="ex-stock").status == "finished"
    made = reservations()[before:]
    assert [(r["sku"], r["quantity"]) for r in made] == [("mug-7", 2)]
    da.resume("ex-stock")  # nothing left to run: the reservation is not made again
    assert len(reservations()) == before + 1
