"""Approval rules on PostgreSQL with real users and groups (issue 42): the support desk's
refund policy (tests/support/rule_agents.py). Small refunds go through with an automatic
decision naming the rule, too-big ones are refused with the rule's message, mid-size ones
ask one support lead, the rest two people from finance — never the person who asked. An
approver's edit is decided under the rule of the edited arguments; a recorded rule is read
back, never evaluated again (a deploy that changes the rules). Effects are counted outside
the journal (``count_effects``)."""

from __future__ import annotations

import dataclasses

import pytest

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.journal import Journal
from durable_agents.models import ApprovalRequest, JournalEntry, Run
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS, refund, refunds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CALL = "call_1_1"


@pytest.fixture
def people():
    return {
        "lena": make_user("lena", "approve_toolcall", groups=(LEADS,)),
        "leo": make_user("leo", "approve_toolcall", groups=(LEADS,)),
        "fay": make_user("fay", "approve_toolcall", groups=(FINANCE,)),
        "finn": make_user("finn", "approve_toolcall", groups=(FINANCE,)),
        "fred": make_user("fred", "approve_toolcall", "add_run", groups=(FINANCE,)),
    }


def _journal(run_id: str) -> dict:
    return {r.name: r for r in Journal(site_store()).records(run_id)}


def test_a_small_refund_goes_through_with_one_automatic_decision_naming_the_rule(people):
    before = JournalEntry.objects.count()
    result = refunds.run("rr-small", "refund 4000")
    assert result.answer.startswith("done:")
    assert count_effects("rr-small") == {CALL: 1}
    assert not ApprovalRequest.objects.filter(run_id="rr-small").exists()
    decision = _journal("rr-small")[f"approval:{CALL}"]
    assert decision.get("automatic") is True and decision.get("approved") is True
    assert (decision.get("by"), decision.get("rule")) == ("rule:small", "small")
    assert decision.get("explain") == "amount_cents 4000 <= 5000"
    assert decision.get("fingerprint") == refund.safety.approval.fingerprint
    # One record more than an ungated call: the automatic decision.
    names = [r.name for r in Journal(site_store()).records("rr-small")]
    assert [n for n in names if n.startswith(("approval:", "rule:"))] == [f"approval:{CALL}"]
    assert JournalEntry.objects.count() > before


def test_a_too_big_refund_is_refused_with_the_rules_message_and_nobody_is_asked(people):
    result = refunds.run("rr-big", "refund 600000")
    assert count_effects("rr-big") == {}
    assert not ApprovalRequest.objects.filter(run_id="rr-big").exists()
    told = _journal("rr-big")[f"tool:{CALL}"]
    assert told.get("is_error") is True
    assert "ask the customer to call" in str(told.get("result"))
    assert "too-big" in str(told.get("result"))
    assert "call" in result.answer


def test_a_mid_size_refund_asks_one_support_lead_and_nobody_else(people):
    with pytest.raises(da.ApprovalPending):
        refunds.run("rr-lead", "refund 50000")
    request = ApprovalRequest.objects.get(run_id="rr-lead")
    assert request.policy["kind"] == "single" and request.policy["group"] == LEADS
    assert request.policy["rule"] == "lead"
    assert _journal("rr-lead")[f"rule:{CALL}"].get("rule") == "lead"
    with pytest.raises(da.ApproverNotEligible):
        da.approve("rr-lead", CALL, True, by="fay")  # finance, not a lead
    assert count_effects("rr-lead") == {}
    outcome = da.approve("rr-lead", CALL, True, by="lena")
    assert outcome.status == "approved"
    assert Run.objects.get(pk="rr-lead").status == "finished"
    assert count_effects("rr-lead") == {CALL: 1}


def test_a_large_refund_needs_two_of_finance_and_never_the_person_who_asked(people):
    run_id = refunds.start("refund 250000", by=people["fred"])
    with pytest.raises(da.ApproverNotEligible, match="separation of duties"):
        da.approve(run_id, CALL, True, by="fred")
    assert da.approve(run_id, CALL, True, by="fay").status == "pending"
    assert count_effects(run_id) == {}
    assert da.approve(run_id, CALL, True, by="finn").status == "approved"
    assert count_effects(run_id) == {CALL: 1}


def test_an_edit_is_decided_under_the_rule_of_the_edited_arguments(people):
    """A lead raises 400 to 4,000 EUR: the call moves to two of finance before it fires; a
    lead lowering 1,000 to 40 EUR needs nothing more; an edit to 6,000 EUR is refused."""
    with pytest.raises(da.ApprovalPending):
        refunds.run("rr-edit", "refund 40000")
    raised = {"order_id": "7", "amount_cents": 400_000}
    outcome = da.approve("rr-edit", CALL, True, by="lena", edit=raised)
    assert outcome.status == "pending"  # lena's vote is not finance's
    assert count_effects("rr-edit") == {}
    request = ApprovalRequest.objects.get(run_id="rr-edit")
    assert (request.policy["kind"], request.policy["need"]) == ("quorum", 2)
    assert request.policy["group"] == FINANCE and request.policy["rule"] == "default"
    assert request.policy["moved_by_edit"]["from"] == "lead"
    with pytest.raises(da.ApprovalArgumentsDisagree):
        da.approve("rr-edit", CALL, True, by="fay")  # the original arguments, not the edit
    assert da.approve("rr-edit", CALL, True, by="fay", edit=raised).status == "pending"
    assert da.approve("rr-edit", CALL, True, by="finn", edit=raised).status == "approved"
    assert count_effects("rr-edit") == {CALL: 1}
    ran = _journal("rr-edit")[f"tool:{CALL}"].get("result")
    assert ran == {"order_id": "7", "refunded_cents": 400_000}

    with pytest.raises(da.ApprovalPending):
        refunds.run("rr-lower", "refund 100000")
    lowered = {"order_id": "7", "amount_cents": 4_000}
    assert da.approve("rr-lower", CALL, True, by="leo", edit=lowered).status == "approved"
    assert count_effects("rr-lower") == {CALL: 1}

    with pytest.raises(da.ApprovalPending):
        refunds.run("rr-huge", "refund 100000")
    before = JournalEntry.objects.filter(run_id="rr-huge").count()
    with pytest.raises(da.ApprovalEditInvalid, match="too-big"):
        da.approve("rr-huge", CALL, True, by="leo", edit={"order_id": "7", "amount_cents": 600_000})
    assert JournalEntry.objects.filter(run_id="rr-huge").count() == before
    assert ApprovalRequest.objects.get(run_id="rr-huge").status == "pending"


def test_a_deploy_that_changes_the_rules_never_changes_a_recorded_rule(people, monkeypatch):
    with pytest.raises(da.ApprovalPending):
        refunds.run("rr-deploy", "refund 50000")
    laxer = da.Rules([], default=da.allow)  # a deploy that would let everything through
    monkeypatch.setattr(refund, "safety", dataclasses.replace(refund.safety, approval=laxer))
    with pytest.raises(da.ApprovalPending):
        da.resume("rr-deploy")
    assert count_effects("rr-deploy") == {}
    assert ApprovalRequest.objects.get(run_id="rr-deploy").policy["rule"] == "lead"
    da.approve("rr-deploy", CALL, True, by="lena")
    assert count_effects("rr-deploy") == {CALL: 1}
    # Replay reads the recorded decision, never the rules.
    assert da.replay("rr-deploy").identical
