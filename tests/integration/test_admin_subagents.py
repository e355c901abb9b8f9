"""Trees of sub-runs in the admin (PostgreSQL, test client): the run page shows a run's
parent, root and sub-runs with the status of each; the approval queue names the root run of
a call that waits deep in a tree; the runs list can hide sub-runs. Deciding the bottom call
in the admin resumes the whole tree."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from durable_agents.models import ActionLog, ApprovalRequest, Run
from tests.support.admin_pages import shown
from tests.support.agents import count_effects, gated_tree
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

ROOT, MIDDLE, LEAF = "adm-tree", "adm-tree/call_1_1", "adm-tree/call_1_1/call_1_1"


def staff() -> Client:
    client = Client()
    client.force_login(make_user("boss", superuser=True))
    return client


def text(response) -> str:
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def run_url(run_id: str) -> str:
    return reverse("admin:durable_agents_run_change", args=[quote(run_id)])


def run_page(client: Client, run_id: str) -> str:
    return text(client.get(run_url(run_id)))


def test_a_tree_in_the_admin_and_its_bottom_call_decided_there():
    gated_tree[0].start("go", run_id=ROOT)  # inline dispatch: the tree pauses at the bottom
    client = staff()
    page = run_page(client, MIDDLE)
    assert 'id="da-tree"' in page and f'Sub-run of <a href="{run_url(ROOT)}">{ROOT}</a>' in page
    assert LEAF in page and "awaiting_approval" in page
    root_page = run_page(client, ROOT)
    assert MIDDLE in root_page and 'id="da-tree-children"' in root_page

    runs = reverse("admin:durable_agents_run_changelist")
    assert {r.run_id for r in client.get(runs + "?tree=roots").context["cl"].result_list} == {ROOT}
    children = client.get(runs + "?tree=children").context["cl"].result_list
    assert {r.run_id for r in children} == {MIDDLE, LEAF}

    queue = text(client.get(reverse("admin:durable_agents_approvalrequest_changelist")))
    assert f"· root {ROOT}" in re.sub(r"<[^>]+>", "", queue) and LEAF in queue

    request = ApprovalRequest.objects.get()
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
    response = client.post(decide, {"decision": "approve", "note": "", "shown": shown(request)})
    assert response.status_code == 302
    statuses = dict(Run.objects.values_list("run_id", "status"))
    assert statuses == dict.fromkeys((ROOT, MIDDLE, LEAF), "finished")
    assert count_effects(LEAF) == {"call_1_1": 1}


def fork_url(run_id: str, step: int) -> str:
    return reverse("admin:durable_agents_run_fork", args=[quote(run_id)]) + f"?step={step}"


def test_forks_of_a_tree_in_the_admin_show_their_own_and_their_referenced_sub_runs():
    """A fork (made in the admin) of a root waiting on its unfinished child gets a child of
    its own, shown with its status and decided there; a fork of that fork, after it
    finished, references the finished child, shown finished (not "not started")."""
    source, fork, again = "adm-ftree", "adm-ftree-f", "adm-ftree-ff"
    gated_tree[0].start("go", run_id=source)
    client = staff()
    response = client.post(fork_url(source, 1), {"new_run_id": fork})
    assert response.status_code == 302, text(response)
    child, leaf = f"{fork}/call_1_1", f"{fork}/call_1_1/call_1_1"
    page = run_page(client, fork)
    assert child in page and "awaiting_approval" in page and "not started" not in page
    assert Run.objects.get(run_id=child).forked_from == f"{source}/call_1_1"

    request = ApprovalRequest.objects.get(run_id=leaf)
    decide = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
    data = {"decision": "approve", "note": "", "shown": shown(request)}
    assert client.post(decide, data).status_code == 302
    assert Run.objects.get(run_id=fork).status == "finished"
    assert count_effects(leaf) == {"call_1_1": 1}
    # The source's tree was not driven by its fork's: it waits as it did, nothing fired.
    source_leaf = f"{source}/call_1_1/call_1_1"
    assert Run.objects.get(run_id=source_leaf).status == "awaiting_approval"
    assert count_effects(source_leaf) == {}

    response = client.post(fork_url(fork, 1), {"new_run_id": again})
    assert response.status_code == 302, text(response)
    assert Run.objects.get(run_id=again).status == "finished"
    page = run_page(client, again)
    assert f'<a href="{run_url(child)}">{child}</a>' in page
    assert (
        'finished <span class="help da-referenced">(its source\'s, referenced by this fork)' in page
    )
    assert "not started" not in page
    assert not Run.objects.filter(run_id__startswith=f"{again}/").exists()
    assert count_effects(leaf) == {"call_1_1": 1}


def test_deleting_a_root_in_the_admin_deletes_its_tree_and_says_so_first():
    """The delete page names the sub-runs that go with the root; deleting it leaves no sub-run
    waiting on a person for a parent that is gone (its request went with it); selecting the
    root and a sub-run of it together deletes each once."""
    # Ids of its own: the effects ledger outlives each test, and the first test here fires at LEAF.
    root, middle, leaf = "adm-del", "adm-del/call_1_1", "adm-del/call_1_1/call_1_1"
    gated_tree[0].start("go", run_id=root)  # paused at the bottom, the leaf's call pending
    client = staff()
    delete_url = reverse("admin:durable_agents_run_delete", args=[quote(root)])
    confirm = text(client.get(delete_url))
    assert f"Sub-runs below them, which go with them: {middle}, {leaf}" in confirm
    response = client.post(
        reverse("admin:durable_agents_run_changelist"),
        {"action": "delete_selected", "_selected_action": [root, leaf], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Run.objects.exists() and not ApprovalRequest.objects.exists()
    logged = ActionLog.objects.get(action="delete", run_id=root)
    assert logged.payload["sub_runs"] == [middle, leaf]
    assert count_effects(leaf) == {}
