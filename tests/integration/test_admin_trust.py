"""Who is offered a decision in the admin, and what a decision must carry (issue 41): every
decision posted says which arguments it was shown, whichever page it says it came from, and
every page that draws Approve / Deny asks the inbox's one eligibility check."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

import durable_agents as da
from durable_agents.models import ActionLog, ApprovalRequest, Decision
from tests.support.admin_pages import client_for, messages_of, text_of
from tests.support.agents import count_effects, gated, quorum
from tests.support.inbox_agents import padded_payment
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

APPROVER = ("durable_agents.view_run", "durable_agents.approve_toolcall")
QUEUE = "admin:durable_agents_approvalrequest_changelist"


def _decide_url(req: ApprovalRequest) -> str:
    return reverse("admin:durable_agents_approvalrequest_decide", args=[req.pk])


def test_a_decision_that_does_not_say_what_it_was_shown_is_refused_whatever_it_came_from():
    with pytest.raises(da.ApprovalPending):
        padded_payment.run("tr-pay", "pay the supplier")  # its card is folded in the inbox
    pay = ApprovalRequest.objects.get(run_id="tr-pay")
    client = client_for(make_user("ann", *APPROVER))
    decide = _decide_url(pay)
    run_page = reverse("admin:durable_agents_run_change", args=[quote("tr-pay")])
    for data, back in (
        ({"decision": "approve", "back": "run"}, run_page),
        ({"decision": "approve"}, None),
        ({"decision": "approve", "back": "queue"}, reverse(QUEUE)),
        ({"decision": "approve", "back": "elsewhere"}, None),
        ({"decision": "edit", "edit": json.dumps(pay.arguments)}, None),
        ({"decision": "deny", "note": "no", "back": "run"}, run_page),
        ({"decision": "approve", "shown": ""}, None),
    ):
        response = client.post(decide, data)
        assert response.status_code == 302, data
        assert response["Location"] == (
            back or reverse("admin:durable_agents_approvalrequest_change", args=[pay.pk])
        )
        said = messages_of(response)[-1]  # unread ones stay in the cookie: the last is ours
        assert "Nothing was decided" in said and "approval.not_shown_whole" in said, data
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "pending"
    assert not Decision.objects.exists() and not ActionLog.objects.exists()
    assert count_effects("tr-pay") == {}

    # Saying what it was shown, from the run page's banner: decided, once.
    shown = json.dumps(pay.arguments)
    response = client.post(decide, {"decision": "approve", "back": "run", "shown": shown})
    assert response["Location"] == run_page
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "approved"
    assert count_effects("tr-pay") == {"call_1_1": 1}


def test_only_an_eligible_person_is_offered_approve_and_deny_on_any_page():
    gated.start("refund order 7", run_id="tr-gated")
    quorum.start("pay inv-1", run_id="tr-quorum")
    single = ApprovalRequest.objects.get(run_id="tr-gated")
    pair = ApprovalRequest.objects.get(run_id="tr-quorum")
    outsider = client_for(make_user("out", *APPROVER))  # may approve, not in "finance"
    fin = client_for(make_user("fin", *APPROVER, groups=("finance",)))
    make_user("fay", *APPROVER, groups=("finance",))

    def call_page(client, req: ApprovalRequest) -> str:
        url = reverse("admin:durable_agents_approvalrequest_change", args=[req.pk])
        return text_of(client.get(url))

    def run_page(client, run_id: str) -> str:
        return text_of(client.get(reverse("admin:durable_agents_run_change", args=[run_id])))

    # The queue: buttons on the call anyone holding the permission decides, none on the
    # quorum call, whose row says why.
    queue = text_of(outsider.get(reverse(QUEUE)))
    assert queue.count("da-row-approve") == 1 and queue.count("da-row-deny") == 1
    assert "You may not decide this call" in queue and "group 'finance'" in queue
    assert text_of(fin.get(reverse(QUEUE))).count("da-row-approve") == 2

    # The call's page: no form for the outsider, and the reason instead.
    page = call_page(outsider, pair)
    assert 'id="da-decide"' not in page and "approvers are members of group 'finance'" in page
    assert 'id="da-decide"' in call_page(outsider, single)
    assert 'id="da-decide"' in call_page(fin, pair)

    # The run page's banner and the inbox already asked the same check.
    assert "da-card-decide" not in run_page(outsider, "tr-quorum")
    assert "da-card-decide" in run_page(fin, "tr-quorum")

    # Drawn or not, the decide view is the engine's to refuse: nothing recorded.
    response = outsider.post(
        _decide_url(pair), {"decision": "approve", "shown": json.dumps(pair.arguments)}
    )
    assert any("approval.not_eligible" in m for m in messages_of(response))
    assert not Decision.objects.filter(request=pair).exists()
