"""Richer decisions: deny with a message the model reads, edit-and-approve (validated,
recorded, signed, exactly what runs), tools that forbid editing, quorums that must agree."""

from __future__ import annotations

import base64
from typing import Literal

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.signing import keypair
from tests.support.wiring import wired

# What a deploy may narrow a field to (the tool builder reads plain type hints).
Allowed = Literal[5, 100]


@pytest.fixture
def wiring(store):
    keys: dict[str, list[str]] = {}
    with wired(
        eligible_approvers=lambda group: ["ann", "bob", "cat"] if group == "finance" else [],
        approver_keys=lambda who: keys.get(who, []),
    ):
        yield keys


def refund_agent(fired, name, *, quorum=None, editable=True, seen=None):
    @da.tool(requires_approval=quorum is None, approval=quorum, editable=editable)
    def refund(order: int, cents: int) -> str:
        """Refund an order."""
        fired.append((order, cents))
        return f"refunded {cents} on {order}"

    script = [
        scripted.calls(scripted.call("refund", {"order": 7, "cents": 4200})),
        scripted.text("done"),
    ]
    model = ScriptedModel(script)
    if seen is not None:
        model.on_request = lambda request: seen.append(request.messages)
    return da.Agent(name, model, "", [refund])


def _paused(agent, store, run_id="r1"):
    with pytest.raises(da.ApprovalPending):
        agent.run(run_id, "refund order 7", store=store)


def test_deny_with_a_message_is_the_result_the_model_reads(store, wiring, fired):
    seen: list = []
    _paused(refund_agent(fired, "dk-deny", seen=seen), store)
    out = da.deny("r1", "call_1_1", "ann", "refund 20.00 at most, ask the customer", store=store)
    assert out.status == "denied" and fired == []
    result = Journal(store).get("r1", "tool:call_1_1").get("result")
    assert result["message"] == "a person denied this call: refund 20.00 at most, ask the customer"
    assert "refund 20.00 at most" in repr(seen[-1])
    assert store.get_run("r1").status == "finished"


def test_edit_and_approve_runs_exactly_the_edited_arguments(store, wiring, fired):
    _paused(refund_agent(fired, "dk-edit"), store)
    out = da.approve(
        "r1", "call_1_1", True, "ann", "partial", edit={"order": 7, "cents": 2000}, store=store
    )
    assert out.status == "approved" and fired == [(7, 2000)]
    record = Journal(store).get("r1", "approval:call_1_1")
    assert record.get("arguments") == {"order": 7, "cents": 4200}
    assert record.get("edited") == {
        "arguments": {"order": 7, "cents": 2000},
        "original": {"order": 7, "cents": 4200},
        "by": ["ann"],
    }
    [decision] = store.list_decisions("r1", "call_1_1")
    assert decision.arguments == {"order": 7, "cents": 2000}
    [action] = [a for a in store.list_actions(run_id="r1") if a.action == "approve"]
    assert action.payload["edited"] == {"order": 7, "cents": 2000}
    # Approving as asked, or with another edit, is not the decision that stands.
    for other in (None, {"order": 7, "cents": 1}):
        with pytest.raises(da.ApprovalAlreadyDecided, match="other arguments") as info:
            da.approve("r1", "call_1_1", True, "bob", edit=other, store=store)
        assert info.value.details["standing"]["arguments"] == {"order": 7, "cents": 2000}
    same = da.approve("r1", "call_1_1", True, "bob", edit={"order": 7, "cents": 2000}, store=store)
    assert same.status == "approved" and fired == [(7, 2000)]


@pytest.mark.parametrize(
    ("edit", "approved"),
    [
        ({"order": 7, "cents": "lots"}, True),
        ({"order": 7}, True),
        ([1], True),
        ({"order": 7, "cents": 1}, False),
    ],
)
def test_a_bad_edit_is_refused_and_nothing_is_written(store, wiring, fired, edit, approved):
    _paused(refund_agent(fired, "dk-bad"), store)
    with pytest.raises(da.ApprovalEditInvalid):
        da.approve("r1", "call_1_1", approved, "ann", edit=edit, store=store)
    assert store.list_decisions("r1", "call_1_1") == []
    assert store.list_actions(run_id="r1") == []
    assert store.get_run("r1").status == "awaiting_approval" and fired == []


def test_a_tool_can_forbid_editing(store, wiring, fired):
    _paused(refund_agent(fired, "dk-fixed", editable=False), store)
    with pytest.raises(da.ApprovalEditInvalid, match="editable=False"):
        da.approve("r1", "call_1_1", True, "ann", edit={"order": 7, "cents": 1}, store=store)
    # An "edit" that changes nothing is a plain approval.
    da.approve("r1", "call_1_1", True, "ann", edit={"order": 7, "cents": 4200}, store=store)
    assert fired == [(7, 4200)]
    assert Journal(store).get("r1", "approval:call_1_1").get("edited") is None


def test_a_quorum_approves_one_set_of_arguments(store, wiring, fired):
    quorum = da.Quorum(need=2, group="finance")
    _paused(refund_agent(fired, "dk-quorum", quorum=quorum), store)
    edit = {"order": 7, "cents": 2000}
    assert da.approve("r1", "call_1_1", True, "ann", edit=edit, store=store).status == "pending"
    with pytest.raises(da.ApprovalArgumentsDisagree) as info:
        da.approve("r1", "call_1_1", True, "bob", store=store)
    assert info.value.details["approved_arguments"] == edit
    with pytest.raises(da.ApprovalArgumentsDisagree):
        da.approve("r1", "call_1_1", True, "bob", edit={"order": 7, "cents": 1}, store=store)
    assert [d.approver for d in store.list_decisions("r1", "call_1_1")] == ["ann"]
    # Changing one's own approval to other arguments is changing a decision: refused.
    with pytest.raises(da.ApprovalAlreadyDecided):
        da.approve("r1", "call_1_1", True, "ann", store=store)
    out = da.approve("r1", "call_1_1", True, "bob", edit=edit, store=store)
    assert out.status == "approved" and fired == [(7, 2000)]
    assert Journal(store).get("r1", "approval:call_1_1").get("edited")["by"] == ["ann", "bob"]


def test_a_signature_binds_the_edited_arguments(store, wiring, fired):
    private, public = keypair()
    wiring["bob"] = [public]
    _paused(refund_agent(fired, "dk-signed", quorum=da.Quorum(need=1, group="finance")), store)
    incarnation = Journal(store).get("r1", "run:start").get("incarnation")

    def sign(edited):
        message = da.decision_bytes(
            incarnation=incarnation,
            run_id="r1",
            call_id="call_1_1",
            tool_name="refund",
            arguments={"order": 7, "cents": 4200},
            approver_id="bob",
            approved=True,
            edited=edited,
        )
        return base64.b64encode(private.sign(message)).decode()

    edit = {"order": 7, "cents": 2000}
    for wrong in (sign(None), sign({"order": 7, "cents": 9999})):
        with pytest.raises(da.ApprovalBadSignature):
            da.approve("r1", "call_1_1", True, "bob", edit=edit, signature=wrong, store=store)
    assert store.list_decisions("r1", "call_1_1") == [] and fired == []
    out = da.approve("r1", "call_1_1", True, "bob", edit=edit, signature=sign(edit), store=store)
    assert out.status == "approved" and fired == [(7, 2000)]


def test_an_edit_todays_tool_would_refuse_is_asked_about_again(store, wiring):
    """Approved with an edit under one deploy, driven under another whose schema refuses
    the edit: nothing runs; the call is asked about again, showing the edit as before."""
    paid: list[int] = []

    def payer(limit: int):
        if limit == 100:

            @da.tool(requires_approval=True)
            def pay(cents: Allowed) -> str:
                paid.append(cents)
                return "paid"

        else:

            @da.tool(requires_approval=True)
            def pay(cents: int) -> str:  # type: ignore[misc]
                paid.append(cents)
                return "paid"

        script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
        return da.Agent("dk-redeploy", ScriptedModel(script), "", [pay])

    sent: list[str] = []
    with pytest.raises(da.ApprovalPending):
        payer(1000).run("r1", "pay me", store=store)
    with wired(dispatcher=sent.append):
        da.approve("r1", "call_1_1", True, "ann", edit={"cents": 500}, store=store)
    assert sent == ["r1"] and paid == []
    payer(100)  # the deploy: 5 or 100 only
    with pytest.raises(da.ApprovalPending):
        da.resume("r1", store=store)
    again = store.get_approval_request("r1", "call_1_1")
    assert (again.status, again.arguments, again.previous_arguments) == (
        "pending",
        {"cents": 5},
        {"cents": 500},
    )
    da.approve("r1", "call_1_1", True, "ann", edit={"cents": 100}, store=store)
    assert paid == [100] and store.get_run("r1").status == "finished"
