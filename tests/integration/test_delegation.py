"""Delegation on PostgreSQL with real users and groups (issue 42): the support desk's refund
policy (tests/support/rule_agents.py) while a lead or someone from finance is away. A deputy
decides for them, the decision is theirs and says who made it; their own vote and the
deputy's count once, also when both land at once; a delegation that ended, has not started,
was revoked or covers other calls gives nothing; separation of duties holds through a
deputy; and every path (Python, API key, admin form, signed relay, command) asks the same
rule. Effects are counted outside the journal (``count_effects``)."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.errors import ActorForbidden
from durable_agents.engine.journal import Journal
from durable_agents.models import (
    ActionLog,
    ApprovalRequest,
    ApproverKey,
    Decision,
    Delegation,
    JournalEntry,
    Run,
)
from tests.support.admin_pages import client_for, messages_of, shown, text_of
from tests.support.agents import count_effects
from tests.support.api import as_session, error, with_key
from tests.support.people import make_user
from tests.support.procs import in_threads
from tests.support.rule_agents import FINANCE, LEADS, refunds
from tests.support.signing import keypair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

CALL = "call_1_1"
WEEK = timedelta(days=7)


@pytest.fixture
def people():
    return {
        "lena": make_user("lena", "approve_toolcall", groups=(LEADS,)),
        "leo": make_user("leo", "approve_toolcall", groups=(LEADS,)),
        "fay": make_user("fay", "approve_toolcall", groups=(FINANCE,)),
        "finn": make_user("finn", "approve_toolcall", groups=(FINANCE,)),
        "fred": make_user("fred", "approve_toolcall", "add_run", groups=(FINANCE,)),
        # In neither group: decides only as someone's deputy.
        "dora": make_user("dora", "approve_toolcall", "add_run"),
        "ada": make_user("ada", "delegate_approvals"),
        "nick": make_user("nick"),  # staff, no permission of ours
    }


def plain(page: str) -> str:
    """The page's text without its tags, spaces folded."""
    return " ".join(re.sub(r"<[^>]+>", "", page).split())


def _lead_call(run_id: str) -> str:
    with pytest.raises(da.ApprovalPending):
        refunds.run(run_id, "refund 50000")  # one support lead decides
    return run_id


def _away(approver: str, deputy: str = "dora", **kw):
    now = timezone.now()
    return da.delegate(approver, deputy, now, now + WEEK, by=approver, **kw)


def _writes() -> tuple[int, int]:
    return Decision.objects.count(), JournalEntry.objects.count()


# -- a deputy decides -----------------------------------------------------------------------


def test_a_lead_away_this_week_has_their_deputy_decide(people):
    run_id = _lead_call("dl-away")
    with pytest.raises(da.ApproverNotEligible):
        da.approve(run_id, CALL, True, by="dora")  # not a lead, nobody's deputy yet
    made = _away("lena", note="holiday")
    assert (made.approver, made.deputy, made.created_by) == ("lena", "dora", "lena")
    outcome = da.approve(run_id, CALL, True, by="dora", note="fine by me")
    assert outcome.status == "approved"
    assert count_effects(run_id) == {CALL: 1}
    assert Run.objects.get(pk=run_id).status == "finished"
    row = Decision.objects.get(request__run_id=run_id)
    assert (row.approver, row.deputy) == ("lena", "dora")
    record = Journal(site_store()).get(run_id, f"approval:{CALL}")
    assert (record.get("by"), record.get("deputy")) == ("lena", "dora")
    assert record.get("decided_by") == "dora for lena"
    assert record.get("by_id") == str(people["lena"].pk)
    assert record.get("deputy_id") == str(people["dora"].pk)
    # Audited: who recorded the delegation, who decided for whom.
    logged = list(ActionLog.objects.order_by("id").values_list("actor", "action", "payload"))
    assert ("lena", "delegate") in [(a, b) for a, b, _ in logged]
    approve_row = [p for a, b, p in logged if (a, b) == ("dora", "approve")]
    assert approve_row and approve_row[0]["for"] == "lena"
    # The call's page and the run's timeline say who decided for whom.
    page = plain(text_of(client_for(people["lena"]).get(_call_url(run_id))))
    assert "decided by dora for lena" in page
    timeline = text_of(
        client_for(make_user("root", superuser=True)).get(
            reverse("admin:durable_agents_run_change", args=[run_id])
        )
    )
    assert "approved by dora for lena" in timeline


def test_the_lead_and_the_deputy_voting_on_one_request_count_once(people):
    run_id = refunds.start("refund 250000", by=people["fred"])  # two of finance
    _away("finn")
    assert da.approve(run_id, CALL, True, by="dora").status == "pending"  # for finn
    with pytest.raises(da.ApprovalAlreadyDecided, match="counts once"):
        da.approve(run_id, CALL, True, by="finn")
    # The same decision again, by the same hands: accepted as the standing one, no new vote.
    assert da.approve(run_id, CALL, True, by="dora", for_approver="finn").status == "pending"
    assert count_effects(run_id) == {}
    assert list(Decision.objects.values_list("approver", "deputy")) == [("finn", "dora")]
    assert da.approve(run_id, CALL, True, by="fay").status == "approved"
    assert count_effects(run_id) == {CALL: 1}
    tally = Journal(site_store()).get(run_id, f"approval:{CALL}").get("tally")
    assert tally["approved_by"] == ["finn", "fay"]


def test_a_deputy_of_two_approvers_casts_one_vote_and_must_say_for_whom(people):
    run_id = refunds.start("refund 250000", by=people["fred"])
    _away("finn")
    _away("fay")
    with pytest.raises(da.ApprovalForWhom) as asked:
        da.approve(run_id, CALL, True, by="dora")
    assert sorted(asked.value.details["candidates"]) == ["fay", "finn"]
    assert da.approve(run_id, CALL, True, by="dora", for_approver="fay").status == "pending"
    with pytest.raises(da.ApprovalAlreadyDecided, match="a person counts once"):
        da.approve(run_id, CALL, True, by="dora", for_approver="finn")
    assert count_effects(run_id) == {}


@pytest.mark.parametrize("kind", ["lead", "quorum"])
def test_approver_and_deputy_voting_at_the_same_moment_count_once(people, kind):
    if kind == "lead":
        run_id, approver = _lead_call("dl-race"), "lena"
    else:
        run_id, approver = refunds.start("refund 250000", by=people["fred"]), "finn"
    _away(approver)
    votes = [
        {"by": approver},
        {"by": "dora", "for_approver": approver},
    ]

    def vote(i: int) -> str:
        try:
            return da.approve(run_id, CALL, True, **votes[i]).status
        except da.ApprovalAlreadyDecided:
            return "refused"

    results = in_threads(2, vote)
    rows = list(Decision.objects.filter(request__run_id=run_id))
    assert len(rows) == 1 and rows[0].approver == approver  # one vote, whoever made it
    if kind == "lead":
        # 1-of-1: both may answer "approved" (the second as the standing decision).
        assert "approved" in results
        assert count_effects(run_id) == {CALL: 1}
    else:
        assert sorted(results) == ["pending", "refused"]
        assert count_effects(run_id) == {}
        assert da.approve(run_id, CALL, True, by="fay").status == "approved"
        assert count_effects(run_id) == {CALL: 1}


# -- what gives nothing ---------------------------------------------------------------------


def _ended(approver: str) -> None:
    now = timezone.now()
    made = da.delegate(approver, "dora", now, now + timedelta(seconds=1), by=approver)
    deadline = time.monotonic() + 10
    while Delegation.objects.filter(pk=made.id, ends_at__gt=site_store().now()).exists():
        assert time.monotonic() < deadline, "the delegation never ended"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "which", ["ended", "not started", "revoked", "other tools", "other groups", "none"]
)
def test_a_delegation_not_in_force_for_the_call_gives_nothing(people, which):
    run_id = _lead_call(f"dl-{which.replace(' ', '-')}")
    now = timezone.now()
    if which == "ended":
        _ended("lena")
    elif which == "not started":
        da.delegate("lena", "dora", now + timedelta(days=1), now + WEEK, by="lena")
    elif which == "revoked":
        da.revoke_delegation(_away("lena").id, by="lena")
    elif which == "other tools":
        _away("lena", tools=["send_receipt"])
    elif which == "other groups":
        _away("lena", groups=[FINANCE])
    before = _writes()
    with pytest.raises(da.ApproverNotEligible):
        da.approve(run_id, CALL, True, by="dora")
    with pytest.raises(da.ApproverNotEligible, match="no delegation"):
        da.approve(run_id, CALL, True, by="dora", for_approver="lena")
    assert _writes() == before and count_effects(run_id) == {}
    # An approver the call is not asked of gives nothing either, in force or not.
    _away("fay")
    with pytest.raises(da.ApproverNotEligible):
        da.approve(run_id, CALL, True, by="dora", for_approver="fay")
    assert _writes() == before


def test_separation_of_duties_holds_through_a_deputy(people):
    # The delegator asked for the refund: their deputy may not approve it for them.
    asked = refunds.start("refund 250000", by=people["fred"])
    _away("fred")
    with pytest.raises(da.ApproverNotEligible):
        da.approve(asked, CALL, True, by="dora")
    with pytest.raises(da.ApproverNotEligible, match="separation of duties"):
        da.approve(asked, CALL, True, by="dora", for_approver="fred")
    # The deputy asked for it: they may not approve it for anyone.
    theirs = refunds.start("refund 250000", by=people["dora"])
    _away("finn")
    with pytest.raises(da.ApproverNotEligible, match="separation of duties"):
        da.approve(theirs, CALL, True, by="dora", for_approver="finn")
    with pytest.raises(da.ApproverNotEligible):
        da.approve(theirs, CALL, True, by="dora")
    assert not Decision.objects.exists()
    assert count_effects(asked) == count_effects(theirs) == {}


def test_an_inactive_or_unpermitted_deputy_or_approver_decides_nothing(people):
    run_id = _lead_call("dl-inactive")
    _away("lena")
    User.objects.filter(username="lena").update(is_active=False)
    with pytest.raises(da.ApproverNotEligible):
        da.approve(run_id, CALL, True, by="dora", for_approver="lena")
    User.objects.filter(username="lena").update(is_active=True)
    people["dora"].user_permissions.clear()
    with pytest.raises(da.ApproverNotEligible):
        da.approve(run_id, CALL, True, by="dora", for_approver="lena")
    assert not Decision.objects.exists()


# -- every path, one rule -------------------------------------------------------------------


def _call_url(run_id: str) -> str:
    request = ApprovalRequest.objects.get(run_id=run_id, call_id=CALL)
    return reverse("admin:durable_agents_approvalrequest_change", args=[request.pk])


def _signature(private, run_id: str, signer: str, for_approver: str | None) -> str:
    request = ApprovalRequest.objects.get(run_id=run_id, call_id=CALL)
    start = JournalEntry.objects.get(run_id=run_id, name="run:start")
    message = da.decision_bytes(
        incarnation=json.loads(start.data)["incarnation"],
        run_id=run_id,
        call_id=CALL,
        tool_name=request.tool_name,
        arguments=request.arguments,
        approver_id=str(User.objects.get(username=signer).pk),
        approved=True,
        for_approver_id=str(User.objects.get(username=for_approver).pk) if for_approver else None,
    )
    return base64.b64encode(private.sign(message)).decode()


def _decide(path: str, run_id: str, for_approver: str | None, dora: User) -> str:
    """Dora decides ``run_id`` through ``path``; the code it was refused with, or "ok"."""
    if path == "python":
        try:
            da.approve(run_id, CALL, True, by="dora", for_approver=for_approver)
        except da.DurableAgentsError as exc:
            return exc.code
        return "ok"
    if path in ("api key", "signed relay"):
        url = f"/runs/{run_id}/approvals/{CALL}"
        body: dict = {"approved": True, **({"for_approver": for_approver} if for_approver else {})}
        if path == "api key":
            answer = with_key(dora).post(url, body)
        else:
            private, public = keypair()
            ApproverKey.objects.get_or_create(
                user=dora, defaults={"public_key": public, "confirmed_at": timezone.now()}
            )
            ApproverKey.objects.filter(user=dora).update(public_key=public)
            body.update(
                approver="dora", signature=_signature(private, run_id, "dora", for_approver)
            )
            relay = with_key(make_user(f"relay-{uuid.uuid4().hex[:8]}", "view_approvalrequest"))
            answer = relay.post(url + "/signed", body)
        return "ok" if answer.status_code == 200 else answer.json()["code"]
    if path == "admin form":
        request = ApprovalRequest.objects.get(run_id=run_id, call_id=CALL)
        decide = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
        post = {"decision": "approve", "shown": shown(request), "note": ""}
        if for_approver:
            post["for_approver"] = for_approver
        said = " ".join(messages_of(client_for(dora).post(decide, post)))
        return "ok" if "approved" in said and "[" not in said else said.rsplit("[", 1)[-1][:-1]
    out = StringIO()
    try:
        call_command(
            "durable_agents",
            "approve",
            run_id,
            CALL,
            "--by",
            "dora",
            *(["--for", for_approver] if for_approver else []),
            stdout=out,
        )
    except CommandError as exc:
        return str(exc)
    except da.DurableAgentsError as exc:
        return exc.code
    return "ok"


PATHS = ["python", "api key", "admin form", "signed relay", "command"]


@pytest.mark.parametrize("path", PATHS)
def test_every_path_asks_the_same_rule(people, path):
    dora = people["dora"]
    slug = path.replace(" ", "-")
    # Nobody's deputy: refused, nothing written.
    run_id = _lead_call(f"dl-no-{slug}")
    before = _writes()
    said = _decide(path, run_id, "lena", dora)
    assert "approval.not_eligible" in said, said
    assert _writes() == before
    # Both leads away, dora the deputy of each: she must say for whom (a signature names
    # nobody else unless it binds them: her own decision, and she is no lead).
    for_lena = _away("lena")
    _away("leo")
    said = _decide(path, run_id, None, dora)
    wanted = "approval.not_eligible" if path == "signed relay" else "approval.for_approver_needed"
    assert wanted in said, said
    assert _writes() == before
    assert _decide(path, run_id, "lena", dora) == "ok"
    row = Decision.objects.get(request__run_id=run_id)
    assert (row.approver, row.deputy) == ("lena", "dora")
    assert count_effects(run_id) == {CALL: 1}
    # Lena back early: nothing for her again.
    da.revoke_delegation(for_lena.id, by="lena")
    again = _lead_call(f"dl-again-{slug}")
    before = _writes()
    assert "approval.not_eligible" in _decide(path, again, "lena", dora)
    assert _writes() == before


def test_a_signed_decision_binds_the_approver_it_is_for(people):
    run_id = _lead_call("dl-signed")
    _away("lena")
    private, public = keypair()
    ApproverKey.objects.create(user=people["dora"], public_key=public, confirmed_at=timezone.now())
    relay = with_key(make_user("relay", "view_approvalrequest"))
    url = f"/runs/{run_id}/approvals/{CALL}/signed"
    # Signed as dora's own decision, relayed as one for lena: refused, and the other way.
    own = _signature(private, run_id, "dora", None)
    body = {"approver": "dora", "approved": True, "for_approver": "lena", "signature": own}
    error(relay.post(url, body), 400, "approval.bad_signature")
    for_lena = _signature(private, run_id, "dora", "lena")
    as_her_own = {"approver": "dora", "approved": True, "signature": for_lena}
    error(relay.post(url, as_her_own), 400, "approval.bad_signature")
    as_her_own["signature"] = own  # verifies, and dora is no lead
    error(relay.post(url, as_her_own), 403, "approval.not_eligible")
    assert not Decision.objects.exists()
    body["signature"] = for_lena
    assert relay.post(url, body).status_code == 200
    row = Decision.objects.get()
    assert (row.approver, row.deputy, row.signature) == ("lena", "dora", for_lena)


# -- recording and revoking -----------------------------------------------------------------


def test_who_may_record_and_end_a_delegation(people):
    now = timezone.now()
    with pytest.raises(ActorForbidden):
        da.delegate("lena", "dora", now, now + WEEK, by="leo")
    made = da.delegate("lena", "dora", now, now + WEEK, by="ada")  # delegate_approvals
    with pytest.raises(da.DelegationOverlaps):
        da.delegate("lena", "leo", now + timedelta(days=1), now + WEEK, by="lena")
    with pytest.raises(da.DelegationError) as refused:
        da.delegate("fay", "nick", now, now + WEEK, by="fay")  # nick may decide nothing
    assert refused.value.code == "delegation.not_eligible"
    with pytest.raises(ActorForbidden):
        da.revoke_delegation(made.id, by="leo")
    ended = da.revoke_delegation(made.id, by="dora")  # the deputy declines
    assert ended.revoked_by == "dora"
    actions = list(ActionLog.objects.order_by("id").values_list("actor", "action", "target"))
    assert actions == [
        ("ada", "delegate", f"delegation:{made.id}"),
        ("dora", "revoke-delegation", f"delegation:{made.id}"),
    ]


def test_the_delegations_api(people):
    lena, dora, ada = (as_session(people[n]) for n in ("lena", "dora", "ada"))
    now = timezone.now()
    body = {"deputy": "dora", "ends_at": (now + WEEK).isoformat(), "groups": [LEADS]}
    made = lena.post("/delegations", body)
    assert made.status_code == 201, made.content
    item = made.json()
    assert (item["approver"], item["deputy"], item["state"]) == ("lena", "dora", "in_force")
    assert item["groups"] == [LEADS] and item["tools"] == []
    # Coded refusals, nothing written.
    count = Delegation.objects.count()
    error(lena.post("/delegations", body), 409, "delegation.overlaps")
    error(lena.post("/delegations", {**body, "approver": "leo"}), 403, "actor.forbidden")
    error(lena.post("/delegations", {**body, "deputy": "lena"}), 400, "delegation.invalid")
    error(lena.post("/delegations", {**body, "deputy": "nick"}), 400, "delegation.not_eligible")
    past = {**body, "ends_at": (now - WEEK).isoformat()}
    error(lena.post("/delegations", past), 400, "delegation.invalid")
    naive = {**body, "ends_at": (now + WEEK).replace(tzinfo=None).isoformat()}
    error(lena.post("/delegations", naive), 400, "delegation.invalid")
    error(as_session(people["nick"]).post("/delegations", body), 403, "auth.forbidden")
    assert Delegation.objects.count() == count
    # ada records one for fay; each sees what names them, ada everything.
    assert ada.post("/delegations", {**body, "approver": "fay", "groups": []}).status_code == 201
    assert [d["approver"] for d in lena.get("/delegations").json()["items"]] == ["lena"]
    assert sorted(d["approver"] for d in dora.get("/delegations").json()["items"]) == [
        "fay",
        "lena",
    ]
    assert ada.get("/delegations").json()["count"] == 2
    # The list of calls shows who may decide for an approver yet to decide.
    _lead_call("dl-api")
    progress = dora.get("/approvals").json()["items"][0]["progress"]
    assert progress["deputies"] == {"lena": "dora"}
    # Deciding for lena by API, then the decision says so.
    decided = dora.post(
        f"/runs/dl-api/approvals/{CALL}", {"approved": True, "for_approver": "lena"}
    )
    assert decided.status_code == 200 and decided.json()["status"] == "approved"
    listed = dora.get("/approvals", status="all").json()["items"][0]["decisions"]
    assert [(d["approver"], d["deputy"]) for d in listed] == [("lena", "dora")]
    # Revoking: 404 for nothing, 403 for someone else's, 200 for one's own.
    error(lena.post("/delegations/999999/revoke", {}), 404, "delegation.not_found")
    error(
        as_session(people["fay"]).post(f"/delegations/{item['id']}/revoke", {}),
        403,
        "actor.forbidden",
    )
    ended = lena.post(f"/delegations/{item['id']}/revoke", {"note": "back early"})
    assert ended.status_code == 200 and ended.json()["state"] == "revoked"
    assert lena.get("/delegations").json()["count"] == 0  # current: none
    assert lena.get("/delegations", state="revoked").json()["count"] == 1


def test_the_delegations_list_costs_the_same_whatever_its_length(people):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ada = with_key(people["ada"])
    admin = client_for(make_user("root", superuser=True))
    url = reverse("admin:durable_agents_delegation_changelist")

    def add(n: int, start: int) -> None:
        for i in range(start, start + n):
            name = f"away-{i}"
            make_user(name, "approve_toolcall")
            _away(name)

    def queries(fetch) -> int:
        with CaptureQueriesContext(connection) as seen:
            fetch()
        return len(seen.captured_queries)

    add(1, 0)
    few = (queries(lambda: ada.get("/delegations")), queries(lambda: admin.get(url)))
    add(15, 1)
    assert ada.get("/delegations").json()["count"] == 16
    assert text_of(admin.get(url)).count("decides for") >= 16
    assert (queries(lambda: ada.get("/delegations")), queries(lambda: admin.get(url))) == few


# -- the admin ------------------------------------------------------------------------------


def test_the_delegations_page_records_lists_and_ends(people):
    lena = client_for(people["lena"])
    url = reverse("admin:durable_agents_delegation_changelist")
    add = reverse("admin:durable_agents_delegation_add")
    assert client_for(people["nick"]).get(url).status_code == 403
    later = (timezone.localtime() + WEEK).strftime("%Y-%m-%dT%H:%M")
    # Lena may record her own only: someone else's is not a choice.
    form = {"approver": "leo", "deputy": "dora", "ends_at": later}
    assert "Select a valid choice" in text_of(lena.post(add, form))
    assert not Delegation.objects.exists()
    answer = lena.post(add, {**form, "approver": "lena", "tools": "refund", "note": "holiday"})
    assert answer.status_code == 302, text_of(answer)
    made = Delegation.objects.get()
    assert (made.approver, made.deputy, made.tools, made.created_by) == (
        "lena",
        "dora",
        ["refund"],
        "lena",
    )
    page = plain(text_of(lena.get(url)))
    assert "dora decides for lena" in page and "End now" in page
    # Overlapping: refused with the engine's code, nothing written.
    again = text_of(lena.post(add, {**form, "approver": "lena", "deputy": "leo"}))
    assert "delegation.overlaps" in again and Delegation.objects.count() == 1
    # Leo sees nothing of it; the deputy sees it.
    assert "decides for" not in text_of(client_for(people["leo"]).get(url))
    assert "lena" in text_of(client_for(people["dora"]).get(url))
    # The inbox says what is delegated, to whom.
    inbox = plain(text_of(client_for(people["dora"]).get(reverse("admin:durable_agents_inbox"))))
    assert "Delegated to you: you decide for lena" in inbox
    # Leo cannot end it; lena ends it early.
    revoke = reverse("admin:durable_agents_delegation_revoke", args=[made.pk])
    leo = client_for(people["leo"]).post(revoke, {})
    assert leo.status_code == 302 and Delegation.objects.get().revoked_at is None
    assert lena.post(revoke, {"note": "back"}).status_code == 302
    made.refresh_from_db()
    assert made.revoked_by == "lena" and made.revoked_at is not None
    assert ActionLog.objects.filter(action="revoke-delegation", actor="lena").exists()


def test_the_card_and_the_call_page_decide_for_the_approver(people):
    run_id = _lead_call("dl-card")
    dora = client_for(people["dora"])
    inbox = reverse("admin:durable_agents_inbox")
    assert "You may not decide this call" in text_of(dora.get(inbox))
    _away("lena")
    card = text_of(dora.get(inbox))
    said = plain(card)
    assert "Delegated to you by lena (until" in said and "you decide it for them" in said
    assert 'name="for_approver" value="lena"' in card
    assert "dl-card" in text_of(dora.get(inbox, {"mine": "1"}))
    page = plain(text_of(dora.get(_call_url(run_id))))
    assert "You decide this call for lena" in page
    request = ApprovalRequest.objects.get(run_id=run_id)
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
    dora.post(decide, {"decision": "approve", "shown": shown(request), "for_approver": "lena"})
    assert count_effects(run_id) == {CALL: 1}
    assert "decided by dora for lena" in plain(
        text_of(client_for(people["lena"]).get(_call_url(run_id)))
    )


# -- a deputy's signed decision, imported live ----------------------------------------------


def test_a_deputys_signed_decision_imports_live_only_under_a_delegation_here(people):
    """A refund approved by Dora for Lena, signed by Dora over bytes binding Lena, exported
    and imported live: verified as a relay here now would be, so only while a delegation
    from Lena to Dora covers it here; then driven, firing once."""
    from durable_agents.engine.approvals import incarnation_of
    from durable_agents.engine.errors import ImportRefused
    from durable_agents.people_keys import register_approver_key
    from durable_agents.transfer import export_lines, import_lines
    from tests.support.agents import gated
    from tests.support.wiring import wired

    dora, lena = people["dora"], people["lena"]
    private, public = keypair()
    register_approver_key(dora, public, by=dora)
    made = _away("lena")
    held: list[str] = []
    with wired(dispatcher=held.append):
        gated.start("refund order 7", run_id="dl-live")
        with pytest.raises(da.Pause):
            da.resume("dl-live")
        request = ApprovalRequest.objects.get(run_id="dl-live")
        message = da.decision_bytes(
            incarnation=incarnation_of(site_store(), "dl-live"),
            run_id="dl-live",
            call_id=request.call_id,
            tool_name=request.tool_name,
            arguments=request.arguments,
            approver_id=str(dora.pk),
            approved=True,
            note="ok",
            for_approver_id=str(lena.pk),
        )
        signature = base64.b64encode(private.sign(message)).decode()
        da.approve(
            "dl-live",
            request.call_id,
            True,
            by=dora,
            note="ok",
            signature=signature,
            for_approver="lena",
        )
    assert "dl-live" in held and count_effects("dl-live") == {}
    lines = list(export_lines("dl-live"))
    Run.objects.filter(run_id="dl-live").delete()
    ActionLog.objects.filter(run_id="dl-live").delete()
    importer = make_user("importer", "import_runs")
    da.revoke_delegation(made.id, by="lena")
    with pytest.raises(ImportRefused, match="no delegation"):
        import_lines(lines, by=importer, live=True)
    assert not Run.objects.filter(run_id="dl-live").exists()
    _away("lena")
    assert import_lines(lines, by=importer, live=True) == ["dl-live"]
    assert gated.run("dl-live", "refund order 7").answer == "refunded"
    assert count_effects("dl-live") == {request.call_id: 1}


# -- telling people -------------------------------------------------------------------------


def test_an_away_leads_deputy_is_emailed_and_a_decision_notice_names_both(people, settings):
    from django.conf import settings as django_settings
    from django.core import mail

    from durable_agents.notifications import deliver

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"BASE_URL": "https://ops.example.com/", "CHANNELS": [{"kind": "email"}]},
    }
    for name in ("lena", "leo", "dora", "fay"):
        User.objects.filter(username=name).update(email=f"{name}@example.com")
    _away("lena")
    mail.outbox.clear()
    run_id = _lead_call("dl-mail")
    deliver()
    # The leads, and lena's deputy in her place; finance is not asked.
    assert sorted(m.to[0] for m in mail.outbox) == [
        "dora@example.com",
        "lena@example.com",
        "leo@example.com",
    ]
    mail.outbox.clear()
    da.approve(run_id, CALL, True, by="dora")
    deliver()
    assert mail.outbox  # to the leads (lena's deputy among them)
    assert {m.subject.split(":")[0] for m in mail.outbox} == {"Approved by dora for lena"}
