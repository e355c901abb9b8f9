"""The approval queue decided from its list in a real browser (headless Chromium through
Playwright) against the live server, with a real Celery worker driving the runs: a bulk
denial whose message the model's next request carries, and a bulk approval that runs a
single-approval call and leaves a quorum call pending, decided later with an inline button.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import Page, expect

from durable_agents.models import ActionLog, ApprovalRequest, Run
from tests.support.agents import count_effects, gated, gated_recorded, quorum, requests_containing
from tests.support.browser import Browser, Celery, login, screenshot, staff_user, wait_status
from tests.support.journals import journal

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(90),
]

PERMS = ("durable_agents.view_run", "durable_agents.approve_toolcall")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_action(page: Page, run_ids: list[str], action: str) -> None:
    """On the queue, tick the rows of ``run_ids`` and run the admin action ``action``."""
    page.goto("/admin/durable_agents/approvalrequest/")
    for run_id in run_ids:
        row = page.locator("#result_list tbody tr", has_text=run_id)
        row.locator("input.action-select").check()
    page.select_option("select[name=action]", label=action)
    page.locator("button[name=index]").click()


def test_bulk_deny_with_a_message_the_model_reads_next(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    run_id = new_id("br-deny")
    message = f"refunds need a receipt ({uuid.uuid4().hex[:8]})"
    worker.wait_ready()
    gated_recorded.start("refund order 7", run_id=run_id)
    wait_status(run_id, "awaiting_approval", worker)
    assert requests_containing(message) == 0

    page = browser.page()
    login(page, user.username)
    run_action(page, [run_id], "Deny selected calls")
    rows = page.locator("#da-bulk-rows tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Refund 5.00 to order 7")
    expect(rows.first).to_contain_text(run_id)
    assert not ActionLog.objects.exists()  # nothing decided before the confirmation
    page.fill("#da-bulk-note", message)
    screenshot(page, tmp_path / "deny-confirm.png")
    page.locator("#da-bulk-go").click()
    expect(page.locator("#da-bulk-rows")).to_contain_text(
        f"Call call_1_1 of run {run_id} is denied"
    )

    run = wait_status(run_id, "finished", worker)
    assert run.answer == "refunded"  # the script's next turn, after reading the denial
    assert count_effects(run_id) == {}  # the refund never ran
    assert journal(run_id)["tool:call_1_1"]["result"]["note"] == message
    assert requests_containing(message) == 1  # the model's next request carried it
    assert list(ActionLog.objects.values_list("actor", "action", "run_id")) == [
        ("approver", "deny", run_id)
    ]


def test_bulk_approve_runs_one_call_and_leaves_a_quorum_pending(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    alice = staff_user("alice", *PERMS)
    bob = staff_user("bob", *PERMS)
    Group.objects.create(name="finance").user_set.add(alice, bob)
    single, pair = new_id("br-one"), new_id("br-two")
    worker.wait_ready()
    gated.start("refund order 7", run_id=single)
    quorum.start("pay inv-1", run_id=pair)
    wait_status(single, "awaiting_approval", worker)
    wait_status(pair, "awaiting_approval", worker)

    page = browser.page()
    login(page, alice.username)
    page.goto("/admin/")
    expect(page.locator(".messagelist")).to_contain_text(
        "waiting on a person: tool calls awaiting approval (2)"
    )
    run_action(page, [single, pair], "Approve selected calls")
    expect(page.locator("#da-bulk-rows tbody tr")).to_have_count(2)
    expect(page.locator("#da-bulk-rows")).to_contain_text("0 of 2 approved (group finance)")
    page.locator("#da-bulk-go").click()
    results = page.locator("#da-bulk-rows")
    expect(results.locator("tr", has_text=single)).to_contain_text("is approved")
    expect(results.locator("tr", has_text=pair)).to_contain_text("1 of 2 approved so far")
    screenshot(page, tmp_path / "approve-result.png")

    run = wait_status(single, "finished", worker)
    assert run.answer == "refunded" and count_effects(single) == {"call_1_1": 1}
    assert Run.objects.get(run_id=pair).status == "awaiting_approval"
    assert ApprovalRequest.objects.get(run_id=pair).status == "pending"
    assert count_effects(pair) == {}

    # bob approves the quorum call inline, from the queue's row.
    page.context.clear_cookies()
    login(page, bob.username)
    page.goto("/admin/durable_agents/approvalrequest/")
    row = page.locator("#result_list tbody tr", has_text=pair)
    expect(row).to_contain_text("1 of 2 approved (group finance)")
    expect(page.locator("#result_list tbody tr", has_text=single)).to_have_count(0)
    row.locator(".da-row-approve").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Call call_1_1 of run {pair} is approved")
    run = wait_status(pair, "finished", worker)
    assert run.answer == "paid" and count_effects(pair) == {"call_1_1": 1}
    assert journal(pair)["approval:call_1_1"]["tally"]["approved_by"] == ["alice", "bob"]
    assert sorted(ActionLog.objects.values_list("actor", "run_id")) == sorted(
        [("alice", single), ("alice", pair), ("bob", pair)]
    )
