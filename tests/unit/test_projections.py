"""The journal is the truth; run rows, approval requests and halt rows are projections of
it that a drive, a repeated command or recovery puts back in step. Each test here is a
schedule the simulator (tests/simulation) found breaking that, replayed by hand on the
in-memory store: a command stopped between its journal record and its rows, a fork driven
before it was copied, a fork of a fork losing its message, a decision landing on arguments
nobody was shown."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import failpoints
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.errors import StorageError
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


def names(store, run_id):
    return [r.name for r in Journal(store).records(run_id)]


def shipper(fired, name="u-proj-ship", crash=False):
    """Two turns: ``ship`` (a side effect, not safe to repeat), then the answer."""

    @da.tool
    def ship(box: str) -> str:
        fired.append(box)
        if crash and len(fired) == 1:
            raise Crash("inside ship")
        return f"shipped {box}"

    script = [scripted.calls(scripted.call("ship", {"box": "b1"})), scripted.text("sent")]
    return da.Agent(name, ScriptedModel(script), "Ship.", [ship])


def payer(paid, name="u-proj-pay", memo=False, twice=False):
    """A gated ``pay``; ``memo=True`` is the deploy that adds a defaulted field; ``twice=True``
    asks for a second payment after the first."""
    if memo:

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
    if twice:
        script.insert(1, scripted.calls(scripted.call("pay", {"cents": 6})))
    return da.Agent(name, ScriptedModel(script), "Pay.", [pay])


def asked_again_after_a_stopped_approval(store, crash_at, paid):
    """Ann approved ``{cents: 5}`` and died before moving the run on; a drive under new code
    (a defaulted ``memo``) asked again about ``{cents: 5, memo: ""}``: that request."""
    with pytest.raises(da.ApprovalPending):
        payer(paid, twice=True).run("r1", "pay me", store=store)
    crash_at("after-decision:call_1_1")
    with pytest.raises(Crash):
        da.approve("r1", "call_1_1", True, by="ann", store=store)
    payer(paid, memo=True, twice=True)
    assert drive_quietly("r1", store=store) == "paused"
    asked = store.get_approval_request("r1", "call_1_1")
    assert asked.previous_arguments == {"cents": 5} and asked.status == "pending"
    return asked


class DiesInTheTool(list):
    """A payment ledger whose tool dies right after its effect: the call's attempt stays
    claimed, with no result (a worker killed inside the tool)."""

    def append(self, item):
        super().append(item)
        raise Crash()


# -- forks ------------------------------------------------------------------------------


def test_a_fork_whose_maker_died_before_copying_is_never_driven_from_scratch(store, monkeypatch):
    fired: list[str] = []
    agent = shipper(fired)
    agent.run("src", "go", store=store)
    assert fired == ["b1"]

    real = Journal.write

    def write(self, run_id, name, body, **kwargs):
        if run_id == "src.fork-1":
            raise Crash("before the first record of the copy")
        return real(self, run_id, name, body, **kwargs)

    monkeypatch.setattr(Journal, "write", write)
    with pytest.raises(Crash):
        da.fork("src", 0, store=store)
    row = store.get_run("src.fork-1")
    assert row.status == "failed" and row.last_error["code"] == "history.fork_incomplete"
    assert not row.last_error["retryable"] and "fork again" in row.last_error["message"]
    assert recover(store=store) == [], "recovery leaves a half-made fork alone"
    with pytest.raises(da.ConfigError) as info:
        da.resume("src.fork-1", store=store)
    assert info.value.code == "history.fork_incomplete"
    assert fired == ["b1"], "the source's side effect did not run again"
    monkeypatch.setattr(Journal, "write", real)
    assert names(store, "src.fork-1") == []
    # A row an older version left queued with nothing copied is refused the same way.
    store.update_run("src.fork-1", {"status": "queued", "last_error": None})
    assert drive_quietly("src.fork-1", store=store) == "failed"
    assert fired == ["b1"] and store.get_run("src.fork-1").status == "failed"
    assert recover(store=store) == []


def test_a_driver_handed_a_fork_while_it_is_copied_finds_it_busy(store, monkeypatch):
    fired: list[str] = []
    agent = shipper(fired)
    agent.run("src", "go", store=store)
    seen: list[str] = []
    real = Journal.write

    def write(self, run_id, name, body, **kwargs):
        if run_id == "src.fork-1" and name == "fork":
            seen.append(drive_quietly("src.fork-1", store=store))
        return real(self, run_id, name, body, **kwargs)

    monkeypatch.setattr(Journal, "write", write)
    fork_id = da.fork("src", 0, store=store)
    assert seen == ["busy"]
    assert names(store, fork_id)[1] == "fork", "nothing was driven before the copy"
    assert store.get_run(fork_id).status == "queued"
    assert store.get_run(fork_id).last_error is None
    assert da.resume(fork_id, store=store).answer == "sent"
    assert fired == ["b1", "b1"], "the fork's own timeline ships once"


def test_a_fork_cancelled_before_its_maker_took_it_is_not_copied_into(store, monkeypatch):
    fired: list[str] = []
    shipper(fired).run("src", "go", store=store)
    real = failpoints.hit

    def hit(name: str) -> None:
        if name == "after-fork-row":  # the maker pauses; a person cancels the new row
            da.cancel("src.fork-1", by="ann", store=store)
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    with pytest.raises(da.ConfigError) as info:
        da.fork("src", 0, store=store)
    assert info.value.code == "history.fork_cancelled"
    assert names(store, "src.fork-1") == ["@journal", "run:cancelled"]
    assert store.get_run("src.fork-1").status == "cancelled"
    assert recover(store=store) == [] and fired == ["b1"]


def test_a_fork_of_a_fork_at_the_same_step_sends_both_messages(store):
    seen = []
    model = ScriptedModel([scripted.text("ok")] * 3, on_request=seen.append)
    agent = da.Agent("u-proj-talk", model, "", [])
    agent.run("src", "hello", store=store)
    first = da.fork("src", 0, da.Patch(append_user="also A"), store=store)
    second = da.fork(first, 0, da.Patch(append_user="and B"), store=store)
    seen.clear()
    agent.run(second, None, store=store)
    assert [m.content for m in seen[0].messages] == ["hello", "also A", "and B"]
    assert [m.content for m in da.as_of(second, 0, store=store)] == ["hello", "also A", "and B"]
    # The fork in between keeps its own transcript.
    assert [m.content for m in da.as_of(first, 0, store=store)] == ["hello", "also A"]


# -- a resolution stopped after its record ---------------------------------------------


def halted(store, fired):
    agent = shipper(fired, crash=True)
    with pytest.raises(Crash):
        agent.run("r1", "go", store=store)
    with pytest.raises(da.OutcomeUnknown):
        agent.run("r1", None, store=store)
    assert store.get_run("r1").status == "halted"
    return agent


def test_a_resolution_stopped_after_its_record_is_finished_by_resolving_again(store, crash_at):
    fired: list[str] = []
    halted(store, fired)
    crash_at("after-resolution:call_1_1")
    with pytest.raises(Crash):
        da.resolve_halt("r1", "call_1_1", "shipped b1", by="ann", store=store)
    [halt] = store.list_halts(run_id="r1")
    assert halt.status == "open" and store.get_run("r1").status == "halted"
    # Asked again with the same outcome: the rows follow the journal, the run goes on.
    record = da.resolve_halt("r1", "call_1_1", "shipped b1", by="ann", store=store)
    assert record.get("result") == "shipped b1"
    assert store.list_halts(run_id="r1") == []
    [halt] = store.list_halts(run_id="r1", status=None)
    assert halt.status == "resolved" and halt.resolution["result"] == "shipped b1"
    assert store.get_run("r1").status == "finished" and fired == ["b1"]


def test_a_stopped_resolution_is_finished_by_another_outcome_refused_or_by_a_drive(store, crash_at):
    fired: list[str] = []
    halted(store, fired)
    crash_at("after-resolution:call_1_1")
    with pytest.raises(Crash):
        da.resolve_halt("r1", "call_1_1", "shipped b1", by="ann", store=store)
    with pytest.raises(da.HaltAlreadyResolved):
        da.resolve_halt("r1", "call_1_1", "lost", is_error=True, by="bob", store=store)
    [halt] = store.list_halts(run_id="r1", status=None)
    assert (halt.status, halt.resolution["result"]) == ("resolved", "shipped b1")
    assert store.get_run("r1").status == "finished" and fired == ["b1"]


def test_a_drive_closes_the_halt_a_stopped_resolution_left_open(store, crash_at):
    fired: list[str] = []
    halted(store, fired)
    crash_at("after-resolution:call_1_1")
    with pytest.raises(Crash):
        da.resolve_halt("r1", "call_1_1", "shipped b1", by="ann", store=store)
    assert da.resume("r1", store=store).answer == "sent"  # a person presses "resume"
    assert store.list_halts(run_id="r1") == [] and fired == ["b1"]


def test_the_sweep_finishes_a_stopped_resolution_nobody_asks_again(store, crash_at):
    fired: list[str] = []
    halted(store, fired)
    crash_at("after-resolution:call_1_1")
    with pytest.raises(Crash):
        da.resolve_halt("r1", "call_1_1", "shipped b1", by="ann", store=store)
    assert store.get_run("r1").status == "halted"
    assert wake_timers(store=store) == ["r1"]
    [halt] = store.list_halts(run_id="r1", status=None)
    assert (halt.status, halt.resolution["result"]) == ("resolved", "shipped b1")
    assert store.get_run("r1").status == "finished" and fired == ["b1"]
    assert wake_timers(store=store) == []


# -- a decision stopped after its record -----------------------------------------------


def test_a_decision_stopped_after_its_record_is_finished_by_deciding_again(store, crash_at):
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    crash_at("after-decision:call_1_1")
    with pytest.raises(Crash):
        da.approve("r1", "call_1_1", True, by="ann", store=store)
    assert store.get_run("r1").status == "awaiting_approval"
    assert store.get_approval_request("r1", "call_1_1").status == "pending"
    outcome = da.approve("r1", "call_1_1", True, by="bob", store=store)
    assert outcome.status == "approved"
    assert store.get_approval_request("r1", "call_1_1").status == "approved"
    assert store.get_run("r1").status == "finished" and paid == [{"cents": 5}]
    with pytest.raises(da.ConfigError) as info:  # another verdict is still refused
        da.approve("r1", "call_1_1", False, by="bob", store=store)
    assert info.value.code == "approval.already_decided"


def test_a_decision_finished_by_another_approver_meanwhile_stands(store, monkeypatch):
    """Between ann's journal record and her marking the request, bob approves too: his
    repeated decision finishes ann's from the journal. Ann's still stands (it is not
    mistaken for one a cancel orphaned)."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    real = failpoints.hit
    seen: list[str] = []

    def hit(name: str) -> None:
        if name == "after-decision:call_1_1" and not seen:
            seen.append(da.approve("r1", "call_1_1", True, by="bob", store=store).status)
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    assert da.approve("r1", "call_1_1", True, by="ann", store=store).status == "approved"
    assert seen == ["approved"]
    assert store.get_approval_request("r1", "call_1_1").status == "approved"
    assert store.get_run("r1").status == "finished" and paid == [{"cents": 5}]


@pytest.mark.parametrize("approved", [True, False])
def test_the_sweep_finishes_a_stopped_decision_nobody_makes_again(store, crash_at, approved):
    """Ann's decision is journaled, then her process dies before the run is queued; nobody
    decides again. The run awaits nothing a person can decide (the decision stands), so the
    sweep of paused runs finishes it from the journal, as deciding again would (seed
    42296)."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    crash_at("after-decision:call_1_1")
    with pytest.raises(Crash):
        da.approve("r1", "call_1_1", approved, by="ann", store=store)
    assert store.get_run("r1").status == "awaiting_approval"
    assert recover(store=store) == []  # recovery leaves runs paused on a person alone
    assert wake_timers(store=store) == ["r1"]
    request = store.get_approval_request("r1", "call_1_1")
    assert request.status == ("approved" if approved else "denied")
    assert store.get_run("r1").status == "finished"
    assert paid == ([{"cents": 5}] if approved else [])
    assert wake_timers(store=store) == []


def test_the_sweep_hands_over_a_run_left_awaiting_a_decision_already_made(
    store, clock, monkeypatch
):
    """The drive pausing on a request has written it; ann's approval lands before the drive
    moves the row (her hand-over finds the run running and its drive busy). The drive
    pauses, looks again, finds the decision, takes the run again, and dies before it moves
    the row on (a crash, or a freeze longer than its lease). The run awaits approval with
    nothing left to decide: recovery leaves runs paused on a person alone, and the request
    is decided, so the sweep hands the run over (the simulator's seed 165, issue 43)."""
    paid: list[dict] = []
    real_acquire = store.acquire_lease
    armed: list[int] = []

    def acquire(*args, **kwargs):
        got = real_acquire(*args, **kwargs)
        if armed and got:
            armed.clear()
            raise Crash("after taking the run again")
        return got

    real_save = store.save_approval_request

    def save(request, **kwargs):
        saved = real_save(request, **kwargs)
        if saved and not armed:  # before the drive moves the row: ann approves
            assert da.approve("r1", "call_1_1", True, by="ann", store=store).status == "approved"
            armed.append(1)
        return saved

    monkeypatch.setattr(store, "acquire_lease", acquire)
    monkeypatch.setattr(store, "save_approval_request", save)
    with pytest.raises(Crash):
        payer(paid).run("r1", "pay me", store=store)
    assert store.get_run("r1").status == "awaiting_approval"
    assert store.get_approval_request("r1", "call_1_1").status == "approved"
    clock.advance(31.0)  # the dead driver's lease lapses
    assert recover(store=store) == []  # recovery leaves runs paused on a person alone
    assert wake_timers(store=store) == ["r1"]
    assert store.get_run("r1").status == "finished" and paid == [{"cents": 5}]
    assert wake_timers(store=store) == []


def test_the_sweep_leaves_a_request_nobody_decided_pending(store):
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    assert wake_timers(store=store) == []
    assert store.get_approval_request("r1", "call_1_1").status == "pending"
    assert store.get_run("r1").status == "awaiting_approval" and paid == []


def test_a_drive_marks_the_request_a_stopped_decision_left_pending(store, crash_at):
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    crash_at("after-decision:call_1_1")
    with pytest.raises(Crash):
        da.approve("r1", "call_1_1", False, by="ann", store=store)
    assert da.resume("r1", store=store).answer == "done"
    assert store.get_approval_request("r1", "call_1_1").status == "denied" and paid == []


# -- a decision is for the arguments shown ---------------------------------------------


def test_a_decision_on_a_call_that_got_its_result_meanwhile_is_refused(store, crash_at):
    """Ann approved ``{cents: 5}`` and died before moving the run on; a drive under new code
    (a defaulted ``memo``) asked again about ``{cents: 5, memo: ""}``. Bob reads that request,
    and before his denial is written a worker still on the old code carries out ann's
    approval: the call is paid and has its result. Bob's denial can change nothing any more:
    it is refused as orphaned, never journaled nor reported as a denial of a call that ran
    (seed 81157)."""
    paid: list[dict] = []
    asked = asked_again_after_a_stopped_approval(store, crash_at, paid)
    real = store.get_approval_request

    def get_approval_request(run_id, call_id):
        request = real(run_id, call_id)
        store.get_approval_request = real
        payer(paid, twice=True)  # bob has read it; a worker on the old code drives the run
        assert drive_quietly("r1", store=store) == "paused"
        return request

    store.get_approval_request = get_approval_request
    with pytest.raises(da.ApprovalOrphaned):
        da.deny("r1", "call_1_1", by="bob", message="no", arguments=asked.arguments, store=store)
    assert paid == [{"cents": 5}]
    assert [n for n in names(store, "r1") if n.startswith("approval:")] == ["approval:call_1_1"]
    assert store.get_approval_request("r1", "call_1_1").status == "withdrawn"


def test_a_decision_on_a_call_being_run_under_an_earlier_one_is_refused(store, crash_at):
    """As above, but bob denies while the worker on the old code is inside the tool (its
    attempt claimed, no result yet): the denial could only be reported, never carried out,
    so it is refused as orphaned, not journaled and reported as a denial of a call that
    runs."""

    class Paid(list):
        during = None  # run once, inside the tool, after its effect

        def append(self, item):
            super().append(item)
            hook, self.during = self.during, None
            if hook is not None:
                hook()

    paid = Paid()
    asked = asked_again_after_a_stopped_approval(store, crash_at, paid)
    refused = []

    def bob_denies():
        with pytest.raises(da.ApprovalOrphaned, match="being run under an earlier decision"):
            da.deny(
                "r1", "call_1_1", by="bob", message="no", arguments=asked.arguments, store=store
            )
        refused.append("bob")

    paid.during = bob_denies
    payer(paid, twice=True)  # a worker still on the old code carries out ann's approval
    assert drive_quietly("r1", store=store) == "paused"
    assert refused == ["bob"] and paid == [{"cents": 5}]
    assert [n for n in names(store, "r1") if n.startswith("approval:")] == ["approval:call_1_1"]
    assert store.get_approval_request("r1", "call_1_1").status != "pending"


def test_a_decision_whose_call_is_claimed_under_an_earlier_one_meanwhile_is_orphaned(
    store, crash_at, at_point
):
    """As above, but the worker on the old code claims the call just after bob's decision
    passed its checks (and dies inside the tool): bob's denial is journaled, and reported
    as orphaned — it can never take effect — not as a denial of a call that ran."""
    paid: list[dict] = []
    asked = asked_again_after_a_stopped_approval(store, crash_at, paid)

    def old_worker_claims():
        dying: list[dict] = DiesInTheTool()
        payer(dying, twice=True)  # a worker still on the old code carries out ann's approval
        with pytest.raises(Crash):
            drive_quietly("r1", store=store)
        assert dying == [{"cents": 5}]

    at_point("before-decision:call_1_1", old_worker_claims)
    with pytest.raises(da.ApprovalOrphaned, match="being run under an earlier decision"):
        da.deny("r1", "call_1_1", by="bob", message="no", arguments=asked.arguments, store=store)
    assert store.get_approval_request("r1", "call_1_1").status == "withdrawn"
    assert paid == []


@pytest.mark.parametrize("edit", [None, {"cents": 3}])
def test_a_decision_whose_own_drive_claims_the_call_at_once_stands(store, at_point, edit):
    """The control: a drive carrying out this very decision claims the call between its
    record and the check after it (and dies inside the tool). The decision stands."""

    paid: list[dict] = DiesInTheTool()
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)

    def its_drive_claims():
        with pytest.raises(Crash):
            drive_quietly("r1", store=store)

    at_point("after-decision:call_1_1", its_drive_claims)
    out = da.approve("r1", "call_1_1", True, by="ann", edit=edit, store=store)
    assert out.status == "approved" and paid == [edit or {"cents": 5}]


def test_a_decision_is_refused_when_the_request_asks_about_other_arguments(store):
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.approve("r1", "call_1_1", True, by="ann", arguments={"cents": 50}, store=store)
    assert info.value.code == "approval.arguments_changed"
    assert info.value.details["arguments"] == {"cents": 5}
    assert "approval:call_1_1" not in names(store, "r1")
    assert store.list_decisions("r1", "call_1_1") == []
    da.approve("r1", "call_1_1", True, by="ann", arguments={"cents": 5}, store=store)
    assert paid == [{"cents": 5}]


def test_a_decision_that_lands_on_a_request_replaced_under_it_is_asked_again(store, at_point):
    """A person's approval of ``{cents: 5}`` is being recorded while a drive under new code
    (a defaulted ``memo``) asks about ``{cents: 5, memo: ""}`` instead. The decision stands
    for what it was shown; the new arguments are asked about again, showing both — never a
    request marked approved for arguments nobody approved, with nothing left to decide."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)

    def deploy_and_drive():
        payer(paid, memo=True)  # the deploy lands; a worker drives the run meanwhile
        assert drive_quietly("r1", store=store) == "paused"

    at_point("before-decision:call_1_1", deploy_and_drive)
    da.approve("r1", "call_1_1", True, by="ann", store=store)
    assert paid == []
    request = store.get_approval_request("r1", "call_1_1")
    assert (request.status, request.arguments) == ("pending", {"cents": 5, "memo": ""})
    assert request.previous_arguments == {"cents": 5}
    assert store.get_run("r1").status == "awaiting_approval"
    da.approve("r1", "call_1_1", True, by="ann", arguments=request.arguments, store=store)
    assert paid == [{"cents": 5, "memo": ""}] and store.get_run("r1").status == "finished"


def test_a_denial_of_the_call_asked_again_stands_after_the_deploy_is_rolled_back(store, at_point):
    """Ann approved ``{cents: 5}``; a deploy (a defaulted ``memo``) asked again about
    ``{cents: 5, memo: ""}``; Bob denied that; the deploy is rolled back, so the call asks
    about ``{cents: 5}`` again. The last word a person said on the call was no: it is not
    run under Ann's earlier approval (found by the simulator, issue 32: "denied call ran")."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r2", "pay me", store=store)
    at_point("before-decision:call_1_1", lambda: payer(paid, memo=True))  # the deploy
    da.approve("r2", "call_1_1", True, by="ann", store=store)
    asked = store.get_approval_request("r2", "call_1_1")
    assert (asked.arguments, asked.previous_arguments) == ({"cents": 5, "memo": ""}, {"cents": 5})
    assert paid == []

    at_point("after-decision:call_1_1", lambda: payer(paid))  # the rollback lands
    da.approve(
        "r2", "call_1_1", False, by="bob", note="not today", arguments=asked.arguments, store=store
    )
    assert paid == []
    result = Journal(store).get("r2", "tool:call_1_1")
    assert result is not None and result.get("is_error")
    assert "not today" in str(result.get("result"))
    assert store.get_run("r2").status == "finished"


def test_a_denial_journaled_between_a_drives_read_and_its_claim_stands(
    store, at_point, monkeypatch
):
    """As above, but the drive that carries the call on has already read the journal (Ann's
    approval, no denial yet) when Bob's denial is journaled, and Bob's own check after his
    record runs before the drive claims the call. The drive looks again after its claim: the
    claim is retired (``not-started``) and the call gets the denial as its result, never run
    under the earlier approval (found by the simulator with limits, seed 2117: the agent's
    slot is one more store call between the drive's read and its claim)."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r3", "pay me", store=store)
    at_point("before-decision:call_1_1", lambda: payer(paid, memo=True))  # the deploy
    da.approve("r3", "call_1_1", True, by="ann", store=store)
    asked = store.get_approval_request("r3", "call_1_1")
    assert asked.previous_arguments == {"cents": 5}
    payer(paid)  # the rollback lands

    insert = store.insert

    def deny_before_the_claim(run_id, name, *args, **kwargs):
        if name == "attempt:call_1_1:1" and "denied" not in seen:
            seen.append("denied")
            da.approve(
                "r3",
                "call_1_1",
                False,
                by="bob",
                note="not today",
                arguments=asked.arguments,
                store=store,
            )
        return insert(run_id, name, *args, **kwargs)

    seen: list[str] = []
    monkeypatch.setattr(store, "insert", deny_before_the_claim)
    drive_quietly("r3", store=store)
    assert seen == ["denied"] and paid == []
    result = Journal(store).get("r3", "tool:call_1_1")
    assert result is not None and result.get("is_error")
    assert "not today" in str(result.get("result"))
    assert Journal(store).get("r3", "not-started:call_1_1:1") is not None
    assert store.get_run("r3").status == "finished"


@pytest.mark.parametrize("approved", [True, False])
def test_a_request_for_other_arguments_is_withdrawn_once_the_call_has_its_result(
    store, at_point, approved
):
    """While ann's decision on ``{cents: 5}`` is being recorded, a drive under new code (a
    defaulted ``memo``) asks about ``{cents: 5, memo: ""}``; the drive that carries her
    decision on runs the code she decided under (a worker not yet deployed), so the call
    gets its result from her decision. Nobody will ever run that call again: the request
    for the other arguments is withdrawn, not left pending on a finished run (seeds 39403,
    40610), and a decision on it is refused as orphaned."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r1", "pay me", store=store)

    def deploy_and_drive():
        payer(paid, memo=True)  # the deploy lands; a worker under it drives the run
        assert drive_quietly("r1", store=store) == "paused"
        payer(paid)  # the worker that drives it next still runs the old code

    at_point("before-decision:call_1_1", deploy_and_drive)
    da.approve("r1", "call_1_1", approved, by="ann", note="no", store=store)
    assert store.get_run("r1").status == "finished"
    assert paid == ([{"cents": 5}] if approved else [])
    request = store.get_approval_request("r1", "call_1_1")
    assert (request.status, request.arguments) == ("withdrawn", {"cents": 5, "memo": ""})
    assert store.list_approval_requests(run_id="r1") == []
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("r1", "call_1_1", True, by="bob", arguments=request.arguments, store=store)
    assert paid == ([{"cents": 5}] if approved else [])


def test_a_request_pending_for_a_call_a_person_resolved_is_withdrawn(store):
    """A request is pending for a call (asked again about other arguments while a driver
    that later lost the run was inside it under an earlier approval); a person records what
    really happened. Nobody runs the call again, so nobody may approve it: the drive that
    goes on withdraws the request (found by the simulator, fresh seed 3001164: a finished
    run with a pending approval)."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid).run("r5", "pay me", store=store)
    journal = Journal(store)
    journal.claim_attempt("r5", "attempt:call_1_1:1", extra={"tool": "pay", "arguments": {}})
    store.update_run("r5", {"status": "halted"})
    da.resolve_halt("r5", "call_1_1", "paid", by="ann", store=store)
    assert store.get_run("r5").status == "finished"
    assert store.get_approval_request("r5", "call_1_1").status == "withdrawn"
    assert paid == []


def test_a_request_left_pending_by_a_drive_that_died_after_the_result_is_withdrawn(
    store, at_point, monkeypatch
):
    """As above, ann's denial of ``{cents: 5}`` and a request for ``{cents: 5, memo: ""}``;
    but the drive that records her denial as the call's result hears a store error as the
    record commits, so it never withdraws that request. No drive comes back to a call with a
    result: the run would wait on the second payment beside a request nobody may decide,
    and every sweep would hand it over again. The next drive that pauses on approval
    withdraws it (found by the simulator: seed 751 with faults aimed after a process's last
    write, ``recovery_settles``)."""
    paid: list[dict] = []
    with pytest.raises(da.ApprovalPending):
        payer(paid, twice=True).run("r7", "pay me", store=store)

    def deploy_and_drive():
        payer(paid, memo=True, twice=True)  # the deploy lands; a worker under it drives
        assert drive_quietly("r7", store=store) == "paused"
        payer(paid, twice=True)  # the worker that drives it next still runs the old code

    at_point("before-decision:call_1_1", deploy_and_drive)
    insert = store.insert

    def error_as_the_result_commits(run_id, name, *args, **kwargs):
        written = insert(run_id, name, *args, **kwargs)
        if name == "tool:call_1_1":
            monkeypatch.setattr(store, "insert", insert)
            raise StorageError("the connection dropped as it committed", code="storage.unavailable")
        return written

    monkeypatch.setattr(store, "insert", error_as_the_result_commits)
    da.approve("r7", "call_1_1", False, by="ann", note="no", store=store)
    assert Journal(store).get("r7", "tool:call_1_1") is not None
    assert store.get_approval_request("r7", "call_1_1").status == "pending"  # left behind
    assert drive_quietly("r7", store=store) == "paused"  # on the second payment
    assert store.get_approval_request("r7", "call_1_1").status == "withdrawn"
    assert [r.call_id for r in store.list_approval_requests(run_id="r7")] == ["call_2_1"]
    assert store.get_run("r7").status == "awaiting_approval"
    assert recover(store=store) == [] and paid == []
