"""The API's approvals under approval rules (issue 42, "Where people see it"), on
PostgreSQL: each approval says which rule asked and why (``rule``), where its deadline
stands (``deadline``), an edit that moved it, and each decision who made it for whom
(``deputy``); the list costs the same number of queries whatever it holds. The refund
policy with its deadline is tests/support/rule_desk.py."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable_agents as da
from durable_agents.models import ApprovalRequest, Decision
from tests.support.api import as_session
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS, ONCALL
from tests.support.rule_desk import CALL, age, desk, escalate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

DECIDES = (
    "durable_agents.view_run",
    "durable_agents.view_approvalrequest",
    "durable_agents.approve_toolcall",
)


@pytest.fixture
def people():
    return {
        "lena": make_user("lena", *DECIDES, groups=(LEADS,)),
        "fay": make_user("fay", *DECIDES, groups=(FINANCE,)),
        "finn": make_user("finn", *DECIDES, groups=(FINANCE,)),
    }


def ask(run_id: str, cents: int) -> ApprovalRequest:
    with pytest.raises(da.ApprovalPending):
        desk.run(run_id, f"refund {cents}")
    return ApprovalRequest.objects.get(run_id=run_id)


def test_the_api_gives_each_approval_its_rule_and_deadline(people):
    lead = ask("ra-lead", 50_000)
    escalated = ask("ra-esc", 250_000)
    age("ra-esc", hours=25)
    escalate("ra-esc")
    plain_gate = None
    from tests.support.agents import gated

    with pytest.raises(da.ApprovalPending):
        gated.run("ra-plain", "refund order 7")
    plain_gate = ApprovalRequest.objects.get(run_id="ra-plain")

    caller = as_session(people["fay"])
    items = {i["run_id"]: i for i in caller.get("/approvals").json()["items"]}

    got = items["ra-lead"]
    assert got["rule"] == {
        "name": "lead",
        "explain": "amount_cents 50000 <= 100000",
        "need": 1,
        "groups": [LEADS],
        "requester": None,
        "requester_may_decide": True,
        "moved_by_edit": None,
        "text": "rule lead: amount_cents 50000 <= 100000 → 1 of support-leads",
    }
    deadline = got["deadline"]
    asked = lead.created_at
    assert deadline["remind_at"] == _iso(asked + timedelta(hours=4))
    assert deadline["escalate_at"] == _iso(asked + timedelta(hours=24))
    assert deadline["expire_at"] == _iso(asked + timedelta(days=3))
    assert (deadline["escalate_to"], deadline["on_expiry"]) == (ONCALL, "deny")
    assert (deadline["next_step"], deadline["escalated_to"]) == ("remind", None)
    assert deadline["next_at"] == deadline["remind_at"]
    assert deadline["text"].startswith("reminds its approvers in ")

    got = items["ra-esc"]
    assert got["rule"]["groups"] == [FINANCE, ONCALL] and got["rule"]["need"] == 2
    assert got["rule"]["requester_may_decide"] is False
    assert got["deadline"]["escalated_to"] == ONCALL
    assert got["deadline"]["next_step"] == "expire"
    assert got["deadline"]["text"] == "escalated to oncall · expires in 1 d 22 h, then denied"
    assert got["deadline"]["expire_at"] == _iso(
        ApprovalRequest.objects.get(pk=escalated.pk).created_at + timedelta(days=3)
    )

    # A one-rule gate (requires_approval=True) has neither.
    assert (items["ra-plain"]["rule"], items["ra-plain"]["deadline"]) == (None, None)
    assert plain_gate.policy == {"kind": "single"}

    # The run's own page in the API reads them the same way.
    detail = caller.get("/runs/ra-lead").json()
    assert detail["approvals"][0]["rule"]["name"] == "lead"

    # An edit that moved the call.
    raised = {"order_id": "7", "amount_cents": 400_000}
    da.approve("ra-lead", CALL, True, by="lena", edit=raised)
    moved = caller.get("/approvals", run_id="ra-lead").json()["items"][0]["rule"]
    assert moved["name"] == "default"
    assert moved["moved_by_edit"] == {"from_rule": "lead", "arguments": raised}


def _iso(when) -> str:
    """As the API writes a datetime (ISO 8601, to the millisecond, UTC as ``Z``)."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso(when) -> str:
    """As the API writes a datetime (ISO 8601, to the millisecond, UTC as ``Z``)."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_each_decision_says_who_made_it_for_whom(people):
    request = ask("ra-deputy", 250_000)
    da.approve("ra-deputy", CALL, True, by="fay")
    # As a delegation records it: fay's vote, made by her deputy.
    Decision.objects.filter(request=request, approver="fay").update(deputy="dan")
    items = as_session(people["finn"]).get("/approvals", run_id="ra-deputy").json()["items"]
    assert [(d["approver"], d["deputy"]) for d in items[0]["decisions"]] == [("fay", "dan")]


def test_the_list_reads_rules_in_a_constant_number_of_queries(people):
    caller = as_session(people["fay"])

    def many(n: int, start: int) -> None:
        for i in range(start, start + n):
            ask(f"ra-n-lead-{i}", 50_000)
            ask(f"ra-n-esc-{i}", 250_000)
            escalate(f"ra-n-esc-{i}")

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert caller.get("/approvals").status_code == 200
        return len(seen.captured_queries)

    many(1, 0)
    few = queries()
    many(5, 1)
    assert len(caller.get("/approvals").json()["items"]) == 12
    assert queries() == few
