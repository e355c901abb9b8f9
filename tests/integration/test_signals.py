"""Issue 14, tell people: the Django signals (``durable_agents.signals``) on PostgreSQL.

Each is sent after the transaction that wrote its fact commits, once per fact (a resume or a
repaired row sends nothing again), never when the transaction rolls back; a receiver that
raises is logged and the run goes on."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.db import transaction

import durable_agents as da
from durable_agents import signals
from durable_agents.models import Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import gated, halting, quorum
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ("approval_requested", "approval_decided", "run_halted", "run_finished", "run_failed")


class Boom(Exception):
    pass


@pytest.fixture
def sent() -> Iterator[list[tuple[str, dict]]]:
    """Every signal sent while the test runs, in order: (name, kwargs without signal)."""
    got: list[tuple[str, dict]] = []
    receivers = {}
    for name in ALL:

        def receiver(sender, signal=None, _name=name, **kwargs):
            assert sender is Run
            got.append((_name, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield got
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def names(sent: list[tuple[str, dict]]) -> list[str]:
    return [name for name, _ in sent]


def test_a_gated_run_sends_requested_then_decided_then_finished_once_each(sent):
    approver = make_user("ann", "approve_toolcall")
    with pytest.raises(da.ApprovalPending):
        gated.run("sig-1", "refund order 7")
    assert names(sent) == ["approval_requested"]
    assert sent[0][1] == {
        "run_id": "sig-1",
        "agent": "gated",
        "call_id": "call_1_1",
        "tool": "refund",
        "arguments": {"order_id": "7", "cents": 500},
        "policy": {"kind": "single"},
        "previous_arguments": None,
    }
    # A resume finds the same request pending: it is not asked (nor announced) again.
    with pytest.raises(da.ApprovalPending):
        da.resume("sig-1")
    assert names(sent) == ["approval_requested"]

    da.approve("sig-1", "call_1_1", approved=True, by=approver, note="ok")
    assert names(sent) == ["approval_requested", "approval_decided", "run_finished"]
    decided, finished = sent[1][1], sent[2][1]
    assert decided["decision"] == "approve" and decided["approved"] is True
    assert decided["by"] == "ann" and decided["note"] == "ok" and decided["tool"] == "refund"
    assert decided["arguments"] == {"order_id": "7", "cents": 500}
    assert decided["original_arguments"] is None
    assert finished["run_id"] == "sig-1" and finished["answer"] == "refunded"
    assert finished["turns"] == 2 and finished["agent"] == "gated"

    # The same decision again, a resume of the finished run, and a row put back in step
    # with the journal: nothing is sent again.
    da.approve("sig-1", "call_1_1", approved=True, by=approver, note="ok")
    da.resume("sig-1")
    Run.objects.filter(run_id="sig-1").update(status="running", answer=None)
    da.resume("sig-1")
    assert Run.objects.get(run_id="sig-1").status == "finished"
    assert names(sent) == ["approval_requested", "approval_decided", "run_finished"]


def test_a_denial_and_an_edit_say_which_decision_it_was(sent):
    approver = make_user("ann", "approve_toolcall")
    for run_id in ("sig-deny", "sig-edit"):
        with pytest.raises(da.ApprovalPending):
            gated.run(run_id, "refund order 7")
    da.deny("sig-deny", "call_1_1", by=approver, message="not without a receipt")
    da.approve("sig-edit", "call_1_1", True, by=approver, edit={"order_id": "7", "cents": 250})
    decided = {kw["run_id"]: kw for name, kw in sent if name == "approval_decided"}
    assert decided["sig-deny"]["decision"] == "deny"
    assert decided["sig-deny"]["approved"] is False
    assert decided["sig-deny"]["note"] == "not without a receipt"
    assert decided["sig-edit"]["decision"] == "edit"
    assert decided["sig-edit"]["arguments"] == {"order_id": "7", "cents": 250}
    assert decided["sig-edit"]["original_arguments"] == {"order_id": "7", "cents": 500}


def test_a_quorum_is_decided_once_when_the_quorum_is_reached(sent):
    ann = make_user("ann", "approve_toolcall", groups=("finance",))
    bob = make_user("bob", "approve_toolcall", groups=("finance",))
    with pytest.raises(da.ApprovalPending):
        quorum.run("sig-q", "pay inv-1")
    assert sent[0][1]["policy"] == {"kind": "quorum", "need": 2, "group": "finance"}
    da.approve("sig-q", "call_1_1", True, by=ann)
    assert names(sent) == ["approval_requested"]  # one of two: nothing decided yet
    da.approve("sig-q", "call_1_1", True, by=bob)
    assert names(sent) == ["approval_requested", "approval_decided", "run_finished"]
    assert sent[1][1]["by"] == "bob"
    assert sent[1][1]["tally"]["approved_by"] == ["ann", "bob"]


def test_a_halt_is_sent_once_per_halted_call(sent):
    with pytest.raises(da.OutcomeUnknown):
        halting.run("sig-h", "charge it")
    assert sent == [
        (
            "run_halted",
            {
                "run_id": "sig-h",
                "agent": "halting",
                "call_id": "call_1_1",
                "tool": "charge",
                "cause": "outcome_unknown",
            },
        )
    ]
    with pytest.raises(da.OutcomeUnknown):  # a resume finds the same halt: nothing new
        da.resume("sig-h")
    assert names(sent) == ["run_halted"]


def test_a_failure_is_sent_with_its_error_and_whether_it_will_be_retried(sent):
    short = da.Agent(
        "sig-short",
        ScriptedModel([scripted.calls(scripted.call("lookup", {"order_id": "7"}))]),
        "Answer.",
        [],
        max_turns=1,
    )
    with pytest.raises(da.BudgetError):
        short.run("sig-f", "go")
    assert names(sent) == ["run_failed"]
    failed = sent[0][1]
    assert failed["run_id"] == "sig-f" and failed["agent"] == "sig-short"
    assert failed["error"]["code"] == "budget.max_turns"
    assert failed["attempts"] == 1 and failed["will_retry"] is False


def test_nothing_is_sent_when_the_transaction_rolls_back(sent):
    approver = make_user("ann", "approve_toolcall")
    with pytest.raises(da.ApprovalPending):
        gated.run("sig-rb", "refund order 7")
    with pytest.raises(Boom), transaction.atomic():
        da.approve("sig-rb", "call_1_1", True, by=approver)
        assert names(sent) == ["approval_requested"]  # not before the commit
        raise Boom
    assert names(sent) == ["approval_requested"]
    assert Run.objects.get(run_id="sig-rb").status == "awaiting_approval"
    # Committed, it is sent after the commit, and the run (driven on commit) finishes.
    with transaction.atomic():
        da.approve("sig-rb", "call_1_1", True, by=approver)
        assert names(sent) == ["approval_requested"]
    assert names(sent) == ["approval_requested", "approval_decided", "run_finished"]


def test_a_receiver_that_raises_is_logged_and_the_run_goes_on(sent, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("mail server down")

    approver = make_user("ann", "approve_toolcall")
    signals.approval_decided.connect(broken)
    signals.run_finished.connect(broken)
    try:
        with pytest.raises(da.ApprovalPending):
            gated.run("sig-raise", "refund order 7")
        with caplog.at_level(logging.ERROR, logger="durable_agents"):
            da.approve("sig-raise", "call_1_1", True, by=approver)
    finally:
        signals.approval_decided.disconnect(broken)
        signals.run_finished.disconnect(broken)
    assert Run.objects.get(run_id="sig-raise").status == "finished"
    # The other receivers still got theirs.
    assert names(sent) == ["approval_requested", "approval_decided", "run_finished"]
    logged = [
        r
        for r in caplog.records
        if r.name == "durable_agents" and "mail server down" in str(r.exc_info)
    ]
    assert len(logged) == 2 and "the run goes on" in logged[0].getMessage()
