"""Approvals (1-of-1, quorum, signed), halts and cancel, on the in-memory store."""

from __future__ import annotations

import base64

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash
from tests.support.signing import keypair
from tests.support.wiring import wired


@pytest.fixture
def wiring(store):
    """A finance group of three approvers, and the public keys registered to each (what the
    test adds). Runs hand over inline to ``store`` and a name is a trusted caller (the unit
    conftest)."""
    keys: dict[str, list[str]] = {}
    with wired(
        eligible_approvers=lambda group: ["ann", "bob", "cat"] if group == "finance" else [],
        approver_keys=lambda who: keys.get(who, []),
    ):
        yield keys


def gated_agent(fired, name="unit-approvals", quorum=None, crash=False):
    @da.tool(requires_approval=quorum is None, approval=quorum)
    def pay(cents: int) -> str:
        """Pay out."""
        fired.append(cents)
        if crash and fired.count(cents) == 1:
            raise Crash()
        return f"paid {cents}"

    @da.tool(read_only=True)
    def peek(x: int) -> int:
        fired.append(("peek", x))
        return x

    script = [
        scripted.calls(scripted.call("peek", {"x": 1}), scripted.call("pay", {"cents": 5})),
        scripted.text("done"),
    ]
    return da.Agent(name, ScriptedModel(script), "", [peek, pay])


def test_gated_call_pauses_after_the_other_calls_ran(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending) as info:
        a.run("r1", "pay me", store=store)
    assert fired == [("peek", 1)]
    [req] = store.list_approval_requests()
    assert (req.call_id, req.tool_name, req.arguments) == ("call_1_2", "pay", {"cents": 5})
    assert req.policy == {"kind": "single"}
    assert info.value.details["requests"][0]["arguments"] == {"cents": 5}


def test_approval_runs_the_call_once_and_first_decision_wins(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    outcome = da.approve("r1", "call_1_2", True, by="ann", note="ok", store=store)
    assert outcome.status == "approved"
    assert store.get_run("r1").status == "finished" and fired.count(5) == 1
    assert da.approve("r1", "call_1_2", True, by="bob", store=store).status == "approved"
    with pytest.raises(da.ApprovalAlreadyDecided) as info:
        da.approve("r1", "call_1_2", False, by="bob", store=store)
    assert info.value.details["standing"]["by"] == "ann"
    assert fired.count(5) == 1
    actions = [(a.actor, a.action) for a in store.list_actions(run_id="r1")]
    assert ("ann", "approve") in actions


def test_denial_is_a_rejection_the_model_reads(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    da.approve("r1", "call_1_2", False, by="ann", note="not this month", store=store)
    result = Journal(store).get("r1", "tool:call_1_2")
    assert result.get("is_error") and result.get("result")["note"] == "not this month"
    assert store.get_run("r1").status == "finished" and 5 not in fired


def test_crash_during_an_approved_call_halts_instead_of_repeating(store, wiring, fired):
    a = gated_agent(fired, crash=True)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    with pytest.raises(Crash):
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("r1", store=store)
    assert fired.count(5) == 1 and store.get_run("r1").status == "halted"


def test_quorum_counts_distinct_eligible_approvers(store, wiring, fired):
    a = gated_agent(fired, "unit-quorum", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    assert da.approve("r1", "call_1_2", True, by="ann", store=store).status == "pending"
    again = da.approve("r1", "call_1_2", True, by="ann", store=store)
    assert again.status == "pending" and again.tally["approved_by"] == ["ann"]
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r1", "call_1_2", True, by="mallory", store=store)
    done = da.approve("r1", "call_1_2", True, by="cat", store=store)
    assert done.status == "approved" and done.tally["approved_by"] == ["ann", "cat"]
    record = Journal(store).get("r1", "approval:call_1_2")
    assert record.get("tally")["need"] == 2 and fired.count(5) == 1


def test_quorum_fails_as_soon_as_it_is_unreachable(store, wiring, fired):
    a = gated_agent(fired, "unit-quorum-deny", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    assert da.approve("r1", "call_1_2", False, by="ann", store=store).status == "pending"
    out = da.approve("r1", "call_1_2", False, by="bob", store=store)
    assert out.status == "denied" and out.tally["denied_by"] == ["ann", "bob"]
    assert 5 not in fired


def _signed(private, store, run_id, args, approver="bob", ok=True, note="", incarnation=None):
    if incarnation is None:
        incarnation = Journal(store).get(run_id, "run:start").get("incarnation")
    message = da.decision_bytes(
        incarnation=incarnation,
        run_id=run_id,
        call_id="call_1_2",
        tool_name="pay",
        arguments=args,
        approver_id=approver,
        approved=ok,
        note=note,
    )
    return base64.b64encode(private.sign(message)).decode()


def test_signed_decisions_approve_this_call_and_no_other(store, wiring, fired):
    private, public = keypair()
    wiring["bob"] = [public]
    a = gated_agent(fired, "unit-signed", quorum=da.Quorum(need=1, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    other = _signed(private, store, "r1", {"cents": 500})
    with pytest.raises(da.ApprovalBadSignature):
        da.approve("r1", "call_1_2", True, by="bob", store=store, signature=other)
    with pytest.raises(da.ApprovalBadSignature):
        da.approve("r1", "call_1_2", True, by="bob", signature="bm90LWEtc2ln", store=store)
    # The note is signed too: a relay cannot change it.
    noted = _signed(private, store, "r1", {"cents": 5}, note="ok up to 5")
    with pytest.raises(da.ApprovalBadSignature):
        da.approve("r1", "call_1_2", True, "bob", "ok up to 500", signature=noted, store=store)
    # Another start of the run (another incarnation): refused.
    stale = _signed(private, store, "r1", {"cents": 5}, incarnation="0" * 32)
    with pytest.raises(da.ApprovalBadSignature):
        da.approve("r1", "call_1_2", True, by="bob", signature=stale, store=store)
    assert store.list_decisions("r1", "call_1_2") == [] and 5 not in fired
    out = da.approve("r1", "call_1_2", True, "bob", "ok up to 5", signature=noted, store=store)
    assert out.status == "approved" and fired.count(5) == 1


def test_a_signature_over_the_retired_format_is_refused_by_name(store, wiring, fired):
    import hashlib
    import struct

    from durable_agents.engine.records import encode

    private, public = keypair()
    wiring["bob"] = [public]
    a = gated_agent(fired, "unit-signed-v1", quorum=da.Quorum(need=1, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)

    def f(text):
        return struct.pack(">I", len(text.encode())) + text.encode()

    v1 = (
        b"durable_agents.approval.v1\n"
        + f("r1")
        + f("call_1_2")
        + f("pay")
        + hashlib.sha256(encode({"cents": 5}).encode()).digest()
        + f("bob")
        + b"\x01"
    )
    signature = base64.b64encode(private.sign(v1)).decode()
    with pytest.raises(da.ApprovalSignatureOutdated) as info:
        da.approve("r1", "call_1_2", True, by="bob", signature=signature, store=store)
    assert info.value.code == "approval.signature_format" and "format 2" in str(info.value)
    assert store.list_decisions("r1", "call_1_2") == [] and 5 not in fired


def test_by_must_name_someone(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    for nobody in ("", None, 42):
        with pytest.raises(da.ApproverNotEligible):
            da.approve("r1", "call_1_2", True, by=nobody, store=store)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("r1", by="", store=store)
    assert info.value.code == "actor.unknown"
    inactive = da.Actor(id="7", username="gone", active=False)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("r1", by=inactive, store=store)
    assert info.value.code == "actor.inactive"
    viewer = da.Actor(id="8", username="viewer", permissions=frozenset())
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r1", "call_1_2", True, by=viewer, store=store)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("r1", by=viewer, store=store)
    assert info.value.code == "actor.forbidden"
    assert store.get_run("r1").status == "awaiting_approval" and store.list_actions() == []
    assert store.list_decisions("r1", "call_1_2") == [] and 5 not in fired


def test_cancelled_run_orphans_its_approval(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    da.cancel("r1", by="ann", reason="customer withdrew", store=store)
    assert store.get_run("r1").status == "cancelled"
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    assert 5 not in fired
    assert store.get_approval_request("r1", "call_1_2").status == "withdrawn"


def test_restarted_run_orphans_the_old_approval(store, wiring, fired):
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    old = store.get_approval_request("r1", "call_1_2")
    store.delete_run("r1")
    with pytest.raises(da.ApprovalNotFound):  # its request went with it
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    Journal(store).forget("r1")
    store.save_approval_request(old)  # a stale request row left behind, say
    # A deleted run's id is spent: no new incarnation can take the old approval for its own.
    with pytest.raises(da.DurableAgentsError) as refused:
        gated_agent(fired).run("r1", "pay me", store=store)
    assert refused.value.code == "run.spent"
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    assert fired == [("peek", 1)]  # the read-only peek, before the delete; never the pay


def halted_run(store, fired):
    @da.tool
    def ship(box: str) -> str:
        fired.append(box)
        if len(fired) == 1:
            raise Crash()
        return "shipped"

    script = [scripted.calls(scripted.call("ship", {"box": "b1"})), scripted.text("done")]
    a = da.Agent("unit-halts", ScriptedModel(script), "", [ship])
    with pytest.raises(Crash):
        a.run("r1", "ship it", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("r1", store=store)
    return a


def test_resolving_a_halt_records_the_outcome_and_continues(store, wiring, fired):
    halted_run(store, fired)
    with pytest.raises(da.HaltTooYoung):
        da.resolve_halt("r1", "call_1_1", "x", by="ann", min_age=3600, store=store)
    rec = da.resolve_halt(
        "r1",
        "call_1_1",
        {"tracking": "Z1"},
        evidence={"carrier": "found it"},
        by="ann",
        store=store,
    )
    assert rec.get("reconciled") and rec.get("evidence") == {"carrier": "found it"}
    assert store.get_run("r1").status == "finished" and fired == ["b1"]
    assert store.list_halts(run_id="r1", status="resolved")[0].resolved_by == "ann"
    assert da.resolve_halt("r1", "call_1_1", {"tracking": "Z1"}, by="bob", store=store)
    with pytest.raises(da.HaltAlreadyResolved) as info:
        da.resolve_halt("r1", "call_1_1", {"tracking": "other"}, by="bob", store=store)
    assert info.value.details["result"] == {"tracking": "Z1"}


def test_resolving_while_a_driver_holds_the_run_is_refused(store, wiring, fired):
    halted_run(store, fired)
    store.acquire_lease("r1", "another-driver", "tok", 30)
    with pytest.raises(da.HaltInFlight):
        da.resolve_halt("r1", "call_1_1", "x", by="ann", store=store)
    assert Journal(store).get("r1", "tool:call_1_1") is None


def test_resolving_a_call_without_a_live_attempt_is_refused(store, wiring, fired):
    halted_run(store, fired)
    with pytest.raises(da.NoLiveAttempt):
        da.resolve_halt("r1", "call_9_9", "x", by="ann", store=store)
    with pytest.raises(da.ProtocolError):
        da.resolve_halt("r1", "call_1_1", {"bad": float("nan")}, by="ann", store=store)
    assert Journal(store).get("r1", "tool:call_1_1") is None


def test_a_call_runs_only_with_the_arguments_that_were_approved(store, wiring):
    """A deploy that adds a defaulted field changes what would run: the call goes back for
    approval, showing both, and runs with exactly what was approved the second time."""
    paid = []

    def payer(with_memo: bool):
        if with_memo:

            @da.tool(requires_approval=True)
            def pay(cents: int, memo: str = "") -> str:
                paid.append({"cents": cents, "memo": memo})
                return "paid"

        else:

            @da.tool(requires_approval=True)
            def pay(cents: int) -> str:  # type: ignore[misc]
                paid.append({"cents": cents})
                return "paid"

        script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
        return da.Agent("unit-exact-args", ScriptedModel(script), "", [pay])

    with pytest.raises(da.ApprovalPending):
        payer(False).run("r1", "pay me", store=store)
    payer(True)  # the deploy: workers now load the new definition
    outcome = da.approve("r1", "call_1_1", True, by="ann", store=store)
    assert outcome.status == "approved"
    assert paid == [] and store.get_run("r1").status == "awaiting_approval"
    again = store.get_approval_request("r1", "call_1_1")
    assert (again.status, again.arguments) == ("pending", {"cents": 5, "memo": ""})
    assert again.previous_arguments == {"cents": 5}
    assert Journal(store).get("r1", "approval:call_1_1").get("arguments") == {"cents": 5}
    da.approve("r1", "call_1_1", True, by="ann", store=store)
    assert paid == [{"cents": 5, "memo": ""}] and store.get_run("r1").status == "finished"


def _ann_approves_first(at_point, store):
    """At the next decision's ``before-decision`` point (past its check that approvals
    agree), Ann approves as asked first: two approvers submitting at the same moment."""
    at_point(
        "before-decision:call_1_2",
        lambda: da.approve("r1", "call_1_2", True, by="ann", store=store),
    )


def test_approvals_of_different_arguments_recorded_at_once_are_no_quorum(
    store, wiring, fired, at_point
):
    # Both pass the check that refuses an approval disagreeing with one already recorded;
    # counted, the later one is decided but approves nothing: no quorum for either.
    a = gated_agent(fired, "unit-quorum-race", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    _ann_approves_first(at_point, store)
    out = da.approve("r1", "call_1_2", True, by="bob", edit={"cents": 3}, store=store)
    assert out.status == "pending"
    assert out.tally["approved_by"] == ["ann"] and out.tally["disagreed_by"] == ["bob"]
    assert out.tally["pending"] == ["cat"]
    # The third approver agrees with the first approval: that one runs, as asked.
    done = da.approve("r1", "call_1_2", True, by="cat", store=store)
    assert done.status == "approved" and done.tally["approved_by"] == ["ann", "cat"]
    record = Journal(store).get("r1", "approval:call_1_2")
    assert "edited" not in record.body and fired == [("peek", 1), 5]


def test_a_quorum_whose_approvers_disagree_fails_saying_why(store, fired, at_point):
    a = gated_agent(fired, "unit-quorum-split", quorum=da.Quorum(need=2, group="finance"))
    with wired(eligible_approvers=lambda group: ["ann", "bob"]):
        with pytest.raises(da.ApprovalPending):
            a.run("r1", "pay me", store=store)
        _ann_approves_first(at_point, store)
        out = da.approve("r1", "call_1_2", True, by="bob", edit={"cents": 3}, store=store)
    assert out.status == "denied" and 5 not in fired and 3 not in fired
    result = Journal(store).get("r1", "tool:call_1_2").get("result")
    assert result["error"] == "denied" and result["by"] == ""
    assert "approved different arguments" in result["message"]


def test_a_failed_quorum_tells_the_model_its_deniers_note(store, fired, at_point):
    # Ann's denial is saved; before she counts, Bob's approval is saved and counted, and his
    # is the vote that writes the final decision. The model reads Ann's reason, and that
    # Ann denied.
    a = gated_agent(fired, "unit-quorum-note", quorum=da.Quorum(need=2, group="finance"))

    def bob_votes():
        assert da.approve("r1", "call_1_2", True, by="bob", store=store).status == "denied"

    with wired(eligible_approvers=lambda group: ["ann", "bob"]):
        with pytest.raises(da.ApprovalPending):
            a.run("r1", "pay me", store=store)
        at_point("after-vote:call_1_2", bob_votes)
        out = da.approve("r1", "call_1_2", False, by="ann", note="pay by cheque", store=store)
    assert out.status == "denied" and 5 not in fired
    decision = Journal(store).get("r1", "approval:call_1_2")
    # Written by Bob's approval; named for the denial the outcome rests on.
    assert decision.get("by") == "ann" and decision.get("note") == "pay by cheque"
    assert decision.get("recorded_by") == "bob" and decision.get("by_id") is None
    result = Journal(store).get("r1", "tool:call_1_2").get("result")
    assert result["by"] == "ann" and result["note"] == "pay by cheque"
    assert result["message"] == "a person denied this call: pay by cheque"


def test_a_passed_quorum_names_an_approver_it_counted_whoever_wrote_it(
    store, wiring, fired, at_point, crash_at
):
    """Cat approves an edit; past her check, Ann approves as asked, then Bob does and stops
    right after his vote is saved. Cat's vote, not counted (it disagrees with Ann's, the
    first), is the one that finds the quorum passed and writes the decision: it names Bob,
    whose approval completed it, and keeps Cat as the one who recorded it."""
    a = gated_agent(fired, "unit-quorum-by", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)

    def ann_then_bob():
        assert da.approve("r1", "call_1_2", True, by="ann", store=store).status == "pending"
        crash_at("after-vote:call_1_2")
        with pytest.raises(Crash):
            da.approve("r1", "call_1_2", True, by="bob", store=store)

    heard: list[tuple[str, dict]] = []
    store.announce = lambda event, details: heard.append((event, details))  # a listening host
    at_point("before-decision:call_1_2", ann_then_bob)
    out = da.approve("r1", "call_1_2", True, by="cat", edit={"cents": 3}, store=store)
    assert out.status == "approved" and out.tally["approved_by"] == ["ann", "bob"]
    assert out.tally["disagreed_by"] == ["cat"]
    decision = Journal(store).get("r1", "approval:call_1_2")
    assert decision.get("by") == "bob" and decision.get("recorded_by") == "cat"
    assert "edited" not in decision.body and fired == [("peek", 1), 5]
    assert [d["by"] for event, d in heard if event == "approval_decided"] == ["bob"]


@pytest.mark.parametrize("second", [True, False])
def test_the_sweep_finishes_a_quorum_whose_deciding_voter_died(
    store, wiring, fired, crash_at, second
):
    """Bob's vote decides the quorum (a second approval; or, with Ann's denial and Cat's
    before it, too few left); he dies after it is saved, before the decision is recorded.
    Nobody decides again: the sweep finishes it, as Bob deciding again would."""
    from durable_agents.engine.commands.timers import wake_timers

    a = gated_agent(fired, "unit-quorum-dead", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    if second:
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    else:
        da.approve("r1", "call_1_2", False, by="ann", note="no", store=store)
    crash_at("after-vote:call_1_2")
    with pytest.raises(Crash):
        da.approve("r1", "call_1_2", second, by="bob", note="" if second else "no", store=store)
    assert store.get_run("r1").status == "awaiting_approval"
    assert Journal(store).get("r1", "approval:call_1_2") is None
    assert wake_timers(store=store) == ["r1"]
    decision = Journal(store).get("r1", "approval:call_1_2")
    assert decision.get("approved") is second and decision.get("by") == "bob"
    assert fired.count(5) == (1 if second else 0)
    assert store.get_run("r1").status == "finished"
    assert wake_timers(store=store) == []


def test_a_repeated_vote_whose_request_is_asked_again_meanwhile_is_refused(
    store, wiring, fired, at_point
):
    """Bob repeats his vote; right after the store found it standing, a drive under new
    code asks about other arguments (which clears the votes). His repeat is refused as for
    arguments no longer asked, and writes nothing (it raised StopIteration: seed 24345)."""
    from dataclasses import replace

    a = gated_agent(fired, "unit-quorum-again", quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    assert da.approve("r1", "call_1_2", True, by="bob", store=store).status == "pending"

    def asked_again():  # what the drive under new code writes
        shown = store.get_approval_request("r1", "call_1_2")
        store.save_approval_request(
            replace(shown, arguments={"cents": 5, "memo": ""}, previous_arguments={"cents": 5})
        )

    at_point("after-vote:call_1_2", asked_again)
    with pytest.raises(da.ConfigError) as info:
        da.approve("r1", "call_1_2", True, by="bob", store=store)
    assert info.value.code == "approval.arguments_changed" and info.value.http_status == 409
    assert store.list_decisions("r1", "call_1_2") == []
    assert Journal(store).get("r1", "approval:call_1_2") is None and 5 not in fired


def test_a_decision_whose_request_is_withdrawn_before_its_vote_is_never_journaled(
    store, wiring, fired, at_point
):
    """Ann approves; after her checks and before her vote is saved, the run is cancelled
    (its request withdrawn). Her vote must not be saved, and no decision may count it: it
    is orphaned, with nothing recorded (issue 43, found by the simulator:
    ``decisions_after_close``; before, the vote was saved and a decision counting it
    journaled after the cancel)."""
    a = gated_agent(fired, "unit-closed-under")
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    at_point("before-decision:call_1_2", lambda: da.cancel("r1", by="bob", store=store))
    with pytest.raises(da.ConfigError) as info:
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    assert info.value.code == "approval.orphaned"
    assert store.list_decisions("r1", "call_1_2") == []
    assert Journal(store).get("r1", "approval:call_1_2") is None
    assert 5 not in fired


def test_a_decision_whose_request_another_decided_before_its_vote_gets_the_standing_one(
    store, wiring, fired, at_point
):
    """Ann approves; after her checks and before her vote is saved, Bob approves the same
    call: the request is closed, so Ann's vote is not saved, and she gets Bob's decision."""
    a = gated_agent(fired, "unit-decided-under")
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    at_point(
        "before-decision:call_1_2",
        lambda: da.approve("r1", "call_1_2", True, by="bob", store=store),
    )
    assert da.approve("r1", "call_1_2", True, by="ann", store=store).status == "approved"
    assert [d.approver for d in store.list_decisions("r1", "call_1_2")] == ["bob"]
    assert Journal(store).get("r1", "approval:call_1_2").get("by") == "bob"


def test_an_approval_never_hands_over_a_run_halted_after_it_queued_it(store, fired):
    """``approve`` queues the run, records the decision, then hands the run to a driver; in
    between, another driver (a *resume* pressed meanwhile) took the queued run and halted it
    on an unknown outcome. Handed over anyway, its drive would only halt again: a halted
    run is a person's (issue 43, found by the simulator's three-deep casts, fresh seed
    968357724: ``halted_never_driven``)."""
    a = gated_agent(fired)
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay me", store=store)
    sent: list[str] = []
    decide = store.set_approval_status

    def halted_meanwhile(run_id, *args, **kwargs):
        done = decide(run_id, *args, **kwargs)
        store.update_run(run_id, {"status": "halted"})  # what the other driver wrote
        return done

    with wired(dispatcher=sent.append):
        store.set_approval_status = halted_meanwhile
        da.approve("r1", "call_1_2", True, by="ann", store=store)
    assert sent == [], "a halted run was handed to a driver"
    assert store.get_run("r1").status == "halted"
    assert fired == [("peek", 1)]
