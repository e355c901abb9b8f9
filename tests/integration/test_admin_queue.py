"""The approval queue decided from its list: inline Approve/Deny buttons and the bulk
"Approve selected" / "Deny selected" actions, each through the engine's ``approve`` (same
permissions, quorum and action log as a call's own page)."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import durable_agents as da
from durable_agents.models import ActionLog, ApprovalRequest, Decision, Halt, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.admin_pages import client_for, messages_of, shown, text_of
from tests.support.agents import count_effects, gated, halting, lookup, quorum, refund
from tests.support.journals import journal
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

QUEUE = "admin:durable_agents_approvalrequest_changelist"
APPROVE = "durable_agents.approve_toolcall"


def pending_calls(tag: str) -> tuple[ApprovalRequest, ApprovalRequest]:
    """A single-approval refund (run ``<tag>-gated``) and a 2-of-finance payout (run
    ``<tag>-quorum``); each test its own tag, as side effects are counted by run id."""
    gated.start("refund order 7", run_id=f"{tag}-gated")
    quorum.start("pay inv-1", run_id=f"{tag}-quorum")
    return (
        ApprovalRequest.objects.get(run_id=f"{tag}-gated"),
        ApprovalRequest.objects.get(run_id=f"{tag}-quorum"),
    )


def finance(*names: str) -> list[User]:
    group = Group.objects.get_or_create(name="finance")[0]
    users = [make_user(n, APPROVE) for n in names]
    group.user_set.add(*users)
    return users


def bulk(client: Client, action: str, pks: list[int], **extra: Any) -> Any:
    return client.post(
        reverse(QUEUE), {"action": action, "_selected_action": pks, "index": 0, **extra}
    )


def confirm(client: Client, action: str, rows: list[ApprovalRequest], note: str = "") -> Any:
    data: dict[str, Any] = {
        "action": action,
        "_selected_action": [r.pk for r in rows],
        "post": "yes",
        "note": note,
    }
    for r in rows:
        page = bulk(client, action, [r.pk])
        assert page.status_code == 200
        marker = f'name="shown_{r.pk}" value="'
        body = page.content.decode()
        start = body.index(marker) + len(marker)
        data[f"shown_{r.pk}"] = html.unescape(body[start : body.index('"', start)])
    return client.post(reverse(QUEUE), data)


def test_bulk_approve_confirms_then_runs_one_and_leaves_a_quorum_pending():
    single, pair = pending_calls("bq0")
    alice, _ = finance("alice", "bob")
    client = client_for(alice)

    page = bulk(client, "approve_selected", [single.pk, pair.pk])
    text = text_of(page)
    assert page.status_code == 200 and "Approve 2 tool calls" in text
    assert "Refund 5.00 to order 7" in text  # the tool's summary
    assert "Invoice: inv-1; Cents: 9900" in text  # fields, where a tool gives no summary
    assert "0 of 2 approved (group finance)" in text
    # Nothing is decided before the confirmation.
    assert not Decision.objects.exists() and not ActionLog.objects.exists()

    response = confirm(client, "approve_selected", [single, pair], note="batch ok")
    text = text_of(response)
    assert response.status_code == 200
    assert "Call call_1_1 of run bq0-gated is approved" in text
    assert "Your decision on call call_1_1 is recorded: 1 of 2 approved so far." in text
    gated_run = Run.objects.get(run_id="bq0-gated")
    assert (gated_run.status, gated_run.answer) == ("finished", "refunded")
    assert count_effects("bq0-gated") == {"call_1_1": 1}
    assert Run.objects.get(run_id="bq0-quorum").status == "awaiting_approval"
    assert ApprovalRequest.objects.get(pk=pair.pk).status == "pending"
    assert journal("bq0-gated")["approval:call_1_1"]["note"] == "batch ok"
    assert sorted(ActionLog.objects.values_list("actor", "action", "run_id", "target")) == [
        ("alice", "approve", "bq0-gated", "call_1_1"),
        ("alice", "approve", "bq0-quorum", "call_1_1"),
    ]


def test_a_quorum_vote_is_not_counted_twice_in_bulk():
    _, pair = pending_calls("bq1")
    alice, bob = finance("alice", "bob")
    client = client_for(alice)
    confirm(client, "approve_selected", [pair])
    page = text_of(bulk(client, "approve_selected", [pair.pk]))
    assert "you approved it already (you count once)" in page
    response = confirm(client, "approve_selected", [pair])
    assert "1 of 2 approved so far" in text_of(response)
    assert list(Decision.objects.values_list("approver", flat=True)) == ["alice"]
    assert Run.objects.get(run_id="bq1-quorum").status == "awaiting_approval"
    assert ActionLog.objects.count() == 1  # the repeat is not a new action

    confirm(client_for(bob), "approve_selected", [pair])
    run = Run.objects.get(run_id="bq1-quorum")
    assert (run.status, run.answer) == ("finished", "paid")
    assert journal("bq1-quorum")["approval:call_1_1"]["tally"]["approved_by"] == ["alice", "bob"]
    assert count_effects("bq1-quorum") == {"call_1_1": 1}


def test_bulk_refused_for_one_call_decides_none():
    single, pair = pending_calls("bq2")
    carol = make_user("carol", APPROVE)  # may approve, but is not in group finance
    client = client_for(carol)
    page = text_of(bulk(client, "approve_selected", [single.pk, pair.pk]))
    assert "none will be decided" in page and "approval.not_eligible" in page
    assert 'id="da-bulk-confirm"' not in page
    response = client.post(
        reverse(QUEUE),
        {
            "action": "approve_selected",
            "_selected_action": [single.pk, pair.pk],
            "post": "yes",
        },
    )
    assert "Nothing was decided" in text_of(response)
    assert not Decision.objects.exists() and not ActionLog.objects.exists()
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"pending"}
    assert "approval:call_1_1" not in journal("bq2-gated")


def test_without_the_permission_the_actions_and_buttons_are_absent_and_change_nothing():
    single, pair = pending_calls("bq3")
    viewer = client_for(make_user("viewer", "durable_agents.view_approvalrequest"))
    page = text_of(viewer.get(reverse(QUEUE)))
    assert "bq3-gated" in page
    assert "approve_selected" not in page and "da-row-approve" not in page
    for data in (
        {"action": "approve_selected", "_selected_action": [single.pk], "index": 0},
        {
            "action": "deny_selected",
            "_selected_action": [single.pk, pair.pk],
            "post": "yes",
            "note": "no",
        },
    ):
        response = viewer.post(reverse(QUEUE), data)
        assert response.status_code in (200, 302)
    response = viewer.post(
        reverse("admin:durable_agents_approvalrequest_decide", args=[single.pk]) + "?back=queue",
        {"decision": "approve", "shown": shown(single)},
    )
    assert response.status_code == 403
    assert not Decision.objects.exists() and not ActionLog.objects.exists()
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"pending"}


def test_bulk_deny_asks_for_the_message_the_model_reads():
    single, _ = pending_calls("bq4")
    root = client_for(make_user("root", superuser=True))
    page = text_of(bulk(root, "deny_selected", [single.pk]))
    assert "Message the model reads" in page
    response = confirm(root, "deny_selected", [single], note="")
    assert "Write the message the model reads" in text_of(response)
    assert not Decision.objects.exists()

    response = confirm(root, "deny_selected", [single], note="over the limit")
    assert "Call call_1_1 of run bq4-gated is denied" in text_of(response)
    result = journal("bq4-gated")["tool:call_1_1"]["result"]
    assert (result["error"], result["note"]) == ("denied", "over the limit")
    assert count_effects("bq4-gated") == {}
    assert list(ActionLog.objects.values_list("action", "target")) == [("deny", "call_1_1")]


def test_inline_buttons_post_to_the_decide_view_and_come_back_to_the_queue():
    single, pair = pending_calls("bq5")
    alice, _ = finance("alice", "bob")
    client = client_for(alice)
    page = client.get(reverse(QUEUE)).content.decode()
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[single.pk])
    # The row's buttons carry the arguments the row shows (a decision is for those).
    row = re.escape(decide) + r"\?back=queue&amp;shown_sha256=[0-9a-f]{64}"
    found = re.search(f'formaction="({row})"', page)
    assert found is not None
    assert page.count("da-row-approve") == 2 and 'name="csrfmiddlewaretoken"' in page

    response = client.post(html.unescape(found.group(1)), {"decision": "approve"})
    assert response.status_code == 302 and response["Location"] == reverse(QUEUE)
    assert any("is approved" in m for m in messages_of(response))
    assert Run.objects.get(run_id="bq5-gated").status == "finished"
    deny = reverse("admin:durable_agents_approvalrequest_decide", args=[pair.pk])
    response = client.post(deny + "?back=queue", {"decision": "deny", "shown": shown(pair)})
    # alice's denial leaves bob alone of two eligible: the quorum cannot pass any more.
    assert Run.objects.get(run_id="bq5-quorum").status == "finished"
    assert sorted(ActionLog.objects.values_list("action", "run_id")) == [
        ("approve", "bq5-gated"),
        ("deny", "bq5-quorum"),
    ]


def test_calls_no_longer_pending_are_left_alone():
    single, _ = pending_calls("bq6")
    root = client_for(make_user("root", superuser=True))
    confirm(root, "approve_selected", [single])
    assert ActionLog.objects.count() == 1
    url = reverse(QUEUE) + "?status=all"
    page = text_of(
        root.post(url, {"action": "deny_selected", "_selected_action": [single.pk], "index": 0})
    )
    assert "None of the selected calls is pending" in page
    assert "call_1_1 of bq6-gated (approved)" in page
    assert ActionLog.objects.count() == 1


# -- pending counts -------------------------------------------------------------------------


def test_pending_counts_on_the_index_and_the_app_list_show_only_what_the_user_may_see():
    pending_calls("pc")
    halting.start("charge card 4242", run_id="pc-halt")
    Run.objects.create(run_id="pc-input", agent="echo", status="awaiting_input", input="x")
    Run.objects.create(run_id="pc-done", agent="echo", status="finished", input="x")

    root = client_for(make_user("root", superuser=True))
    index = text_of(root.get(reverse("admin:index")))
    assert "waiting on a person" in index
    assert "tool calls awaiting approval (2)" in index
    assert "open halts (1)" in index and "runs awaiting input (1)" in index
    app = text_of(root.get(reverse("admin:app_list", args=["durable_agents"])))
    assert "Tool calls awaiting approval (2)" in app and "Halts (1)" in app
    assert "Runs (1 awaiting input)" in app
    assert "Inbox (4)" in app  # everything waiting on a person, in one place
    assert "/admin/durable_agents/inbox/" in index
    # The site's index lists the same counts in its app list (docs/admin.md).
    assert "Inbox (4)" in index and "Tool calls awaiting approval (2)" in index

    # An approver sees the approvals only.
    approver = client_for(make_user("alice", APPROVE))
    index = text_of(approver.get(reverse("admin:index")))
    assert "tool calls awaiting approval (2)" in index
    assert "open halts" not in index and "runs awaiting input" not in index
    app = text_of(approver.get(reverse("admin:app_list", args=["durable_agents"])))
    assert "Tool calls awaiting approval (2)" in app and "Halts" not in app

    # Nothing waiting: no note on the index, "(0)" in the app list.
    for req in ApprovalRequest.objects.all():
        da.cancel(req.run_id, by="root", reason="done")
    index = text_of(approver.get(reverse("admin:index")))
    assert "waiting on a person" not in index
    app = text_of(approver.get(reverse("admin:app_list", args=["durable_agents"])))
    assert "Tool calls awaiting approval (0)" in app


def test_pending_counts_cost_the_same_whatever_the_number_of_rows():
    root = client_for(make_user("root", superuser=True))
    url = reverse("admin:index")
    root.get(url)  # warm caches (content types, permissions)
    with CaptureQueriesContext(connection) as empty:
        assert "waiting on a person" not in text_of(root.get(url))
    pending_calls("pq")
    Halt.objects.bulk_create(
        [Halt(run_id="pq-gated", op_id=f"c{i}", tool_name="act", arguments={}) for i in range(50)]
    )
    with CaptureQueriesContext(connection) as full:
        assert "open halts (50)" in text_of(root.get(url))
    assert len(empty) == len(full), [q["sql"] for q in full]


# -- the conversation on the approval page --------------------------------------------------

# Looks the order up (a text turn with a call), then asks to refund it: the approver reads
# what the model saw first. Its texts carry markup, which the page must escape.
looked_up = da.Agent(
    "looked_up",
    ScriptedModel(
        [
            scripted.calls(
                scripted.call("lookup", {"order_id": "7"}), text="Checking <b>order 7</b> first."
            ),
            scripted.calls(scripted.call("refund", {"order_id": "7", "cents": 4200})),
            scripted.text("refunded"),
        ]
    ),
    "Refund when asked.",
    [lookup, refund],
)


def test_the_approval_page_shows_the_conversation_so_far_escaped_and_collapsed():
    looked_up.start("refund order 7 <script>alert(1)</script>", run_id="talk-1")
    req = ApprovalRequest.objects.get(run_id="talk-1")
    root = client_for(make_user("root", superuser=True))
    url = reverse("admin:durable_agents_approvalrequest_change", args=[req.pk])
    body = root.get(url).content.decode()
    start = body.index('<details id="da-conversation">')
    talk = body[start : body.index("</details>", start)]
    assert "4 messages" in talk  # input, the lookup turn, its result, the refund turn
    assert "refund order 7 &lt;script&gt;alert(1)&lt;/script&gt;" in talk
    assert "<script>" not in talk and "<b>order 7</b>" not in talk
    assert "Checking &lt;b&gt;order 7&lt;/b&gt; first." in talk
    assert "calls <strong>lookup</strong> <code>call_1_1</code>" in talk
    assert "tool result: lookup <code>call_1_1</code>" in talk
    assert "&quot;status&quot;: &quot;shipped&quot;" in talk  # the lookup's result
    assert "calls <strong>refund</strong> <code>call_2_1</code> (the call you are deciding)" in talk
    assert '"order_id": "7"' not in talk and "&quot;cents&quot;: 4200" in talk
