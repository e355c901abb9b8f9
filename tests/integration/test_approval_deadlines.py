"""Approval deadlines on PostgreSQL with real users and groups (issue 42): the support desk's
refund policy with the issue's deadlines (tests/support/rule_agents.py, ``deadlines``). A
lead's refund reminds, escalates to on-call (who may then decide it) and is denied when
nobody decides; finance's halts for a person; a rush order is cancelled. The database's
clock cannot be moved: the request rows are backdated, as other tests backdate rows, and the
timer sweep (``wake_timers``) takes the steps. A person's decision races the expiry from two
threads, in both orders. Effects are counted outside the journal (``count_effects``)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import F

import durable_agents as da
from durable_agents import signals
from durable_agents.engine import failpoints, registry
from durable_agents.engine.approvals import ApprovalOutcome
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.models import ActionLog, ApprovalRequest, Halt, JournalEntry, Run
from tests.support.admin_pages import client_for, text_of
from tests.support.agents import count_effects
from tests.support.api import as_session, error
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS, ONCALL, RushModel, deadlines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CALL = "call_1_1"
HOUR = 3600


@pytest.fixture
def people():
    return {
        "lena": make_user("lena", "approve_toolcall", groups=(LEADS,)),
        "fay": make_user("fay", "approve_toolcall", groups=(FINANCE,)),
        "finn": make_user("finn", "approve_toolcall", groups=(FINANCE,)),
        "olga": make_user("olga", "approve_toolcall", groups=(ONCALL,)),
        "rex": make_user("rex", "resolve_halt"),
    }


@pytest.fixture
def heard():
    """The deadline steps' signals, as a receiver of the site's hears them."""
    got: list[tuple[str, dict[str, Any]]] = []

    def receiver(sender: Any, signal: Any, **details: Any) -> None:
        name = next(n for n, s in signals.SIGNALS.items() if s is signal)
        got.append((name, details))

    hooked = (signals.approval_reminded, signals.approval_escalated, signals.approval_expired)
    for s in hooked:
        s.connect(receiver, dispatch_uid="test-deadlines")
    yield got
    for s in hooked:
        s.disconnect(dispatch_uid="test-deadlines")


def _ask(run_id: str, text: str) -> ApprovalRequest:
    with pytest.raises(da.ApprovalPending):
        deadlines.run(run_id, text)
    return ApprovalRequest.objects.get(run_id=run_id)


def _age(run_id: str, seconds: float) -> None:
    """As if the request had been asked ``seconds`` earlier."""
    ago = timedelta(seconds=seconds)
    ApprovalRequest.objects.filter(run_id=run_id).update(
        created_at=F("created_at") - ago, due_at=F("due_at") - ago
    )


def _names(run_id: str) -> list[str]:
    return list(
        JournalEntry.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


def test_a_leads_refund_reminds_escalates_to_oncall_who_may_then_decide(people, heard):
    request = _ask("dl-lead", "refund 50000")
    assert request.policy["rule"] == "lead"
    assert request.policy["deadline"]["escalate_to"] == ONCALL  # the rules' default deadline
    assert (request.due_at - request.created_at) == timedelta(hours=4)

    wake_timers()  # nothing due yet
    assert "deadline:call_1_1:remind" not in _names("dl-lead")
    _age("dl-lead", 4 * HOUR)
    wake_timers()
    wake_timers()
    assert _names("dl-lead").count("deadline:call_1_1:remind") == 1
    request.refresh_from_db()
    assert request.due_at - request.created_at == timedelta(hours=24)

    with pytest.raises(da.ApproverNotEligible):
        da.approve("dl-lead", CALL, True, by="olga")  # not a lead, not escalated yet
    _age("dl-lead", 20 * HOUR)
    wake_timers()
    request.refresh_from_db()
    assert request.policy["escalated_to"] == ONCALL and request.policy["group"] == LEADS
    assert [(e, d["step"]) for e, d in heard] == [
        ("approval_reminded", "remind"),
        ("approval_escalated", "escalate"),
    ]
    assert heard[1][1]["policy"]["escalated_to"] == ONCALL and heard[1][1]["rule"] == "lead"

    assert da.approve("dl-lead", CALL, True, by="olga").status == "approved"
    assert count_effects("dl-lead") == {CALL: 1}
    assert Run.objects.get(pk="dl-lead").status == "finished"
    request.refresh_from_db()
    assert request.due_at is None and request.status == "approved"


def test_nobody_deciding_in_time_denies_the_refund_and_the_model_reads_it(people, heard):
    _ask("dl-deny", "refund 50000")
    _age("dl-deny", 3 * 24 * HOUR)
    assert wake_timers() == ["dl-deny"]
    run = Run.objects.get(pk="dl-deny")
    assert run.status == "finished" and "expired" in run.answer
    assert count_effects("dl-deny") == {}
    request = ApprovalRequest.objects.get(run_id="dl-deny")
    assert request.status == "expired" and request.decided_at is not None
    assert request.due_at is None
    # Only the latest step due is taken: nobody is reminded of what expires.
    assert [(e, d["step"], d.get("on_expiry")) for e, d in heard] == [
        ("approval_expired", "expire", "deny")
    ]
    with pytest.raises(da.ApprovalExpired) as refused:
        da.approve("dl-deny", CALL, True, by="lena")
    assert refused.value.code == "approval.expired"
    assert count_effects("dl-deny") == {}


def test_finance_refund_halts_for_a_person_who_records_the_result(people):
    run_id = deadlines.start("refund 250000", by=people["rex"])
    with pytest.raises(da.ApprovalPending):
        da.resume(run_id)
    assert da.approve(run_id, CALL, True, by="finn").status == "pending"  # one of two
    _age(run_id, 3 * 24 * HOUR)
    wake_timers()
    assert Run.objects.get(pk=run_id).status == "halted"
    halt = Halt.objects.get(run_id=run_id)
    assert (halt.op_id, halt.cause, halt.status) == (CALL, "expired", "open")
    with pytest.raises(da.ApprovalExpired):
        da.approve(run_id, CALL, True, by="fay")  # the second approval, too late
    assert count_effects(run_id) == {}
    da.resolve_halt(run_id, CALL, {"refunded_by_phone": True}, evidence={"ticket": "T-9"}, by="rex")
    assert Run.objects.get(pk=run_id).status == "finished"
    assert count_effects(run_id) == {}
    halt.refresh_from_db()
    assert halt.status == "resolved"


def test_a_rush_order_nobody_decides_in_the_hour_is_cancelled_by_the_deadline(people):
    _ask("dl-rush", "rush 30000")
    _age("dl-rush", HOUR)
    wake_timers()
    assert Run.objects.get(pk="dl-rush").status == "cancelled"
    assert count_effects("dl-rush") == {}
    [log] = ActionLog.objects.filter(run_id="dl-rush", action="cancel")
    assert log.actor == "deadline"
    assert ApprovalRequest.objects.get(run_id="dl-rush").status == "expired"


def test_a_deploy_that_changes_the_rules_keeps_a_waiting_requests_deadline(people):
    asked = _ask("dl-deploy", "refund 50000")
    shorter = da.Rules(
        [da.Rule("lead", da.arg("amount_cents") <= 100_000, da.ask(LEADS))],
        default=da.deny("no"),
        deadline=da.Deadline(expire="1m"),
    )

    @da.tool(name="refund", approval=shorter)
    def refund_v2(order_id: str, amount_cents: int) -> dict:
        """Refund an order."""
        raise AssertionError("never runs: nobody approved it")

    deployed = da.Agent("rule-deadlines", RushModel(), "You refund orders.", [refund_v2])
    try:
        _age("dl-deploy", 120)
        with pytest.raises(da.ApprovalPending):
            deployed.run("dl-deploy")
        wake_timers()
    finally:
        registry.register(deadlines)  # the next deploy: the tests' agent again
    request = ApprovalRequest.objects.get(run_id="dl-deploy")
    assert request.status == "pending" and request.policy == asked.policy
    assert request.policy["deadline"]["expire"] == 3 * 24 * HOUR
    assert Run.objects.get(pk="dl-deploy").status == "awaiting_approval"


# -- a person's decision racing the expiry --------------------------------------------------


def _race(run_id: str, first: str) -> tuple[Any, Any]:
    """A person approves while the sweep expires the request: ``first`` reaches the
    decision's record first, the other is held until it has (then goes on)."""
    _ask(run_id, "refund 50000")
    _age(run_id, 3 * 24 * HOUR)
    written = threading.Event()
    outcome: dict[str, Any] = {}
    real = failpoints.hit

    def hit(name: str) -> None:
        # The first writer's record is in: let the other go.
        if name in (f"after-expiry-decision:{CALL}", f"after-decision:{CALL}"):
            written.set()
        real(name)

    def person() -> None:
        try:
            if first == "sweep":
                assert written.wait(30)
            outcome["person"] = da.approve(run_id, CALL, True, by="lena")
        except da.DurableAgentsError as exc:
            outcome["person"] = exc
        finally:
            connections.close_all()

    def sweep() -> None:
        try:
            if first == "person":
                assert written.wait(30)
            outcome["sweep"] = wake_timers()
        finally:
            connections.close_all()

    failpoints_hit, failpoints.hit = failpoints.hit, hit
    try:
        threads = [threading.Thread(target=person), threading.Thread(target=sweep)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        failpoints.hit = failpoints_hit
    return outcome["person"], outcome.get("sweep")


def test_the_expiry_first_refuses_the_persons_approval(people):
    person, _ = _race("dl-race-1", first="sweep")
    assert isinstance(person, da.ApprovalExpired)
    assert count_effects("dl-race-1") == {}
    assert ApprovalRequest.objects.get(run_id="dl-race-1").status == "expired"
    decision = JournalEntry.objects.get(run_id="dl-race-1", name=f"approval:{CALL}")
    assert '"expired":true' in decision.data
    assert Run.objects.get(pk="dl-race-1").status == "finished"


def test_the_persons_approval_first_stands_and_the_expiry_is_a_no_op(people):
    person, _ = _race("dl-race-2", first="person")
    assert person.status == "approved"
    assert count_effects("dl-race-2") == {CALL: 1}
    assert ApprovalRequest.objects.get(run_id="dl-race-2").status == "approved"
    assert Run.objects.get(pk="dl-race-2").status == "finished"


def _free_race(run_id: str) -> Any:
    """A person approving and a sweep expiring, released together: what the person got."""
    barrier = threading.Barrier(2)
    got: dict[str, Any] = {}

    def person() -> None:
        try:
            barrier.wait(30)
            got["person"] = da.approve(run_id, CALL, True, by="lena")
        except da.DurableAgentsError as exc:
            got["person"] = exc
        finally:
            connections.close_all()

    def sweep() -> None:
        try:
            barrier.wait(30)
            wake_timers()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=person), threading.Thread(target=sweep)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got["person"]


def test_a_free_race_has_one_winner_and_fires_at_most_once(people):
    for n in range(6):
        run_id = f"dl-free-{n}"
        _ask(run_id, "refund 50000")
        _age(run_id, 3 * 24 * HOUR)
        person = _free_race(run_id)
        wake_timers()  # whatever either left half done
        assert isinstance(person, ApprovalOutcome | da.ApprovalExpired), person
        won = isinstance(person, ApprovalOutcome)
        request = ApprovalRequest.objects.get(run_id=run_id)
        assert request.status == ("approved" if won else "expired"), (n, person)
        assert count_effects(run_id) == ({CALL: 1} if won else {}), n
        assert Run.objects.get(pk=run_id).status == "finished"


# -- what people see ----------------------------------------------------------------------


def test_the_card_the_calls_page_and_the_api_say_when_the_next_step_falls_due(people):
    _ask("dl-card", "refund 50000")
    _age("dl-card", 5 * HOUR)  # reminded: escalates next, 19 h from now
    wake_timers()
    viewer = make_user("vic", "view_run", "view_approvalrequest", "approve_toolcall")
    inbox = text_of(client_for(viewer).get("/admin/durable_agents/inbox/"))
    assert "escalates to oncall in 18 h 59 min" in inbox or "escalates to oncall in 19 h" in inbox
    request = ApprovalRequest.objects.get(run_id="dl-card")
    page = text_of(
        client_for(viewer).get(f"/admin/durable_agents/approvalrequest/{request.pk}/change/")
    )
    assert "escalates to oncall in" in page
    caller = as_session(viewer)
    [row] = caller.get("/approvals").json()["items"]
    assert row["due_at"] is not None and row["policy"]["deadline"]["expire"] == 3 * 24 * HOUR

    _age("dl-card", 3 * 24 * HOUR)
    wake_timers()
    assert caller.get("/approvals").json()["items"] == []
    [expired] = caller.get("/approvals", status="expired").json()["items"]
    assert (expired["status"], expired["due_at"]) == ("expired", None)
    page = text_of(
        client_for(viewer).get(f"/admin/durable_agents/approvalrequest/{request.pk}/change/")
    )
    assert "expired" in page and "escalates to" not in page
    lead = as_session(people["lena"])
    answer = lead.post(f"/runs/dl-card/approvals/{CALL}", {"approved": True, "note": "finally"})
    error(answer, 409, "approval.expired")


def test_an_expiry_that_halts_shows_on_the_inbox_as_a_call_never_made(people):
    run_id = deadlines.start("refund 250000", by=people["rex"])
    with pytest.raises(da.ApprovalPending):
        da.resume(run_id)
    _age(run_id, 3 * 24 * HOUR)
    wake_timers()
    viewer = make_user("vic", "view_run", "view_halt", "resolve_halt")
    inbox = text_of(client_for(viewer).get("/admin/durable_agents/inbox/"))
    assert "nobody decided this call within 3 d" in inbox
    assert "The call was never made" in inbox
    halt = Halt.objects.get(run_id=run_id)
    page = text_of(client_for(viewer).get(f"/admin/durable_agents/halt/{halt.pk}/change/"))
    assert "its approval request expired" in page and "the call was never made" in page
