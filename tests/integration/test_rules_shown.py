"""What people see of the approval rules (issue 42, "Where people see it"), on PostgreSQL
through Django's test client: the card, the run page's banner, the call's page and the
queue's row say which rule asked and why, with the values that decided it, who decides, an
edit that moved the call under a stricter rule, the deadline and escalation state, and who
decided for whom (the API says the same: test_api_rules.py); the inbox filters *escalated
to me* and *delegated to me*; the timeline shows rule records, automatic decisions, edits
that moved a call and deadline steps. Pages keep a constant number of queries.

The refund policy with its deadline is tests/support/rule_desk.py; a request is put where
the timer sweep would leave it at a point of its deadline (``age``, ``escalate``)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents.models import ApprovalRequest, Decision, Delegation
from tests.support.admin_pages import client_for, text_of
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS, ONCALL
from tests.support.rule_desk import CALL, age, desk, escalate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

INBOX = "/admin/durable_agents/inbox/"
QUEUE = "/admin/durable_agents/approvalrequest/"
SEES = ("durable_agents.view_run", "durable_agents.view_approvalrequest")
DECIDES = (*SEES, "durable_agents.approve_toolcall")


def card(page: str, pk: int) -> str:
    match = re.search(
        rf'<li class="da-card [^"]*" id="approval-{pk}">(.*?)</li>\s*(?=<li class="da-card|</ol>)',
        page,
        re.S,
    )
    assert match, f"no card approval-{pk} on the page"
    return match.group(1)


def card_ids(page: str) -> list[str]:
    return re.findall(r'<li class="da-card [^"]*" id="([^"]+)"', page)


def plain(markup: str) -> str:
    """The text of (unescaped) HTML: tags start with a letter, "/" or "!", so an explained
    comparison ("amount_cents 4000 <= 5000") stays."""
    return re.sub(r"\s+", " ", re.sub(r"<[A-Za-z/!][^>]*>", "", markup))


def run_page(client, run_id: str) -> str:
    return text_of(client.get(reverse("admin:durable_agents_run_change", args=[quote(run_id)])))


def call_page(client, request: ApprovalRequest) -> str:
    url = reverse("admin:durable_agents_approvalrequest_change", args=[request.pk])
    return text_of(client.get(url))


@pytest.fixture
def people():
    return {
        "lena": make_user("lena", *DECIDES, groups=(LEADS,)),
        "fay": make_user("fay", *DECIDES, groups=(FINANCE,)),
        "finn": make_user("finn", *DECIDES, groups=(FINANCE,)),
        "fred": make_user("fred", *DECIDES, "durable_agents.add_run", groups=(FINANCE,)),
        "olga": make_user("olga", *DECIDES, groups=(ONCALL,)),
        "dan": make_user("dan", *DECIDES),  # in no group: decides for others, if at all
    }


def ask(run_id: str, cents: int) -> ApprovalRequest:
    with pytest.raises(da.ApprovalPending):
        desk.run(run_id, f"refund {cents}")
    return ApprovalRequest.objects.get(run_id=run_id)


def test_the_card_says_which_rule_asked_why_who_decides_and_when_it_escalates(people):
    lead = ask("rs-lead", 50_000)
    age("rs-lead", hours=21)  # its reminder went by; the escalation is 3 h away
    big_id = desk.start("refund 250000", by=people["fred"])
    big = ApprovalRequest.objects.get(run_id=big_id)
    client = client_for(people["fay"])
    page = text_of(client.get(INBOX))

    said = plain(card(page, lead.pk))
    assert "rule lead: amount_cents 50000 <= 100000 → 1 of support-leads" in said
    assert re.search(
        r"escalates to oncall in (2 h 59 min|3 h) · expires in 2 d 2 h, then denied", said
    )
    assert "reminds" not in said  # its time went by
    # The tool's summary and its identifying fields, as before; the bar is untouched.
    assert "Refund 50,000 cents on order 7" in said

    said = plain(card(page, big.pk))
    assert "rule default: no other rule matched → 2 of finance, not fred (who asked)" in said
    assert re.search(r"reminds its approvers in (3 h 59 min|4 h) · escalates to oncall in", said)
    assert "0 of 2 approved (group finance)" in said

    # The run page's banner draws the same card.
    banner = run_page(client, "rs-lead")
    banner = banner[banner.index('id="da-needed"') : banner.index('id="content-main"')]
    assert "1 of support-leads" in plain(banner) and "escalates to oncall in" in plain(banner)


def test_an_escalated_call_says_so_everywhere_and_waits_on_the_escalation_group(people):
    request = ask("rs-esc", 250_000)
    age("rs-esc", hours=25)
    escalate("rs-esc")
    oncall = client_for(people["olga"])
    page = text_of(oncall.get(INBOX))
    said = plain(card(page, request.pk))
    assert "→ 2 of finance or oncall" in said
    assert "escalated to oncall · expires in 1 d 22 h, then denied" in said
    assert 'class="da-rule da-rule-urgent"' in card(page, request.pk)
    # olga may decide it now: the card has its decision bar.
    assert "da-approve" in card(page, request.pk)

    detail = plain(call_page(oncall, request))
    assert "rule default: no other rule matched → 2 of finance or oncall" in detail
    assert "deadline escalated to oncall · expires in 1 d 22 h, then denied" in detail

    row = next(
        r for r in re.findall(r"<tr>.*?</tr>", text_of(oncall.get(QUEUE)), re.S) if "rs-esc" in r
    )
    assert "rule default: no other rule matched → 2 of finance or oncall" in plain(row)
    assert "escalated to oncall" in plain(row)

    timeline = plain(run_page(oncall, "rs-esc"))
    assert (
        "Call call_1_1 asked under rule default: no other rule matched → 2 of finance" in timeline
    )
    assert "Call call_1_1 escalated to oncall: they may decide it too" in timeline


def test_the_inbox_filters_what_escalated_to_my_groups(people):
    waits = ask("rs-f-wait", 250_000)
    escalated = ask("rs-f-esc", 250_000)
    age("rs-f-esc", hours=25)
    escalate("rs-f-esc")
    with pytest.raises(da.InterruptPending):
        from tests.support.inbox_agents import asks_staff

        asks_staff.run("rs-f-ask", "refund o-9")

    def ids(user: str, **q: str) -> list[str]:
        return card_ids(text_of(client_for(people[user]).get(INBOX, q)))

    assert ids("olga", escalated="1") == [f"approval-{escalated.pk}"]  # no question, no halt
    assert ids("fay", escalated="1") == []  # escalated to oncall, not to finance
    everything = ids("olga")
    assert f"approval-{waits.pk}" in everything and any(
        i.startswith("question-") for i in everything
    )
    page = text_of(client_for(people["olga"]).get(INBOX, {"escalated": "1"}))
    assert 'name="escalated" value="1" checked' in page


def test_the_inbox_filters_what_was_delegated_to_me(people):
    lead = ask("rs-d-lead", 50_000)
    big = ask("rs-d-big", 250_000)
    now = timezone.now()
    week = {"starts_at": now - timedelta(hours=1), "ends_at": now + timedelta(days=7)}
    Delegation.objects.create(approver="lena", deputy="dan", created_by="lena", **week)
    # Not in force, or not for these calls: revoked, over, another tool, another group.
    Delegation.objects.create(
        approver="fay", deputy="dan", created_by="fay", revoked_at=now, **week
    )
    Delegation.objects.create(
        approver="finn",
        deputy="dan",
        created_by="finn",
        starts_at=now - timedelta(days=9),
        ends_at=now - timedelta(days=2),
    )
    Delegation.objects.create(
        approver="fred", deputy="dan", created_by="fred", tools=["wire_money"], **week
    )

    def page(**q: str) -> str:
        return text_of(client_for(people["dan"]).get(INBOX, q))

    delegated = page(delegated="1")
    assert card_ids(delegated) == [f"approval-{lead.pk}"]
    said = plain(card(delegated, lead.pk))
    assert "Delegated to you by lena (until" in said and "you decide it for them" in said
    # Without the filter, the card says it too; the call nobody delegated says nothing.
    assert "Delegated to you by lena" in plain(card(page(), lead.pk))
    assert "Delegated to you" not in card(page(), big.pk)
    # Finance's delegation for every call: the quorum call of finance is delegated too.
    Delegation.objects.create(approver="finn", deputy="dan", created_by="finn", **week)
    assert card_ids(page(delegated="1")) == [f"approval-{lead.pk}", f"approval-{big.pk}"]
    # Once the approver voted, there is nothing left to decide for them.
    da.approve("rs-d-big", CALL, True, by="finn")
    assert card_ids(page(delegated="1")) == [f"approval-{lead.pk}"]
    # A delegation only for group finance does not cover the leads' call.
    Delegation.objects.filter(approver="lena").update(groups=[FINANCE])
    assert card_ids(page(delegated="1")) == []
    # Someone who may decide a call themselves is not shown it as delegated.
    Delegation.objects.create(approver="leo", deputy="lena", created_by="leo", **week)
    make_user("leo", *DECIDES, groups=(LEADS,))
    assert card_ids(text_of(client_for(people["lena"]).get(INBOX, {"delegated": "1"}))) == []


def test_an_edit_that_moved_a_call_is_shown_with_what_it_changes_and_how_to_approve_it(people):
    request = ask("rs-moved", 40_000)
    raised = {"order_id": "7", "amount_cents": 400_000}
    assert da.approve("rs-moved", CALL, True, by="lena", edit=raised).status == "pending"
    fay = client_for(people["fay"])
    page = text_of(fay.get(INBOX))
    said = card(page, request.pk)
    assert "rule default: no other rule matched → 2 of finance" in plain(said)
    assert "An edit moved this call under rule default (it was under rule lead)" in plain(said)
    changes = said[said.index("da-changes") : said.index("</dl>", said.index("da-changes"))]
    assert "Amount Cents" in changes and "400,000 — was 40,000" in plain(changes)
    assert "Order" not in plain(changes)  # unchanged arguments are not listed as changes
    # A plain Approve would be refused (the approvals are for the edit): the way to it.
    assert 'da-approve"' not in said and "Approve the edit…" in said

    detail = call_page(fay, request)
    assert "An edit moved this call under rule default" in plain(detail)
    textarea = re.search(r'<textarea name="edit"[^>]*>(.*?)</textarea>', detail, re.S).group(1)
    assert '"amount_cents": 400000' in textarea
    assert '<details id="da-edit-arguments" open>' in detail
    assert 'value="approve" class="button default da-approve"' not in detail

    # The queue's row sends the approver to the call's page, where the edit is.
    rows = re.findall(r"<tr>.*?</tr>", text_of(fay.get(QUEUE)), re.S)
    row = next(r for r in rows if "rs-moved" in r)
    assert "da-row-approve" not in row and "Open to decide" in row

    timeline = plain(run_page(fay, "rs-moved"))
    assert (
        "Call call_1_1 asked under rule lead: amount_cents 40000 <= 100000 → 1 of support-leads"
        in timeline
    )
    assert (
        "An edit moved call call_1_1 under rule default: no other rule matched → 2 of finance"
        in timeline
    )
    assert "it was under rule lead" in timeline

    # Approved with the same edit by two of finance, it runs.
    da.approve("rs-moved", CALL, True, by="fay", edit=raised)
    assert da.approve("rs-moved", CALL, True, by="finn", edit=raised).status == "approved"


def test_the_timeline_shows_automatic_decisions_with_their_rule(people):
    desk.run("rs-small", "refund 4000")
    desk.run("rs-big", "refund 600000")
    client = client_for(people["fay"])
    small = plain(run_page(client, "rs-small"))
    assert "Call call_1_1 allowed by rule small: amount_cents 4000 <= 5000" in small
    assert "automatic: nobody was asked" in small
    big = plain(run_page(client, "rs-big"))
    assert "Call call_1_1 refused by rule too-big: amount_cents 600000 > 500000" in big
    assert "Refunds above 5,000 EUR are done by phone" in big


def test_the_call_page_says_who_decided_for_whom(people):
    request = ask("rs-deputy", 250_000)
    da.approve("rs-deputy", CALL, True, by="fay")
    # As a delegation records it: finn's vote, made by his deputy.
    Decision.objects.filter(request=request, approver="fay").update(deputy="dan")
    client = client_for(people["finn"])
    detail = call_page(client, request)
    assert "fay (decided by dan for them)" in plain(detail)
    assert "needs 2 approvals from group finance: 1 of 2 so far" in plain(detail)


def test_the_pages_read_rules_in_a_constant_number_of_queries(people):
    now = timezone.now()
    Delegation.objects.create(
        approver="lena",
        deputy="dan",
        created_by="lena",
        starts_at=now - timedelta(hours=1),
        ends_at=now + timedelta(days=1),
    )

    def many(n: int, start: int) -> None:
        for i in range(start, start + n):
            ask(f"rs-n-lead-{i}", 50_000)
            ask(f"rs-n-esc-{i}", 250_000)
            escalate(f"rs-n-esc-{i}")
            request = ask(f"rs-n-moved-{i}", 40_000)
            da.approve(
                request.run_id,
                CALL,
                True,
                by="lena",
                edit={"order_id": "7", "amount_cents": 400_000},
            )

    pages = {
        "inbox": (client_for(people["dan"]), INBOX, {}),
        "inbox delegated": (client_for(people["dan"]), INBOX, {"delegated": "1"}),
        "inbox escalated": (client_for(people["olga"]), INBOX, {"escalated": "1"}),
        "queue": (client_for(people["fay"]), QUEUE, {}),
    }

    def counts() -> dict[str, int]:
        out = {}
        for name, (client, url, query) in pages.items():
            with CaptureQueriesContext(connection) as seen:
                assert client.get(url, query).status_code == 200
            out[name] = len(seen.captured_queries)
        return out

    many(1, 0)
    few = counts()
    many(4, 1)
    assert len(card_ids(text_of(client_for(people["dan"]).get(INBOX, {"delegated": "1"})))) == 5
    assert counts() == few
