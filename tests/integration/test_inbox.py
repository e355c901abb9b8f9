"""The approver's inbox on PostgreSQL through Django's test client (issue 30): one card per
thing waiting on a person, arguments rendered for people and folded, no decision from a
folded card, the tool's own words on a halt, questions with nothing chosen, filters, and
the queue's row buttons never offered on arguments the row cut."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.models import ApprovalRequest, Decision, Halt, Run
from tests.support.admin_pages import client_for, messages_of, text_of
from tests.support.agents import count_effects, gated_tree, quorum
from tests.support.inbox_agents import (
    GATEWAY_MESSAGE,
    MEMO,
    PAYEE,
    REASON,
    asks_staff,
    padded_payment,
    unsure_transfer,
)
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

INBOX = "/admin/durable_agents/inbox/"
APPROVER = ("durable_agents.view_run", "durable_agents.approve_toolcall")


def card(page: str, card_id: str) -> str:
    """One card's HTML out of the inbox page."""
    match = re.search(
        rf'<li class="da-card [^"]*" id="{card_id}">(.*?)</li>\s*(?=<li class="da-card|</ol>)',
        page,
        re.S,
    )
    assert match, f"no card {card_id} on the page"
    return match.group(1)


def card_ids(page: str) -> list[str]:
    return re.findall(r'<li class="da-card [^"]*" id="([^"]+)"', page)


def plain(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


@pytest.fixture
def waiting():
    """A padded payment awaiting approval, a quorum payment, a call deep in a tree of
    sub-runs, a question and a halt that says why."""
    with pytest.raises(da.ApprovalPending):
        padded_payment.run("ib-pay", "pay the supplier")
    with pytest.raises(da.ApprovalPending):
        quorum.run("ib-quorum", "pay inv-1")
    with pytest.raises(da.ApprovalPending):
        gated_tree[0].run("ib-tree", "go")
    with pytest.raises(da.InterruptPending):
        asks_staff.run("ib-ask", "refund o-9")
    with pytest.raises(da.OutcomeUnknown):
        unsure_transfer.run("ib-halt", "move 42")
    return {
        "pay": ApprovalRequest.objects.get(run_id="ib-pay"),
        "quorum": ApprovalRequest.objects.get(run_id="ib-quorum"),
        "leaf": ApprovalRequest.objects.get(run__root_run_id="ib-tree", tool_name="wire_money"),
        "halt": Halt.objects.get(run_id="ib-halt"),
    }


def test_the_inbox_shows_each_thing_waiting_as_a_person_reads_it(waiting):
    assert reverse("admin:durable_agents_inbox") == INBOX
    client = client_for(make_user("ann", *APPROVER, "durable_agents.view_halt"))
    page = text_of(client.get(INBOX))
    pay = card(page, f"approval-{waiting['pay'].pk}")
    # The tool's summary, the payee under its schema title before the memo, the model's
    # reason, the amount grouped.
    assert f"Pay 12,500.00 EUR to {PAYEE}" in pay
    fields = pay[pay.index('class="da-args"') :]
    assert fields.index("Payee") < fields.index(PAYEE) < fields.index("Memo")
    assert REASON in pay and "1,250,000" in pay
    # The memo keeps its line breaks, is folded, and the card offers no decision.
    assert "Hello accounts team,\n\nplease pay invoice INV-7 today." in pay
    assert MEMO not in pay and "more characters" in pay and "more items" in pay
    assert "da-approve" not in pay and "Show all to decide" in pay

    quorum_card = card(page, f"approval-{waiting['quorum'].pk}")
    assert "0 of 2 approved (group finance)" in quorum_card
    assert "You may not decide this call" in quorum_card  # ann is not in group finance

    leaf = waiting["leaf"]
    tree = card(page, f"approval-{leaf.pk}")
    # The root, the middle run and the waiting sub-run, each a link.
    assert 'href="/admin/durable_agents/run/ib-tree/change/"' in tree
    assert "in a sub-run of root" in tree and leaf.run_id in tree

    halt = card(page, f"halt-{waiting['halt'].pk}")
    assert f"ToolOutcomeUnknown: {GATEWAY_MESSAGE}" in plain(halt)
    assert "Move money through the payment gateway" in halt  # the tool's description

    # The question: nothing chosen until the person chooses.
    question = re.search(r'<li class="da-card da-card-question".*?</li>', page, re.S).group(0)
    assert "Grant a refund exception for o-9?" in question
    assert re.search(r'<option value=""[^>]*selected>— choose —</option>', question)
    assert 'value="&quot;grant&quot;" selected' not in question
    assert question.count(" selected") == 1

    # The longest waiting first.
    ids = card_ids(page)
    assert ids[0] == f"approval-{waiting['pay'].pk}" and ids[-1] == f"halt-{waiting['halt'].pk}"


def test_a_folded_card_decides_nothing_and_a_whole_one_decides_what_it_showed(waiting):
    pay = waiting["pay"]
    client = client_for(make_user("ann", *APPROVER))
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[pay.pk])
    # What a folded card would post, had it a button: no arguments shown whole. Refused.
    response = client.post(decide, {"decision": "approve", "back": "inbox"})
    assert response.status_code == 302 and response["Location"] == INBOX
    [said] = messages_of(response)
    assert "Nothing was decided" in said and "approval.not_shown_whole" in said
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "pending"
    assert not Decision.objects.exists() and count_effects("ib-pay") == {}

    # Opened whole: all of the memo and every line, and now the buttons.
    raw = client.get(INBOX, {"whole": f"approval-{pay.pk}"}).content.decode()
    opened = card(html.unescape(raw), f"approval-{pay.pk}")
    assert MEMO in opened and "line 14: widget batch 14" in opened
    assert "more characters" not in opened and "da-approve" in opened
    # The form posts back the arguments the card showed whole (the engine checks them).
    shown = html.unescape(re.search(r'name="shown" value="([^"]*)"', raw).group(1))
    assert json.loads(shown) == pay.arguments

    response = client.post(
        decide, {"decision": "approve", "back": "inbox", "shown": shown, "note": ""}
    )
    assert response.status_code == 302 and response["Location"] == INBOX
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "approved"
    assert count_effects("ib-pay") == {"call_1_1": 1}  # the inline driver ran it, once
    assert f"approval-{pay.pk}" not in text_of(client.get(INBOX))


def test_filters_by_agent_tool_and_what_i_may_decide(waiting):
    finance = make_user("fin", *APPROVER, groups=("finance",))
    make_user("fay", *APPROVER, groups=("finance",))  # a quorum of two needs two members
    client = client_for(finance)

    def ids(**q: str) -> list[str]:
        return card_ids(text_of(client.get(INBOX, q)))

    assert ids(agent="quorum") == [f"approval-{waiting['quorum'].pk}"]
    assert ids(tool="wire_money") == [f"approval-{waiting['leaf'].pk}"]
    mine = ids(mine="1")
    assert f"approval-{waiting['quorum'].pk}" in mine and f"approval-{waiting['pay'].pk}" in mine
    assert not any(i.startswith("halt-") for i in mine)  # fin may not resolve halts
    # Once fin has voted, the quorum call waits on others, not on fin.
    da.approve("ib-quorum", "call_1_1", True, by="fin")
    assert f"approval-{waiting['quorum'].pk}" not in ids(mine="1")
    page = text_of(client.get(INBOX))
    assert "1 of 2 approved (group finance): fin approved" in plain(page)
    # The filters' choices come from what waits.
    assert '<option value="inbox-payment">' in page and '<option value="wire_money">' in page


def test_who_may_see_the_inbox(waiting):
    assert client_for(make_user("nobody")).get(INBOX).status_code == 403
    viewer = text_of(client_for(make_user("halts", "durable_agents.view_halt")).get(INBOX))
    assert f"halt-{waiting['halt'].pk}" in viewer and "approval-" not in viewer
    assert client_for(None).get(INBOX).status_code == 302  # to the login page


def test_a_queue_row_never_offers_a_decision_on_arguments_it_cut(waiting):
    # In the quorum's group: its row is one ann may decide (the queue asks the same
    # eligibility check as the inbox: tests/integration/test_admin_trust).
    client = client_for(make_user("ann", *APPROVER, groups=("finance",)))
    page = text_of(client.get(reverse("admin:durable_agents_approvalrequest_changelist")))
    rows = re.findall(r"<tr>.*?</tr>", page, re.S)
    padded = next(r for r in rows if "ib-pay" in r)
    plain = next(r for r in rows if "ib-quorum" in r)
    assert "da-row-approve" not in padded and "Open to decide" in padded
    assert "da-row-approve" in plain


def test_the_runs_list_counts_what_waits_below_a_root_and_leaves_out_session_journals(waiting):
    Run.objects.create(run_id="ib-s>session", agent="echo", kind="session", session_id="ib-s")
    client = client_for(make_user("ann", *APPROVER))
    page = client.get(reverse("admin:durable_agents_run_changelist")).content.decode()
    rows = {
        re.search(r'/run/([^/"]+)/change/', r).group(1): r
        for r in re.findall(r"<tr>.*?</tr>", page, re.S)
        if "/change/" in r
    }
    # The root waits on its leaf's approval: the list says so, in an amber pill.
    root = rows["ib-tree"]
    assert '<strong class="da-waits-people">1 approval</strong>' in root
    assert 'da-pill-awaiting_approval">awaiting approval<' in root
    assert "ib-s&gt;session" not in page  # a session's journal is not a run to drive
    everything = client.get(reverse("admin:durable_agents_run_changelist"), {"kind": "all"})
    assert "ib-s&gt;session" in everything.content.decode()


def test_a_root_run_page_shows_the_waiting_sub_run_first_and_links_its_sub_runs(waiting):
    leaf = waiting["leaf"]
    client = client_for(make_user("ann", *APPROVER))
    page = text_of(client.get(reverse("admin:durable_agents_run_change", args=["ib-tree"])))
    banner = page[page.index('id="da-needed"') : page.index('id="content-main"')]
    assert f'id="approval-{leaf.pk}"' in banner and "in a sub-run of root" in banner
    assert "da-approve" in banner  # decided right here, for the arguments shown whole
    middle = reverse("admin:durable_agents_run_change", args=[quote("ib-tree/call_1_1")])
    assert "Call call_1_1 started sub-run ib-tree/call_1_1" in page
    assert f'class="da-run-link" href="{middle}"' in page


def test_the_verify_page_checks_the_chain_and_says_where_it_broke(waiting):
    from tests.support.tamper import edit_record

    client = client_for(make_user("ann", *APPROVER))
    url = reverse("admin:durable_agents_run_verify", args=["ib-pay"])
    run_page = text_of(client.get(reverse("admin:durable_agents_run_change", args=["ib-pay"])))
    assert f'href="{url}"' in run_page
    page = plain(text_of(client.get(url)))
    assert "The run's journal" in page and "broken" not in page
    assert "No AUDIT_SIGNING_KEY is set" in page
    edit_record(DjangoStore(), "ib-pay", "run:start", '{"kind": "start", "input": "forged"}')
    page = plain(text_of(client.get(url)))
    assert "broken at" in page and "run:start" in page and "untrusted" in page
    assert "Not signed: a broken chain's head vouches for nothing." in page
    # Who may not view the run is sent back to the list, as from its export.
    refused = client_for(make_user("nobody")).get(url)
    assert refused.status_code == 302 and "verify" not in refused["Location"]


def test_the_inbox_reads_a_fixed_number_of_queries_whatever_waits():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.support.agents import gated

    client = client_for(make_user("ann", *APPROVER, "durable_agents.view_halt"))

    def wait_on(n: int, start: int) -> None:
        for i in range(start, start + n):
            with pytest.raises(da.ApprovalPending):
                gated.run(f"ib-n{i}", "refund order 7")
            with pytest.raises(da.ApprovalPending):
                quorum.run(f"ib-q{i}", "pay")
            with pytest.raises(da.InterruptPending):
                asks_staff.run(f"ib-a{i}", "refund o-9")
            with pytest.raises(da.OutcomeUnknown):
                unsure_transfer.run(f"ib-h{i}", "move 42")

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert client.get(INBOX).status_code == 200
        return len(seen.captured_queries)

    wait_on(1, 0)
    few = queries()
    wait_on(4, 1)
    assert len(card_ids(text_of(client.get(INBOX)))) == 20
    assert queries() == few
