"""An approval with edits whose maker died right after the journal took it
(``after-decision:<call>``: the request still pending, the run still awaiting approval) still
decides the call, on every store: the call runs with exactly the edited arguments, once,
whoever moves the run on next — another approver (whose different decision is refused, as
``approval.already_decided``, but still hands the run over) or a resume. Also when the call
was approved before for other arguments and is asked again (a deploy changed its schema),
and for a quorum whose last approval died after its record.

Found by the simulator (seed 18561): there the engine ran the edit; the invariant had no
record of it, because the person who made it never saw their own decision return."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.errors import ApprovalArgumentsChanged
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.doubles import Crash, hooks_at_points

paid: list[dict] = []
FINANCE = ["ann", "bob", "cat"]


@pytest.fixture
def inline(store):
    """Hand runs over inline, to this store; group ``finance`` is ann, bob and cat."""
    paid.clear()
    with wiring.wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        eligible_approvers=lambda group: FINANCE if group == "finance" else [],
    ):
        yield store


def payer(*, memo: bool = False, quorum: da.Quorum | None = None) -> da.Agent:
    """A gated ``pay``; ``memo=True`` is the deploy that adds a defaulted field (a call
    approved before it is asked about again, showing both argument sets)."""
    gate = {"requires_approval": quorum is None, "approval": quorum}
    if memo:

        @da.tool(**gate)
        def pay(cents: int, memo: str = "") -> str:
            """Pay out."""
            paid.append({"cents": cents, "memo": memo})
            return "paid"

    else:

        @da.tool(**gate)
        def pay(cents: int) -> str:  # type: ignore[misc]
            """Pay out."""
            paid.append({"cents": cents})
            return "paid"

    script = [scripted.calls(scripted.call("pay", {"cents": 500})), scripted.text("done")]
    return da.Agent("conf-edit-pay", ScriptedModel(script), "Pay.", [pay])


def decisions(store, run_id: str) -> dict[str, dict]:
    return {
        r.name: r.body for r in Journal(store).records(run_id) if r.name.startswith("approval:")
    }


def edit_then_die(store, crash_at, run_id: str, edit: dict, by: str = "ann") -> None:
    request = store.get_approval_request(run_id, "call_1_1")
    crash_at("after-decision:call_1_1")
    with pytest.raises(Crash):
        da.approve(
            run_id, "call_1_1", True, by=by, arguments=request.arguments, edit=edit, store=store
        )
    assert store.get_run(run_id).status == "awaiting_approval"
    assert store.get_approval_request(run_id, "call_1_1").status == "pending"
    assert paid == []


@pytest.mark.parametrize("then", ["other-approver", "resume"])
def test_an_edit_whose_maker_died_runs_exactly_once(inline, crash_at, then):
    store = inline
    with pytest.raises(da.ApprovalPending):
        payer().run("e1", "pay", store=store)
    edit_then_die(store, crash_at, "e1", {"cents": 200})
    if then == "other-approver":
        # bob approves as asked: not the decision that stands (he must not believe 500 is
        # paid), yet the run goes on with ann's.
        with pytest.raises(da.ApprovalAlreadyDecided, match="other arguments") as info:
            da.approve("e1", "call_1_1", True, by="bob", arguments={"cents": 500}, store=store)
        assert info.value.details["standing"]["arguments"] == {"cents": 200}
    else:
        assert da.resume("e1", store=store).answer == "done"
    assert paid == [{"cents": 200}]
    assert store.get_run("e1").status == "finished"
    assert store.get_approval_request("e1", "call_1_1").status == "approved"
    assert Journal(store).get("e1", "attempt:call_1_1:1").get("arguments") == {"cents": 200}


@pytest.mark.parametrize("then", ["other-approver", "resume"])
def test_an_edit_of_a_call_asked_again_whose_maker_died_runs_the_edit(inline, crash_at, then):
    """The seed's schedule: approved as ``{cents: 500}``; a deploy adds ``memo``, so the
    drive asks again about ``{cents: 500, memo: ""}``; ann approves that with an edit and
    dies; then bob (or a resume) moves the run on. What runs is ann's edit — not the first
    approval's arguments, not the re-asked ones."""
    store = inline
    with pytest.raises(da.ApprovalPending):
        payer().run("e2", "pay", store=store)
    payer(memo=True)  # the deploy lands before the first decision's drive
    da.approve("e2", "call_1_1", True, by="bob", arguments={"cents": 500}, store=store)
    request = store.get_approval_request("e2", "call_1_1")
    assert (request.arguments, request.previous_arguments) == (
        {"cents": 500, "memo": ""},
        {"cents": 500},
    )
    assert paid == []
    edit = {"cents": 250, "memo": "half now"}
    edit_then_die(store, crash_at, "e2", edit)
    if then == "other-approver":
        with pytest.raises(da.ApprovalAlreadyDecided, match="other arguments"):
            da.approve("e2", "call_1_1", True, by="bob", arguments=request.arguments, store=store)
    else:
        assert da.resume("e2", store=store).answer == "done"
    assert paid == [edit]
    assert store.get_run("e2").status == "finished"
    assert store.get_approval_request("e2", "call_1_1").status == "approved"
    again = [d for n, d in decisions(store, "e2").items() if n != "approval:call_1_1"]
    assert [d["edited"]["arguments"] for d in again] == [edit]


@pytest.mark.parametrize("then", ["third-approver", "same-edit", "resume"])
def test_a_quorum_whose_last_edited_approval_died_runs_the_edit_once(inline, crash_at, then):
    """2 of ann, bob, cat: ann approves with an edit, bob approves the same edit and dies
    after its record. cat's plain approval is refused (the quorum approved other arguments)
    but moves the run on; cat approving the same edit is the standing decision; so is a
    resume. Exactly the edit runs, once."""
    store = inline
    agent = payer(quorum=da.Quorum(need=2, group="finance"))
    with pytest.raises(da.ApprovalPending):
        agent.run("e3", "pay", store=store)
    edit = {"cents": 120}
    assert da.approve("e3", "call_1_1", True, by="ann", edit=edit, store=store).status == "pending"
    edit_then_die(store, crash_at, "e3", edit, by="bob")
    record = decisions(store, "e3")["approval:call_1_1"]
    assert record["edited"] == {"arguments": edit, "original": {"cents": 500}, "by": ["ann", "bob"]}
    if then == "third-approver":
        with pytest.raises(da.ApprovalAlreadyDecided, match="other arguments"):
            da.approve("e3", "call_1_1", True, by="cat", store=store)
    elif then == "same-edit":
        out = da.approve("e3", "call_1_1", True, by="cat", edit=edit, store=store)
        assert out.status == "approved"
    else:
        assert da.resume("e3", store=store).answer == "done"
    assert paid == [edit]
    assert store.get_run("e3").status == "finished"
    assert store.get_approval_request("e3", "call_1_1").status == "approved"
    # Nothing more runs, whoever decides next.
    with pytest.raises(da.ApprovalAlreadyDecided):
        da.approve("e3", "call_1_1", False, by="cat", store=store)
    assert paid == [edit]


def test_quorum_approvals_of_different_arguments_at_once_run_neither(inline, monkeypatch):
    """Ann approves as asked and Bob with an edit, at the same moment: both pass the check
    that refuses an approval disagreeing with one recorded before, and both are recorded.
    Counted in the order they were recorded, Bob's approves nothing; Cat's approval of what
    Ann approved makes the quorum, and the call runs as asked, once. (The simulator found
    the edit running on one approval: quorum casts, seed 105.)"""
    store = inline
    with pytest.raises(da.ApprovalPending):
        payer(quorum=da.Quorum(need=2, group="finance")).run("q1", "pay", store=store)
    hooks_at_points(monkeypatch)(  # past bob's checks, before his vote is saved
        "before-decision:call_1_1",
        lambda: da.approve("q1", "call_1_1", True, by="ann", arguments={"cents": 500}, store=store),
    )
    out = da.approve(
        "q1",
        "call_1_1",
        True,
        by="bob",
        arguments={"cents": 500},
        edit={"cents": 200},
        store=store,
    )
    assert out.status == "pending" and out.tally["disagreed_by"] == ["bob"]
    assert out.tally["approved_by"] == ["ann"] and paid == []
    with pytest.raises(da.ApprovalArgumentsDisagree):
        da.approve("q1", "call_1_1", True, by="cat", edit={"cents": 200}, store=store)
    done = da.approve("q1", "call_1_1", True, by="cat", arguments={"cents": 500}, store=store)
    assert done.status == "approved" and paid == [{"cents": 500}]
    assert "edited" not in decisions(store, "q1")["approval:call_1_1"]


def test_a_quorum_vote_never_lands_on_a_request_asked_again_under_it(inline, monkeypatch):
    """Ann is shown ``{cents: 500}``; between her check and her vote's write, a drive under
    new code asks about ``{cents: 500, memo: ""}`` (the request row is replaced and its
    votes cleared). Her vote must not count for arguments she was never shown: Bob's
    approval of the new ones alone is no quorum."""
    store = inline
    quorum = da.Quorum(need=2, group="finance")
    with pytest.raises(da.ApprovalPending):
        payer(quorum=quorum).run("q2", "pay", store=store)

    def asked_again_first():  # past ann's checks, before her vote is saved
        payer(memo=True, quorum=quorum)  # the deploy; a drive asks again
        with pytest.raises(da.ApprovalPending):
            da.resume("q2", store=store)
        assert store.get_approval_request("q2", "call_1_1").arguments == {
            "cents": 500,
            "memo": "",
        }

    hooks_at_points(monkeypatch)("before-decision:call_1_1", asked_again_first)
    with pytest.raises(ApprovalArgumentsChanged):
        da.approve("q2", "call_1_1", True, by="ann", arguments={"cents": 500}, store=store)
    asked = {"cents": 500, "memo": ""}
    out = da.approve("q2", "call_1_1", True, by="bob", arguments=asked, store=store)
    assert out.status == "pending" and out.tally["approved_by"] == ["bob"] and paid == []
    done = da.approve("q2", "call_1_1", True, by="ann", arguments=asked, store=store)
    assert done.status == "approved" and paid == [{"cents": 500, "memo": ""}]


def test_the_sweep_finishes_a_quorum_whose_deciding_voter_died(inline, crash_at):
    """Bob's approval makes the quorum; he dies after it is saved, before the decision is
    recorded, and nobody decides again: the sweep finishes it (one read of the pending
    requests, one of each quorum request's votes), and the call runs once."""
    from durable_agents.engine.commands.timers import wake_timers

    store = inline
    with pytest.raises(da.ApprovalPending):
        payer(quorum=da.Quorum(need=2, group="finance")).run("q3", "pay", store=store)
    da.approve("q3", "call_1_1", True, by="ann", store=store)
    crash_at("after-vote:call_1_1")  # bob's vote is saved, nothing counted nor journaled
    with pytest.raises(Crash):
        da.approve("q3", "call_1_1", True, by="bob", store=store)
    assert "approval:call_1_1" not in decisions(store, "q3") and paid == []
    assert "q3" in wake_timers(store=store)
    assert decisions(store, "q3")["approval:call_1_1"]["by"] == "bob"
    assert paid == [{"cents": 500}] and store.get_run("q3").status == "finished"
    assert "q3" not in wake_timers(store=store)
