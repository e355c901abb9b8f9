"""The staff admin in a real browser (headless Chromium through Playwright) against the live
server, with a real Celery worker driving the runs: staff approve a tool call and resolve a
halt by clicking, and the worker finishes the run.

Nothing is mocked: the live server dispatches through Celery (``DISPATCH="celery"``) to a
queue of the test's own on Redis, where a ``celery -A tests.celery_app worker`` subprocess
picks the run up; halts come from driver processes killed inside a side effect.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from durable_agents.models import ActionLog, ApprovalRequest, Halt, Run
from tests.support.agents import count_effects, gated, packing
from tests.support.browser import Browser, Celery, login, screenshot, staff_user, wait_status
from tests.support.journals import journal
from tests.support.procs import drive_in_child

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(90),
]

PERMS = (
    "durable_agents.view_run",
    "durable_agents.approve_toolcall",
    "durable_agents.resolve_halt",
)
FINISHED = re.compile(r"drive_run\[[^\]]+\] succeeded in [\d.]+s: 'finished'")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def open_queue(page: Page, title: str) -> None:
    """From the admin index, follow the model's link, as staff would (its name followed by
    how much waits there, when something does: "Halts (1)", "Runs (1 awaiting input)")."""
    page.goto("/admin/")
    name = re.compile(rf"^{re.escape(title)}( \(\d+( awaiting input)?\))?$")
    page.locator("#content-main").get_by_role("link", name=name).click()
    expect(page.locator("#result_list")).to_be_visible()


def history_rows(page: Page) -> list[list[str]]:
    """The run page's "Staff and API actions" table: (when, who, action, target, details)."""
    rows = page.locator("#da-history tbody tr")
    return [
        [cell.strip() for cell in rows.nth(i).locator("td").all_inner_texts()]
        for i in range(rows.count())
    ]


def test_approve_in_the_browser_and_a_worker_finishes_the_run(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    run_id = new_id("br-approve")
    worker.wait_ready()
    gated.start("refund order 7", run_id=run_id)
    wait_status(run_id, "awaiting_approval", worker)
    assert count_effects(run_id) == {}

    page = browser.page()
    login(page, user.username)
    open_queue(page, "Tool calls awaiting approval")
    row = page.locator("#result_list tbody tr", has_text=run_id)
    expect(row).to_have_count(1)
    for text in ('"order_id": "7"', '"cents": 500', "Refund 5.00 to order 7", "0 of 1 approved"):
        expect(row).to_contain_text(text)
    expect(row.locator(".da-pill-pending")).to_have_text("pending")
    row.locator("a.da-call-link").click()  # the call's page

    expect(page.locator(".da-summary")).to_have_text("Refund 5.00 to order 7")
    fields = page.locator("dl.da-shown")
    expect(fields).to_contain_text("Order Id")
    expect(fields).to_contain_text("500")
    page.fill("#id_note", "order 7 arrived broken; refund approved")
    screenshot(page, tmp_path / "approval.png")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text(
        f"Call call_1_1 of run {run_id} is approved; the run was handed to a driver."
    )
    expect(page.locator("#da-decide")).to_have_count(0)  # decided: no form any more

    run = wait_status(run_id, "finished", worker)
    assert run.answer == "refunded"
    assert FINISHED.search(worker.log()), worker.log()  # the worker drove it, not the server
    assert count_effects(run_id) == {"call_1_1": 1}
    record = journal(run_id)["approval:call_1_1"]
    assert (record["approved"], record["by"], record["note"]) == (
        True,
        "approver",
        "order 7 arrived broken; refund approved",
    )
    assert ApprovalRequest.objects.get(run_id=run_id).status == "approved"
    assert list(ActionLog.objects.values_list("actor", "action", "run_id", "target")) == [
        ("approver", "approve", run_id, "call_1_1")
    ]

    page.get_by_role("link", name="Run and journal").click()
    expect(page.locator(".field-run_status .readonly")).to_have_text("finished")
    expect(page.locator(".field-answer .readonly")).to_have_text("refunded")
    timeline = page.locator("#da-journal")
    expect(timeline).to_contain_text("Call call_1_1 approved by approver")
    expect(timeline).to_contain_text("order 7 arrived broken; refund approved")
    expect(timeline).to_contain_text('"refunded": 500')
    expect(timeline.locator(".da-complete")).to_contain_text("refunded")
    expect(page.locator("#da-approvals")).to_contain_text("call_1_1 (refund): approved")
    assert [r[1:4] for r in history_rows(page)] == [["approver", "approve", "call_1_1"]]
    screenshot(page, tmp_path / "run.png")


def test_edit_and_approve_from_the_run_banner_with_a_schema_error_first(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    run_id = new_id("br-banner")
    worker.wait_ready()
    gated.start("refund order 7", run_id=run_id)
    wait_status(run_id, "awaiting_approval", worker)

    page = browser.page()
    login(page, user.username)
    page.goto(f"/admin/durable_agents/run/{run_id}/change/")
    banner = page.locator("#da-needed")
    expect(banner).to_contain_text("A person is needed")
    expect(banner).to_contain_text("0 of 1 approved")
    expect(page.locator("#da-operate input[value='Resume']")).to_have_count(0)
    screenshot(page, tmp_path / "banner.png")
    # Edit… opens the call's page, whose edit box holds the whole arguments.
    banner.locator("a.da-edit").click()
    page.locator("#da-edit-arguments summary").click()
    page.fill("#id_edit", '{"order_id": "7", "cents": "lots"}')
    page.get_by_role("button", name="Approve with edits").click()
    # The schema's refusal: a form error on the call's page, nothing recorded.
    expect(page.locator(".errorlist")).to_contain_text("cents")
    assert ApprovalRequest.objects.get(run_id=run_id).status == "pending"
    page.fill("#id_edit", '{"order_id": "7", "cents": 250}')
    page.get_by_role("button", name="Approve with edits").click()
    expect(page.locator(".messagelist")).to_contain_text("is approved")

    run = wait_status(run_id, "finished", worker)
    assert run.answer == "refunded" and count_effects(run_id) == {"call_1_1": 1}
    assert journal(run_id)["tool:call_1_1"]["result"] == {"refunded": 250}
    page.goto(f"/admin/durable_agents/run/{run_id}/change/")
    expect(page.locator("#da-needed")).to_have_count(0)


def test_approve_from_the_run_banner(live_server, celery: Celery, browser: Browser):
    worker = celery.worker()
    user = staff_user("approver", *PERMS)
    run_id = new_id("br-here")
    worker.wait_ready()
    gated.start("refund order 7", run_id=run_id)
    wait_status(run_id, "awaiting_approval", worker)

    page = browser.page()
    login(page, user.username)
    page.goto(f"/admin/durable_agents/run/{run_id}/change/")
    banner = page.locator("#da-needed")
    banner.locator("textarea[name='note']").fill("fine")
    banner.get_by_role("button", name="Approve", exact=True).click()
    # Back on the run page, which says what happened.
    expect(page.locator(".messagelist")).to_contain_text(
        f"Call call_1_1 of run {run_id} is approved"
    )
    expect(page).to_have_url(re.compile(r"/run/.+/change/$"))
    run = wait_status(run_id, "finished", worker)
    assert run.answer == "refunded" and count_effects(run_id) == {"call_1_1": 1}
    assert journal(run_id)["approval:call_1_1"]["note"] == "fine"


def test_resolve_a_halt_in_the_browser_and_a_worker_finishes_the_run(
    live_server, celery: Celery, browser: Browser
):
    worker = celery.worker()  # starts while the drivers below crash and halt
    user = staff_user("operator", *PERMS)
    run_id = new_id("br-halt")
    code, _ = drive_in_child(run_id, crash_inside="call_1_1")
    assert code == -9
    code, out = drive_in_child(run_id)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "halted", out
    halt = Halt.objects.get(run_id=run_id, op_id="call_1_1")
    assert count_effects(run_id) == {"call_1_1": 1}  # nothing else ran once it was unknown
    worker.wait_ready()

    page = browser.page()
    login(page, user.username)
    open_queue(page, "Halts")
    row = page.locator("#result_list tbody tr", has_text=run_id)
    expect(row).to_have_count(1)
    expect(row).to_contain_text('"item": "x"')
    expect(row).to_contain_text("crashed")
    expect(row.locator("td.field-lease_live img")).to_have_attribute("alt", "False")
    row.locator("a.da-call-link").click()  # the call cell: its tool, then call_1_1
    expect(page.locator("#da-resolve")).to_be_visible()
    submit = page.get_by_role("button", name="Record outcome and continue the run")

    # Invalid JSON: the form says so, and nothing is recorded.
    page.fill("#id_result", "{done: yes")
    submit.click()
    expect(page.locator("#da-resolve .errorlist")).to_contain_text("The result is not valid JSON")
    expect(page.locator("#id_result")).to_have_value("{done: yes")
    assert Halt.objects.get(pk=halt.pk).status == "open"
    assert Run.objects.get(run_id=run_id).status == "halted"
    assert "tool:call_1_1" not in journal(run_id)
    assert not ActionLog.objects.exists()

    page.fill("#id_result", '{"done": "x"}')
    page.fill("#id_evidence", '{"provider_ref": "op-19"}')
    submit.click()
    expect(page.locator(".messagelist")).to_contain_text(
        f"Recorded the outcome of call call_1_1; run {run_id} was handed to a driver."
    )
    expect(page.locator("#da-resolve")).to_have_count(0)

    run = wait_status(run_id, "finished", worker)
    assert run.answer == "all done"
    assert FINISHED.search(worker.log()), worker.log()
    # The resolved call never ran again; the worker ran the rest of its turn and the next.
    assert count_effects(run_id) == {"call_1_1": 1, "call_1_2": 1, "call_2_1": 1}
    record = journal(run_id)["tool:call_1_1"]
    assert (record["reconciled"], record["by"], record["result"], record["evidence"]) == (
        True,
        "operator",
        {"done": "x"},
        {"provider_ref": "op-19"},
    )
    halt.refresh_from_db()
    assert (halt.status, halt.resolved_by) == ("resolved", "operator")
    assert list(ActionLog.objects.values_list("actor", "action", "run_id", "target")) == [
        ("operator", "resolve", run_id, "call_1_1")
    ]

    page.get_by_role("link", name="Run and journal").click()
    expect(page.locator(".field-run_status .readonly")).to_have_text("finished")
    expect(page.locator(".field-answer .readonly")).to_have_text("all done")
    result = page.locator("#da-journal .da-entry", has_text="Result of call call_1_1 (act)")
    expect(result).to_contain_text("outcome recorded by operator")
    expect(result).to_contain_text('"done": "x"')
    expect(result).to_contain_text('"provider_ref": "op-19"')
    expect(page.locator("#da-halts")).to_contain_text("call_1_1 (act, crashed): resolved")
    assert [r[1:4] for r in history_rows(page)] == [["operator", "resolve", "call_1_1"]]


def test_answer_a_question_through_its_schema_form_invalid_first(
    live_server, celery: Celery, browser: Browser, tmp_path: Path
):
    worker = celery.worker()
    user = staff_user("answerer", "durable_agents.view_run", "durable_agents.approve_toolcall")
    run_id = new_id("br-ask")
    worker.wait_ready()
    packing.start("pack order 8", run_id=run_id)
    wait_status(run_id, "awaiting_input", worker)

    page = browser.page()
    login(page, user.username)
    open_queue(page, "Runs")
    page.locator("#da-waiting-link").click()
    expect(page.locator("#da-awaiting-input")).to_contain_text("How should o-8 be packed?")
    run_block = page.locator(".da-waiting-run", has_text=run_id)
    run_block.get_by_label("Warehouse").select_option(label="HAM")
    run_block.get_by_label("Boxes").fill("11")
    screenshot(page, tmp_path / "question.png")
    run_block.get_by_role("button", name="Answer").click()
    # The schema's refusal, on the form (the question's own page); nothing recorded.
    expect(page.locator(".da-answer-errors")).to_contain_text("boxes")
    expect(page.locator(".da-answer-errors")).to_contain_text("at most 10")
    assert "input:packing" not in journal(run_id)
    assert Run.objects.get(run_id=run_id).status == "awaiting_input"
    assert not ActionLog.objects.filter(run_id=run_id).exists()
    page.get_by_label("Boxes").fill("2")
    page.get_by_role("button", name="Answer").click()
    expect(page.locator(".messagelist")).to_contain_text("Answered 'packing'")
    expect(page).to_have_url(re.compile(r"/run/.+/change/$"))  # back to the run

    run = wait_status(run_id, "finished", worker)
    assert run.answer == "packed"
    recorded = journal(run_id)
    assert recorded["input:packing"]["value"] == {"boxes": 2, "warehouse": "HAM"}
    assert recorded["input:packing"]["by"] == "answerer"
    assert recorded["tool:call_1_1"]["result"] == {"warehouse": "HAM", "boxes": 2}
    assert count_effects(run_id)["call_2_1"] == 1  # shipped once
    assert list(ActionLog.objects.filter(run_id=run_id).values_list("actor", "action")) == [
        ("answerer", "answer")
    ]
    page.goto(f"/admin/durable_agents/run/{run_id}/change/")
    expect(page.locator("#da-needed")).to_have_count(0)
