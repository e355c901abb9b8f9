"""Approval deadlines (``da.Deadline``; issue 42) on the in-memory store and its virtual
clock: each step (remind, escalate, expire) taken once by the timer sweep, journaled then
projected; the expiry racing a person's decision (first writer wins); what ``on_expiry``
does to the run; and a crash at every new failpoint finished exactly once by the next
sweep."""

from __future__ import annotations

from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import (
    APPROVAL_APPROVED,
    APPROVAL_EXPIRED,
    AWAITING_APPROVAL,
    CANCELLED,
    FINISHED,
    HALTED,
)
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash
from tests.support.wiring import wired

HOUR = 3600.0
STEPS = da.Deadline(remind="1h", escalate=("2h", "oncall"), expire="3h")


@pytest.fixture
def heard(store) -> list[tuple[str, dict[str, Any]]]:
    """What the engine announces, as a listening host hears it."""
    got: list[tuple[str, dict[str, Any]]] = []
    store.announce = lambda event, details: got.append((event, dict(details)))
    return got


@pytest.fixture
def groups():
    with wired(
        eligible_approvers=lambda group: {"finance": ["ann", "bob"], "oncall": ["olga"]}.get(
            group, []
        )
    ):
        yield


def payer(fired, *, deadline=STEPS, approval=None, name="unit-deadlines"):
    @da.tool(requires_approval=approval is None, approval=approval, deadline=deadline)
    def pay(cents: int) -> str:
        """Pay out."""
        fired.append(cents)
        return f"paid {cents}"

    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [pay])


def asked(agent, store, run_id="r1"):
    with pytest.raises(da.ApprovalPending):
        agent.run(run_id, "pay", store=store)
    [request] = store.list_approval_requests(run_id=run_id)
    return request


def steps_heard(heard):
    return [(e, d["step"]) for e, d in heard if e.startswith("approval_") and "step" in d]


# -- the tool's deadline -----------------------------------------------------------------


def test_a_tools_deadline_is_checked_where_it_is_written():
    with pytest.raises(da.ConfigError, match="gated tool"):

        @da.tool(deadline=STEPS)
        def free(x: int) -> int:
            return x

    with pytest.raises(da.ConfigError, match=r"da\.Deadline"):

        @da.tool(requires_approval=True, deadline={"expire": "3d"})
        def wrong(x: int) -> int:
            return x

    rules = da.Rules([], default=da.ask(), deadline=STEPS)
    with pytest.raises(da.ConfigError, match="give it once"):

        @da.tool(approval=rules, deadline=STEPS)
        def twice(x: int) -> int:
            return x

    with pytest.raises(da.ConfigError, match="in order"):
        da.Deadline(remind="3h", expire="1h")


def test_a_tools_deadline_is_the_default_of_its_rules():
    rules = da.Rules(
        [da.Rule("own", da.arg("x") > 9, da.ask(deadline=da.Deadline(expire=60)))], default=da.ask()
    )

    @da.tool(approval=rules, deadline=STEPS)
    def pay(x: int) -> int:
        return x

    ctx = da.RuleContext(agent="a", run_id="r", tool="pay")
    assert pay.safety.approval.evaluate({"x": 1}, ctx).policy["deadline"] == STEPS.to_policy()
    own = pay.safety.approval.evaluate({"x": 10}, ctx).policy["deadline"]
    assert own == {"expire": 60.0, "on_expiry": "deny"}
    assert pay.safety.approval.fingerprint != rules.fingerprint


def test_a_plain_gated_calls_request_records_the_tools_deadline_and_is_due_at_its_first_step(
    store, clock, fired
):
    request = asked(payer(fired), store)
    assert request.policy == {"kind": "single", "deadline": STEPS.to_policy()}
    assert (request.due_at - request.created_at).total_seconds() == HOUR
    assert store.list_due_approval_requests() == []
    clock.advance(HOUR)
    assert [r.call_id for r in store.list_due_approval_requests()] == [request.call_id]


# -- each step, once -----------------------------------------------------------------------


def test_each_step_is_journaled_once_and_moves_the_request_to_the_next(
    store, clock, fired, heard, groups
):
    agent = payer(fired, approval=da.Quorum(1, "finance"))
    request = asked(agent, store)
    call = request.call_id
    journal = Journal(store)

    clock.advance(HOUR)
    assert wake_timers(store=store) == []
    assert wake_timers(store=store) == []  # a second sweep finds nothing due
    remind = journal.get("r1", names.deadline(call, "remind"))
    assert remind.get("step") == "remind" and remind.get("tool") == "pay"
    now = store.get_approval_request("r1", call)
    assert (now.due_at - now.created_at).total_seconds() == 2 * HOUR
    assert "escalated_to" not in now.policy

    # Until it escalates, only finance decides.
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r1", call, True, by="olga", store=store)
    clock.advance(HOUR)
    wake_timers(store=store)
    now = store.get_approval_request("r1", call)
    assert now.policy["escalated_to"] == "oncall" and now.policy["need"] == 1
    assert (now.due_at - now.created_at).total_seconds() == 3 * HOUR
    assert steps_heard(heard) == [
        ("approval_reminded", "remind"),
        ("approval_escalated", "escalate"),
    ]
    escalated = heard[-1][1]
    assert escalated["policy"]["escalated_to"] == "oncall" and escalated["tool"] == "pay"

    # Escalated: oncall may decide too; the call runs once, the deadline is over.
    outcome = da.approve("r1", call, True, by="olga", store=store)
    assert outcome.status == APPROVAL_APPROVED
    assert fired == [5] and store.get_run("r1").status == FINISHED
    decided = store.get_approval_request("r1", call)
    assert decided.due_at is None and decided.decided_at is not None
    clock.advance(10 * HOUR)
    wake_timers(store=store)
    assert journal.get("r1", names.deadline(call, "expire")) is None


def test_a_late_sweep_takes_only_the_latest_step_due(store, clock, fired, heard):
    request = asked(payer(fired), store)
    clock.advance(2.5 * HOUR)  # remind and escalate both due: only the escalation is told
    wake_timers(store=store)
    journal = Journal(store)
    assert journal.get("r1", names.deadline(request.call_id, "remind")) is None
    assert journal.get("r1", names.deadline(request.call_id, "escalate")) is not None
    assert steps_heard(heard) == [("approval_escalated", "escalate")]


# -- expiry --------------------------------------------------------------------------------


def test_an_expired_request_denies_the_call_and_the_model_reads_that_it_expired(
    store, clock, fired, heard
):
    request = asked(payer(fired, deadline=da.Deadline(expire="3d")), store)
    call = request.call_id
    clock.advance(3 * 86400)
    assert wake_timers(store=store) == ["r1"]
    run = store.get_run("r1")
    assert run.status == FINISHED and fired == []
    journal = Journal(store)
    decision = journal.get("r1", names.decision(call))
    assert (decision.get("by"), decision.get("expired"), decision.get("approved")) == (
        "deadline",
        True,
        False,
    )
    result = journal.get("r1", names.tool(call))
    assert result.get("is_error") and result.get("result")["error"] == "expired"
    assert "nobody decided this call within 3 d" in result.get("result")["message"]
    expired = store.get_approval_request("r1", call)
    assert expired.status == APPROVAL_EXPIRED
    assert expired.decided_at is not None and expired.due_at is None
    [(_, details)] = [(e, d) for e, d in heard if e == "approval_expired"]
    assert details["on_expiry"] == "deny" and details["step"] == "expire"

    # Never decided afterwards, whatever the decision.
    for approved in (True, False):
        with pytest.raises(da.ApprovalExpired) as refused:
            da.approve("r1", call, approved, by="ann", store=store)
        assert refused.value.code == "approval.expired"
        assert refused.value.details["standing"]["by"] == "deadline"
    assert fired == []


def test_an_expiry_that_cancels_cancels_the_run_as_the_deadline(store, clock, fired):
    request = asked(payer(fired, deadline=da.Deadline(expire=60, on_expiry="cancel")), store)
    clock.advance(60)
    wake_timers(store=store)
    assert store.get_run("r1").status == CANCELLED and fired == []
    cancelled = Journal(store).get("r1", names.RUN_CANCELLED)
    assert cancelled.get("by") == "deadline" and request.call_id in cancelled.get("reason")
    [log] = [a for a in store.list_actions(run_id="r1") if a.action == "cancel"]
    assert log.actor == "deadline"
    assert store.get_approval_request("r1", request.call_id).status == APPROVAL_EXPIRED


def test_an_expiry_that_halts_waits_for_a_person_to_record_the_calls_result(store, clock, fired):
    request = asked(payer(fired, deadline=da.Deadline(expire=60, on_expiry="halt")), store)
    clock.advance(60)
    wake_timers(store=store)
    assert store.get_run("r1").status == HALTED and fired == []
    [halt] = store.list_halts(run_id="r1")
    assert (halt.op_id, halt.cause) == (request.call_id, "expired")
    assert "nobody decided" in halt.reason["message"]
    wake_timers(store=store)  # nothing more to do: a person's
    assert store.get_run("r1").status == HALTED
    da.resolve_halt(
        "r1",
        request.call_id,
        {"paid_by_phone": True},
        evidence={"ticket": "T-7"},
        by="ann",
        store=store,
    )
    assert store.get_run("r1").status == FINISHED and fired == []
    assert store.list_halts(run_id="r1") == []


def test_a_decision_journaled_before_the_expiry_wins_and_the_expiry_is_a_no_op(
    store, clock, fired, at_point, heard
):
    request = asked(payer(fired, deadline=da.Deadline(expire=60)), store)
    call = request.call_id
    clock.advance(60)
    # The person's decision lands between the sweep's step record and its expiry.
    at_point(
        f"after-deadline:{call}:expire",
        lambda: da.approve("r1", call, True, by="ann", store=store),
    )
    wake_timers(store=store)
    assert fired == [5] and store.get_run("r1").status == FINISHED
    assert store.get_approval_request("r1", call).status == APPROVAL_APPROVED
    assert Journal(store).get("r1", names.decision(call)).get("by") == "ann"
    assert not [e for e, _ in heard if e == "approval_expired"]


def test_a_decision_whose_maker_died_just_before_the_expiry_still_wins(
    store, clock, fired, at_point, crash_at
):
    request = asked(payer(fired, deadline=da.Deadline(expire=60)), store)
    call = request.call_id
    clock.advance(60)
    crash_at(f"after-decision:{call}")
    died = []

    def decide_and_die():
        with pytest.raises(Crash):
            da.approve("r1", call, True, by="ann", store=store)
        died.append(True)

    # Journaled between the sweep's look for a decision and its expiry; its maker dies
    # before the rows are moved on. The expiry finds it and carries it out instead.
    at_point(f"after-deadline:{call}:expire", decide_and_die)
    wake_timers(store=store)
    assert died == [True]
    assert fired == [5] and store.get_run("r1").status == FINISHED
    assert store.get_approval_request("r1", call).status == APPROVAL_APPROVED


def test_a_decision_landing_after_the_expiry_is_refused(store, clock, fired, at_point):
    request = asked(payer(fired, deadline=da.Deadline(expire=60)), store)
    call = request.call_id
    clock.advance(60)
    refused = []

    def decide():
        with pytest.raises(da.ApprovalExpired):
            da.approve("r1", call, True, by="ann", store=store)
        refused.append(True)

    at_point(f"after-expiry-decision:{call}", decide)
    wake_timers(store=store)
    assert refused == [True] and fired == []
    assert store.get_approval_request("r1", call).status == APPROVAL_EXPIRED
    assert store.get_run("r1").status == FINISHED


def test_a_stopped_runs_request_never_expires_and_leaves_the_due_index(store, clock, fired):
    request = asked(payer(fired, deadline=da.Deadline(expire=60)), store)
    # A cancel that died right after its record: the request is still pending.
    Journal(store).write("r1", names.RUN_CANCELLED, {"kind": "cancelled", "by": "ann"})
    clock.advance(60)
    wake_timers(store=store)
    assert store.list_due_approval_requests() == []
    assert Journal(store).get("r1", names.deadline(request.call_id, "expire")) is None
    assert store.get_approval_request("r1", request.call_id).status == "withdrawn"
    assert fired == []


# -- crashes inside a step ------------------------------------------------------------------


@pytest.mark.parametrize(
    "point",
    ["after-deadline:{call}:remind", "after-deadline:{call}:escalate"],
)
def test_a_crash_inside_a_step_is_finished_by_the_next_sweep_once(
    store, clock, fired, heard, crash_at, point
):
    request = asked(payer(fired), store)
    call = request.call_id
    step = point.rsplit(":", 1)[1]
    clock.advance(HOUR if step == "remind" else 2 * HOUR)
    crash_at(point.format(call=call))
    with pytest.raises(Crash):
        wake_timers(store=store)
    wake_timers(store=store)
    wake_timers(store=store)
    now = store.get_approval_request("r1", call)
    after = 2 * HOUR if step == "remind" else 3 * HOUR
    assert (now.due_at - now.created_at).total_seconds() == after
    assert ("escalated_to" in now.policy) == (step == "escalate")
    # The process that wrote the step died before telling: nobody tells it again.
    assert steps_heard(heard) == []


@pytest.mark.parametrize("on_expiry", ["deny", "cancel", "halt"])
@pytest.mark.parametrize(
    "point", ["after-deadline:{call}:expire", "after-expiry-decision:{call}", "after-expiry:{call}"]
)
def test_a_crash_inside_an_expiry_is_finished_once(store, clock, fired, crash_at, point, on_expiry):
    request = asked(payer(fired, deadline=da.Deadline(expire=60, on_expiry=on_expiry)), store)
    call = request.call_id
    clock.advance(60)
    crash_at(point.format(call=call))
    with pytest.raises(Crash):
        wake_timers(store=store)
    assert store.get_run("r1").status == AWAITING_APPROVAL
    wake_timers(store=store)
    wake_timers(store=store)
    status = {"deny": FINISHED, "cancel": CANCELLED, "halt": HALTED}[on_expiry]
    assert store.get_run("r1").status == status and fired == []
    assert store.get_approval_request("r1", call).status == APPROVAL_EXPIRED
    journal = Journal(store)
    records = [r.name for r in journal.records("r1")]
    assert records.count(names.decision(call)) == 1
    assert records.count(names.deadline(call, "expire")) == 1
    if on_expiry == "halt":
        assert len(store.list_halts(run_id="r1")) == 1


def test_a_run_busy_when_its_expiry_cancels_is_cancelled_by_its_driver_or_the_next_sweep(
    store, clock, fired
):
    request = asked(payer(fired, deadline=da.Deadline(expire=60, on_expiry="cancel")), store)
    clock.advance(60)
    lease = store.acquire_lease("r1", "someone", "tok", 30)
    assert lease
    wake_timers(store=store)  # the cancel finds the run busy
    assert store.get_run("r1").status == AWAITING_APPROVAL
    assert store.get_approval_request("r1", request.call_id).status == APPROVAL_EXPIRED
    store.release_lease("r1", "tok")
    wake_timers(store=store)
    assert store.get_run("r1").status == CANCELLED and fired == []


def test_an_edit_that_moves_a_request_to_a_stricter_rule_keeps_its_deadline(
    store, clock, fired, groups
):
    rules = da.Rules(
        [
            da.Rule(
                "lead",
                da.arg("cents") <= 100,
                da.ask("finance", deadline=da.Deadline(escalate=(60, "oncall"), expire=120)),
            )
        ],
        default=da.ask(da.Quorum(2, "finance"), deadline=da.Deadline(expire="3d")),
    )
    agent = payer(fired, deadline=None, approval=rules)
    request = asked(agent, store)
    call = request.call_id
    clock.advance(60)
    wake_timers(store=store)  # escalated to oncall
    outcome = da.approve("r1", call, True, by="ann", edit={"cents": 500}, store=store)
    assert outcome.status == "pending"  # two of finance now
    moved = store.get_approval_request("r1", call).policy
    assert (moved["kind"], moved["rule"]) == ("quorum", "default")
    assert moved["deadline"] == request.policy["deadline"]
    assert moved["escalated_to"] == "oncall"
    clock.advance(60)
    wake_timers(store=store)
    assert store.get_approval_request("r1", call).status == APPROVAL_EXPIRED
    assert fired == []


# -- what the card says, and a deploy ------------------------------------------------------


def test_a_deploy_that_changes_the_deadline_never_changes_a_waiting_requests(store, clock, fired):
    request = asked(payer(fired, deadline=da.Deadline(expire="1h")), store)
    # The next deploy gives the tool a week: the waiting request keeps its hour.
    later = payer([], deadline=da.Deadline(expire="7d"))
    with pytest.raises(da.ApprovalPending):
        later.run("r1", "pay", store=store)
    assert store.get_approval_request("r1", request.call_id).policy == request.policy
    clock.advance(HOUR)
    with wired(dispatcher=lambda run_id: later.run(run_id, store=store)):
        wake_timers(store=store)
    assert store.get_run("r1").status == FINISHED and fired == []


def test_a_drive_that_meets_an_expiry_that_cancels_cancels_its_run(store, clock, fired):
    request = asked(payer(fired, deadline=da.Deadline(expire=60, on_expiry="cancel")), store)
    clock.advance(60)
    assert store.acquire_lease("r1", "someone", "tok", 30)
    wake_timers(store=store)  # the cancel finds the run busy
    store.release_lease("r1", "tok")
    with pytest.raises(da.ConfigError, match="cancelled") as stopped:
        payer([], deadline=da.Deadline(expire=60, on_expiry="cancel")).run("r1", store=store)
    assert stopped.value.code == "run.cancelled"
    assert store.get_run("r1").status == CANCELLED and fired == []
    assert Journal(store).get("r1", names.RUN_CANCELLED).get("by") == "deadline"
    assert store.get_approval_request("r1", request.call_id).status == APPROVAL_EXPIRED


def test_an_edit_under_a_rule_of_another_group_never_lowers_what_the_request_needs(
    store, clock, fired
):
    # Found by the simulator's rules cast (``rules_hold``): an approver lowered a refund
    # asked of two of finance into the range of one lead. The leads' rule names another
    # group, so the request moved to it, and one lead's approval fired a call that had
    # needed two approvals while it waited. A pending request's needs only grow.
    rules = da.Rules(
        [da.Rule("lead", da.arg("cents") <= 100, da.ask("leads"))],
        default=da.ask(da.Quorum(2, "finance")),
    )
    with wired(
        eligible_approvers=lambda group: {"finance": ["ann", "bob"], "leads": ["ann", "bob"]}.get(
            group, []
        )
    ):

        @da.tool(approval=rules)
        def pay(cents: int) -> str:
            """Pay out."""
            fired.append(cents)
            return f"paid {cents}"

        script = [scripted.calls(scripted.call("pay", {"cents": 500})), scripted.text("done")]
        agent = da.Agent("unit-deadlines-groups", ScriptedModel(script), "", [pay])
        request = asked(agent, store)
        assert (request.policy["need"], request.policy["group"]) == (2, "finance")
        outcome = da.approve("r1", request.call_id, True, by="ann", edit={"cents": 50}, store=store)
        assert outcome.status == "pending"  # still two approvals, now of the edit
        moved = store.get_approval_request("r1", request.call_id).policy
        assert (moved["kind"], moved["need"], moved["group"]) == ("quorum", 2, "leads")
        outcome = da.approve("r1", request.call_id, True, by="bob", edit={"cents": 50}, store=store)
        assert outcome.status == "approved"
        with wired(dispatcher=lambda run_id: agent.run(run_id, store=store)):
            da.resume("r1", store=store)
    assert fired == [50]


def test_a_call_asked_again_and_allowed_by_the_rules_leaves_no_request_pending(
    store, fired, at_point
):
    # Found by the simulator's rules cast (``rows_agree``): while an approver's edit was
    # being recorded, a drive under new code (a defaulted field) replaced the request with
    # one about the new arguments. The edit no longer fitted, so the call was asked again,
    # and today's rules allowed it: it ran under the rule's automatic decision, and the
    # request about exactly those arguments stayed pending on a finished run.
    def tool(rules, with_reason):
        if with_reason:

            @da.tool(approval=rules)
            def pay(cents: int, reason: str = "goodwill") -> str:
                """Pay out."""
                fired.append(cents)
                return f"paid {cents}"

            return pay

        @da.tool(approval=rules)
        def pay(cents: int) -> str:  # type: ignore[no-redef]
            """Pay out."""
            fired.append(cents)
            return f"paid {cents}"

        return pay

    def agent(limit, with_reason):
        rules = da.Rules([da.Rule("small", da.arg("cents") <= limit, da.allow)], default=da.ask())
        script = [scripted.calls(scripted.call("pay", {"cents": 50})), scripted.text("done")]
        return da.Agent(
            "unit-asked-again-allowed", ScriptedModel(script), "", [tool(rules, with_reason)]
        )

    first = agent(10, False)
    request = asked(first, store)
    later = agent(60, True)  # the deploy: a defaulted reason, and a higher threshold
    call = request.call_id

    def drive_under_new_code():
        with pytest.raises(da.ApprovalPending):
            da.resume("r1", store=store)

    at_point(f"before-decision:{call}", drive_under_new_code)
    with wired(dispatcher=lambda run_id: later.run(run_id, store=store)):
        da.approve("r1", call, True, by="ann", edit={"cents": 80}, store=store)
    assert store.get_run("r1").status == FINISHED and fired == [50]
    assert store.get_approval_request("r1", call).status != "pending"


def test_a_rollback_of_a_run_halted_by_an_expiry_ends_with_no_halt_open(store, clock, fired):
    """An expiry that halts leaves a halt for a person; staff then cancel the run and
    compensate it. The rollback undoes what ran and ends the run ``compensated``: the
    expiry's halt is moot and is orphaned with it, as a cancel orphans it (issue 43, the
    simulator's late canceller in a rules cast, fresh seed 533895470: ``rows_agree``)."""
    undone: list[str] = []

    @da.tool(compensate=lambda args, result, ctx: undone.append(result))
    def hold(seat: str) -> str:
        """Hold a seat."""
        return f"held {seat}"

    @da.tool(requires_approval=True, deadline=da.Deadline(expire=60, on_expiry="halt"))
    def pay(cents: int) -> str:
        """Pay out."""
        fired.append(cents)
        return f"paid {cents}"

    script = [
        scripted.calls(scripted.call("hold", {"seat": "4A"})),
        scripted.calls(scripted.call("pay", {"cents": 5})),
        scripted.text("done"),
    ]
    agent = da.Agent("unit-deadline-saga", ScriptedModel(script), "", [hold, pay], saga=True)
    with pytest.raises(da.ApprovalPending):
        agent.run("r1", "pay", store=store)
    clock.advance(60)
    wake_timers(store=store)
    assert store.get_run("r1").status == HALTED
    da.cancel("r1", compensate=True, by="ann", store=store)
    assert store.get_run("r1").status == "compensated" and undone == ["held 4A"]
    assert fired == [] and store.list_halts(run_id="r1") == []
