"""Delegation in the engine, on the in-memory store (``engine.delegation``): who a deputy
decides for, that the approver and the deputy count once, what a delegation does not cover,
separation of duties through a deputy, and the commands that record and revoke delegations.
People are explicit ``Actor`` objects with groups and permissions; on real users and
PostgreSQL, tests/integration/test_delegation.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable_agents as da
from durable_agents.engine.approvals import decision_bytes, tally
from durable_agents.engine.errors import ActorForbidden
from durable_agents.engine.identity import APPROVE_TOOLCALL, DELEGATE_APPROVALS, Actor
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import DecisionInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.wiring import wired

LEADS, FINANCE = "leads", "finance"
CALL = "c1"


def _person(pk: str, name: str, *groups: str, perm: str = APPROVE_TOOLCALL) -> Actor:
    return Actor(pk, name, permissions=frozenset({perm} if perm else ()), groups=frozenset(groups))


PEOPLE = {
    a.username: a
    for a in (
        _person("1", "lena", LEADS),
        _person("2", "lara", LEADS),
        _person("3", "leo"),
        _person("4", "fay", FINANCE),
        _person("5", "finn", FINANCE),
        _person("6", "fred", FINANCE),
        _person("7", "nora", LEADS, perm=""),
        _person("8", "ada", perm=DELEGATE_APPROVALS),
    )
}
GROUPS = {LEADS: ["lara", "lena"], FINANCE: ["fay", "finn", "fred"]}

FIRED: list[str] = []


@da.tool(approval=da.Rules([], default=da.ask(LEADS)))
def lead_refund(cents: int) -> str:
    """A refund one support lead approves."""
    FIRED.append(f"lead {cents}")
    return "refunded"


@da.tool(approval=da.Rules([], default=da.ask(da.Quorum(2, FINANCE), requester_may_decide=False)))
def big_refund(cents: int) -> str:
    """A refund two of finance approve, never the person who asked."""
    FIRED.append(f"big {cents}")
    return "refunded"


def _agent(name: str, tool) -> da.Agent:
    return da.Agent(
        name,
        ScriptedModel(
            [scripted.calls(scripted.call(tool.name, {"cents": 5}, id=CALL)), scripted.text("ok")]
        ),
        "",
        [tool],
    )


leads_agent = _agent("deleg-leads", lead_refund)
finance_agent = _agent("deleg-finance", big_refund)


@pytest.fixture(autouse=True)
def people(store):
    FIRED.clear()
    with wired(
        resolve_actor=lambda by: PEOPLE.get(by if isinstance(by, str) else ""),
        eligible_approvers=lambda group: list(GROUPS.get(group, [])),
    ):
        yield


def _ask(agent: da.Agent, run_id: str, store, by: str | None = None) -> None:
    agent.start("go", run_id, store=store, by=by)  # driven here, to its approval
    assert store.get_run(run_id).status == "awaiting_approval"


def _away(store, approver="lena", deputy="leo", **kw):
    now = store.now()
    return da.delegate(
        approver, deputy, now, now + timedelta(days=7), by=approver, store=store, **kw
    )


def test_a_deputy_decides_for_the_lead_who_is_away(store, clock):
    _ask(leads_agent, "r1", store)
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r1", CALL, True, by="leo", store=store)  # not a lead, nobody's deputy
    d = _away(store)
    assert d.id is not None and (d.approver, d.deputy) == ("lena", "leo")
    outcome = da.approve("r1", CALL, True, by="leo", store=store)
    assert outcome.status == "approved" and FIRED == ["lead 5"]
    [vote] = store.list_decisions("r1", CALL)
    assert (vote.approver, vote.deputy) == ("lena", "leo")
    record = Journal(store).get("r1", f"approval:{CALL}")
    assert (record.get("by"), record.get("deputy")) == ("lena", "leo")
    assert record.get("decided_by") == "leo for lena"
    assert record.get("tally")["decisions"][0]["deputy"] == "leo"
    acts = [a for a in store.list_actions() if a.action in ("delegate", "approve")]
    assert [(a.actor, a.action) for a in acts] == [("lena", "delegate"), ("leo", "approve")]
    assert acts[1].payload["for"] == "lena" and acts[0].target == f"delegation:{d.id}"


def test_the_approver_and_the_deputy_count_once(store):
    _ask(finance_agent, "r2", store)
    now = store.now()
    da.delegate("finn", "leo", now, now + timedelta(days=1), by="finn", store=store)
    assert da.approve("r2", CALL, True, by="leo", store=store).status == "pending"
    with pytest.raises(da.ApprovalAlreadyDecided, match="counts once"):
        da.approve("r2", CALL, True, by="finn", store=store)
    assert FIRED == []
    assert da.approve("r2", CALL, True, by="fay", store=store).status == "approved"
    assert FIRED == ["big 5"]


def test_a_deputy_of_two_approvers_casts_one_vote(store):
    _ask(finance_agent, "r3", store)
    now = store.now()
    for who in ("finn", "fay"):
        da.delegate(who, "leo", now, now + timedelta(days=1), by=who, store=store)
    with pytest.raises(da.ApprovalForWhom) as refused:
        da.approve("r3", CALL, True, by="leo", store=store)
    assert refused.value.code == "approval.for_approver_needed"
    assert sorted(refused.value.details["candidates"]) == ["fay", "finn"]
    assert da.approve("r3", CALL, True, by="leo", for_approver="fay", store=store).status == (
        "pending"
    )
    with pytest.raises(da.ApprovalAlreadyDecided, match="counts once in a quorum"):
        da.approve("r3", CALL, True, by="leo", for_approver="finn", store=store)
    assert FIRED == []


def test_a_deputys_vote_whose_maker_died_is_finished_by_the_sweep_as_theirs(store, crash_at):
    """Leo's vote for Finn completes the quorum; he dies after it is saved, before the
    decision is recorded. The sweep finishes it as Leo for Finn, not as Finn."""
    from durable_agents.engine.commands.timers import wake_timers
    from tests.support.doubles import Crash

    _ask(finance_agent, "r7", store)
    now = store.now()
    da.delegate("finn", "leo", now, now + timedelta(days=1), by="finn", store=store)
    da.approve("r7", CALL, True, by="fay", store=store)
    crash_at(f"after-vote:{CALL}")
    with pytest.raises(Crash):
        da.approve("r7", CALL, True, by="leo", store=store)
    assert Journal(store).get("r7", f"approval:{CALL}") is None and FIRED == []
    assert wake_timers(store=store) == ["r7"]
    record = Journal(store).get("r7", f"approval:{CALL}")
    assert (record.get("by"), record.get("decided_by")) == ("finn", "leo for finn")
    assert FIRED == ["big 5"]
    finished = [a for a in store.list_actions() if a.action == "finish-decision"]
    assert [a.actor for a in finished] == ["leo"]


def test_the_last_line_counts_no_approval_the_requester_made_as_a_deputy():
    """The driver's last check before firing an edit (``approvals_short_of``): where duties
    are separated, an approval the requester made for someone else counts for nothing."""
    from durable_agents.engine.approvals import approvals_short_of

    policy = {"kind": "quorum", "need": 2, "separate": True}
    votes = [
        DecisionInfo("r", CALL, "fay", True),
        DecisionInfo("r", CALL, "finn", True, deputy="leo"),
    ]
    count = tally(policy, votes, ["fay", "finn"]).to_json()
    assert approvals_short_of("ask", policy, count, "fred") is None
    assert "has 1" in (approvals_short_of("ask", policy, count, "leo") or "")


def test_two_votes_of_one_person_recorded_at_once_count_once():
    votes = [
        DecisionInfo("r", CALL, "fay", True, deputy="leo"),
        DecisionInfo("r", CALL, "finn", True, deputy="leo"),
        DecisionInfo("r", CALL, "fred", True),
    ]
    count = tally({"kind": "quorum", "need": 2}, votes, ["fay", "finn", "fred"])
    assert count.approved_by == ("fay", "fred") and count.uncounted == ("finn",)
    assert count.pending == ()


@pytest.mark.parametrize("when", ["ended", "not-started", "revoked", "other-tool", "other-group"])
def test_a_delegation_not_in_force_for_the_call_gives_nothing(store, clock, when):
    _ask(leads_agent, "r4", store)
    now = store.now()
    if when == "ended":
        da.delegate("lena", "leo", now, now + timedelta(hours=1), by="lena", store=store)
        clock.advance(2 * 3600)
    elif when == "not-started":
        start = now + timedelta(days=1)
        da.delegate("lena", "leo", start, start + timedelta(days=1), by="lena", store=store)
    elif when == "revoked":
        d = _away(store)
        da.revoke_delegation(d.id, by="lena", store=store)
    elif when == "other-tool":
        _away(store, tools=["big_refund"])
    else:
        _away(store, groups=[FINANCE])
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r4", CALL, True, by="leo", store=store)
    with pytest.raises(da.ApproverNotEligible, match="no delegation"):
        da.approve("r4", CALL, True, by="leo", for_approver="lena", store=store)
    assert store.list_decisions("r4", CALL) == [] and FIRED == []


def test_a_deputy_cannot_decide_what_separation_of_duties_forbids(store):
    now = store.now()
    # The delegator started the run: their deputy may not decide it for them.
    _ask(finance_agent, "r5", store, by="finn")
    da.delegate("finn", "leo", now, now + timedelta(days=1), by="finn", store=store)
    with pytest.raises(da.ApproverNotEligible):
        da.approve("r5", CALL, True, by="leo", store=store)
    with pytest.raises(da.ApproverNotEligible, match="separation of duties"):
        da.approve("r5", CALL, True, by="leo", for_approver="finn", store=store)
    # The deputy started the run: they may not decide it for anyone.
    _ask(finance_agent, "r6", store, by="leo")
    with pytest.raises(da.ApproverNotEligible, match="separation of duties"):
        da.approve("r6", CALL, True, by="leo", for_approver="finn", store=store)
    assert store.list_decisions("r5", CALL) == store.list_decisions("r6", CALL) == []


def test_who_may_record_and_revoke_a_delegation(store):
    now, later = store.now(), store.now() + timedelta(days=1)
    with pytest.raises(ActorForbidden):
        da.delegate("lena", "leo", now, later, by="lara", store=store)  # someone else's
    with pytest.raises(da.DelegationError, match="own deputy"):
        da.delegate("lena", "lena", now, later, by="lena", store=store)
    with pytest.raises(da.DelegationError) as no:
        da.delegate("lena", "nora", now, later, by="lena", store=store)
    assert no.value.code == "delegation.not_eligible"
    with pytest.raises(da.DelegationError, match="before it starts"):
        da.delegate("lena", "leo", later, now, by="lena", store=store)
    d = da.delegate("lena", "leo", now, later, by="ada", store=store)  # delegate_approvals
    assert d.created_by == "ada"
    with pytest.raises(da.DelegationOverlaps) as overlap:
        da.delegate("lena", "lara", now + timedelta(hours=1), later, by="lena", store=store)
    assert overlap.value.details["standing"]["id"] == d.id
    # Another approver's, or other calls of the same approver, do not overlap.
    da.delegate("lara", "leo", now, later, by="lara", store=store)
    with pytest.raises(ActorForbidden):
        da.revoke_delegation(d.id, by="lara", store=store)
    revoked = da.revoke_delegation(d.id, by="lena", store=store)  # ending it early
    assert revoked.revoked_by == "lena" and revoked.revoked_at is not None
    assert da.revoke_delegation(d.id, by="leo", store=store).revoked_by == "lena"
    logged = [a.action for a in store.list_actions()]
    assert logged.count("delegate") == 2 and logged.count("revoke-delegation") == 1


def test_a_deputys_signature_binds_the_approver_it_is_for():
    common = dict(
        incarnation="n",
        run_id="r",
        call_id=CALL,
        tool_name="t",
        arguments={"cents": 5},
        approver_id="3",
        approved=True,
    )
    mine = decision_bytes(**common)
    for_lena = decision_bytes(**common, for_approver_id="1")
    for_lara = decision_bytes(**common, for_approver_id="2")
    assert len({mine, for_lena, for_lara}) == 3
    assert for_lena.startswith(mine)  # the same bytes, and the approver it is for after
