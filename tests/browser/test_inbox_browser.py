"""The approver's inbox in a real browser (headless Chromium) at 1400 px and on a 390 px
phone, with real waiting state on PostgreSQL: no horizontal scrolling, the payee of a
padded payment on its card, no decision from a folded card (a forged one is refused), a
halt in its tool's own words, and a decision made once the card is opened whole, which a
real Celery worker then carries out.

Screenshots of the inbox, a run page and a halt page at both widths are written to
docs/screenshots/ (ignored by git) for a person to look at; docs/admin.md points there.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.test.utils import override_settings
from playwright.sync_api import Page, expect

import durable_agents as da
from durable_agents.models import ApprovalRequest, Decision, Halt
from tests.support.agents import count_effects, gated_tree, quorum
from tests.support.browser import (
    Browser,
    Celery,
    login,
    screenshot,
    staff_user,
    wait_status,
    wait_streams_closed,
)
from tests.support.inbox_agents import (
    GATEWAY_MESSAGE,
    PAYEE,
    asks_staff,
    padded_payment,
    unsure_transfer,
)
from tests.support.workers import CeleryProcess

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}
PERMS = (
    "durable_agents.view_run",
    "durable_agents.approve_toolcall",
    "durable_agents.view_halt",
    "durable_agents.resolve_halt",
)


def no_horizontal_scroll(page: Page) -> None:
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at {page.viewport_size}"


def list_fits(page: Page) -> None:
    """A change list's table is not cut at its right edge (its box does not scroll)."""
    overflow = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth - r.clientWidth; }"
    )
    info = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " const t = r.querySelector('table');"
        " return [r.clientWidth, r.scrollWidth, t.offsetWidth,"
        " [...t.querySelectorAll('thead th')].map(h => h.className + ':' + h.offsetWidth)]; }"
    )
    assert overflow <= 0, f"the list is cut by {overflow} px at {page.viewport_size} {info}"


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(page, SHOTS / f"{name}.png")


def forged_decision(page: Page, url: str) -> str:
    """POST what a folded card would, had it a button (no arguments shown): the page the
    response redirects to."""
    return str(
        page.evaluate(
            """async (url) => {
                const token = document.querySelector('[name=csrfmiddlewaretoken]').value;
                const body = new URLSearchParams({csrfmiddlewaretoken: token,
                                                  decision: 'approve', back: 'inbox'});
                const r = await fetch(url, {method: 'POST', body, credentials: 'same-origin'});
                return r.text();
            }""",
            url,
        )
    )


def test_the_inbox_at_desktop_and_phone_widths(live_server, celery: Celery, browser: Browser):
    worker = celery.worker()  # drives the run once it is approved
    # The run pages follow their waiting runs live; a stream notices its page is gone on
    # its next keep-alive, and gives its connection back.
    quick = override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "EVENTS_KEEPALIVE": 0.3})
    quick.enable()
    try:
        look_and_decide(browser, worker)
    finally:
        browser.page().goto("about:blank")
        wait_streams_closed()
        quick.disable()


def look_and_decide(browser: Browser, worker: CeleryProcess) -> None:
    # Run ids of this test's own: effects are counted outside the test database.
    tag = uuid.uuid4().hex[:8]
    pay_id, tree_id, halt_id = f"ibb-pay-{tag}", f"ibb-tree-{tag}", f"ibb-halt-{tag}"
    with pytest.raises(da.ApprovalPending):
        padded_payment.run(pay_id, "pay the supplier")
    with pytest.raises(da.ApprovalPending):
        quorum.run(f"ibb-quorum-{tag}", "pay inv-1")
    with pytest.raises(da.ApprovalPending):
        gated_tree[0].run(tree_id, "go")
    with pytest.raises(da.InterruptPending):
        asks_staff.run(f"ibb-ask-{tag}", "refund o-9")
    with pytest.raises(da.OutcomeUnknown):
        unsure_transfer.run(halt_id, "move 42")
    pay = ApprovalRequest.objects.get(run_id=pay_id)
    halt = Halt.objects.get(run_id=halt_id)
    user = staff_user("oncall", *PERMS)

    page = browser.page()
    login(page, user.username)
    for label, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.goto("/admin/durable_agents/inbox/")
        card = page.locator(f"#approval-{pay.pk}")
        # The payee, under its title, on the folded card; the card offers no decision.
        expect(card.locator("dd[data-key=payee]")).to_contain_text(PAYEE)
        expect(card.locator("dd[data-key=payee]")).to_be_visible()
        expect(card.locator(".da-folded").first).to_be_visible()
        expect(card.locator("button.da-approve")).to_have_count(0)
        expect(card.locator("a.da-show-all")).to_be_visible()
        # The halt in the tool's own words.
        expect(page.locator(f"#halt-{halt.pk} .da-halt-reason")).to_contain_text(GATEWAY_MESSAGE)
        # The question: nothing chosen.
        select = page.locator(".da-card-question select")
        expect(select).to_have_value("")
        no_horizontal_scroll(page)
        shot(page, f"inbox-{label}")

        page.goto(f"/admin/durable_agents/run/{tree_id}/change/")
        no_horizontal_scroll(page)
        shot(page, f"run-{label}")
        page.goto("/admin/durable_agents/approvalrequest/")
        row = page.locator("#result_list tbody tr", has_text=pay_id)
        # The padded payment's row cut its arguments: no one-click decision on it.
        expect(row.locator(".da-row-approve")).to_have_count(0)
        expect(row.locator("a.da-row-open")).to_have_text("Open to decide")
        no_horizontal_scroll(page)
        if label == "desktop":
            list_fits(page)
        shot(page, f"queue-{label}")
        page.goto("/admin/durable_agents/run/")
        no_horizontal_scroll(page)
        if label == "desktop":
            list_fits(page)
        shot(page, f"runs-{label}")
        page.goto(f"/admin/durable_agents/halt/{halt.pk}/change/")
        expect(page.locator("#content-main")).to_contain_text(GATEWAY_MESSAGE)
        no_horizontal_scroll(page)
        shot(page, f"halt-{label}")

    # A decision forged from the folded card is refused: nothing is recorded.
    page.goto("/admin/durable_agents/inbox/")
    decide = f"/admin/durable_agents/approvalrequest/{pay.pk}/decide/"
    assert "approval.not_shown_whole" in forged_decision(page, decide)
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "pending"
    assert not Decision.objects.filter(request=pay).exists()

    # Opened whole (a link, no script), the card decides what it showed.
    page.locator(f"#approval-{pay.pk} a.da-show-all").click()
    card = page.locator(f"#approval-{pay.pk}")
    expect(card.locator(".da-folded")).to_have_count(0)
    expect(card).to_contain_text("line 14: widget batch 14")
    no_horizontal_scroll(page)
    shot(page, "inbox-card-whole-phone")
    worker.wait_ready()
    card.locator("button.da-approve").click()
    expect(page.locator(".messagelist")).to_contain_text("is approved")
    expect(page.locator(f"#approval-{pay.pk}")).to_have_count(0)
    assert ApprovalRequest.objects.get(pk=pay.pk).status == "approved"
    assert wait_status(pay_id, "finished", worker).answer == "paid"
    assert count_effects(pay_id) == {"call_1_1": 1}
