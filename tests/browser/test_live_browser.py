"""The admin updating while you look, in a real browser (headless Chromium through
Playwright) against the live server with a real Celery worker: the run page of a waiting
run shows the approval given elsewhere, the new records and the final status without a
reload; the approval queue drops a row decided elsewhere."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

import durable_agents as da
from durable_agents.models import JournalEntry
from tests.support.agents import gated
from tests.support.browser import Browser, Celery, login, screenshot, staff_user, wait_status

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(90),
]

PERMS = ("durable_agents.view_run", "durable_agents.approve_toolcall")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_the_run_page_updates_live_when_a_worker_finishes_the_run(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    run_id = new_id("br-live")
    worker.wait_ready()
    gated.start("refund order 7", run_id=run_id)
    wait_status(run_id, "awaiting_approval", worker)

    page = browser.page()
    login(page, user.username)
    page.goto(f"/admin/durable_agents/run/{run_id}/change/")
    live = page.locator("#da-live")
    expect(live).to_have_attribute("data-state", "live")
    expect(page.locator(".field-run_status .readonly")).to_have_text("awaiting approval")
    expect(page.locator("#da-needed")).to_contain_text("A person is needed")
    timeline = page.locator("#da-journal .da-timeline > li")
    before = timeline.count()
    assert before == JournalEntry.objects.filter(run_id=run_id).count()
    page.evaluate("window.daNotReloaded = true")

    # Decided elsewhere (here: the command); the worker finishes the run.
    da.approve(run_id, "call_1_1", True, by=user, note="from elsewhere")
    wait_status(run_id, "finished", worker)

    expect(page.locator(".field-run_status .readonly")).to_have_text("finished")
    expect(page.locator(".field-answer .readonly")).to_have_text("refunded")
    expect(page.locator("#da-journal .da-complete")).to_contain_text("refunded")
    expect(page.locator("#da-journal")).to_contain_text("from elsewhere")
    expect(timeline).to_have_count(JournalEntry.objects.filter(run_id=run_id).count())
    assert timeline.count() > before
    expect(page.locator("#da-needed")).to_have_count(0)
    expect(live).to_have_attribute("data-state", "ended")
    assert page.evaluate("window.daNotReloaded") is True  # the same page, never reloaded
    screenshot(page, tmp_path / "live-run.png")


def test_the_queue_drops_a_row_decided_elsewhere(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    first, second = new_id("br-q1"), new_id("br-q2")
    worker.wait_ready()
    for run_id in (first, second):
        gated.start("refund order 7", run_id=run_id)
    for run_id in (first, second):
        wait_status(run_id, "awaiting_approval", worker)

    page = browser.page()
    login(page, user.username)
    page.goto("/admin/durable_agents/approvalrequest/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    rows.filter(has_text=second).locator("input.action-select").check()
    page.evaluate("window.daNotReloaded = true")

    da.approve(first, "call_1_1", True, by=user)

    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(second)
    expect(rows.first.locator("input.action-select")).to_be_checked()  # selection kept
    assert page.evaluate("window.daNotReloaded") is True
    screenshot(page, tmp_path / "live-queue.png")
