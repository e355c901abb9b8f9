"""Which rule asked, and the deadline, in a real browser (headless Chromium) at 1400 px and on
a 390 px phone (issue 42, "Where people see it"), with the refund policy of
tests/support/rule_desk.py on PostgreSQL. Measured as Chromium lays the pages out:

- on the inbox's card and on the call's page, the rule line ("lead: amount_cents 50000 <=
  100000 → 1 of support-leads") and the deadline ("escalates to oncall in 3 h") are on
  screen, not under the decision bar, and nothing scrolls sideways; an escalated call's
  deadline is drawn as urgent;
- the decision bar still decides: Approve from the phone's card and from the desktop's call
  page goes through, and the refund runs once;
- a call an edit moved under a stricter rule offers no plain Approve (the engine would
  refuse it) but *Approve the edit…*, which opens the call's page with the edit to approve.

Screenshots go to docs/screenshots/ (ignored by git): ``rules-card-{phone,desktop}.png``,
``rules-call-{phone,desktop}.png``, and ``…-screen.png``, the screen as a person sees it;
docs/admin.md points there.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

import durable_agents as da
from durable_agents.models import ApprovalRequest, Run
from tests.support.agents import count_effects
from tests.support.browser import PASSWORD, Browser, login, screenshot
from tests.support.layout import box, in_view, sideways
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS, ONCALL
from tests.support.rule_desk import CALL, age, desk, escalate

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}
PERMS = ("durable_agents.view_run", "durable_agents.approve_toolcall")

# Whether a person sees the element: the point at its centre is the element (or inside it),
# not the sticky decision bar or anything else drawn over it.
_UNCOVERED = """(e) => {
    const r = e.getBoundingClientRect();
    const top = document.elementFromPoint(r.left + Math.min(r.width / 2, 40), r.top + r.height / 2);
    return top !== null && (top === e || e.contains(top));
}"""


def seen(page: Page, locator: Locator) -> bool:
    return in_view(page, locator) and bool(locator.evaluate(_UNCOVERED))


def to_top(page: Page, locator: Locator) -> None:
    page.evaluate("(dy) => window.scrollBy(0, dy)", box(locator)["top"])


def ask(run_id: str, cents: int) -> ApprovalRequest:
    with pytest.raises(da.ApprovalPending):
        desk.run(run_id, f"refund {cents}")
    return ApprovalRequest.objects.get(run_id=run_id)


def test_the_rule_and_the_deadline_are_seen_and_the_bar_still_decides(
    live_server, browser: Browser
):
    tag = uuid.uuid4().hex[:8]
    make_user("leo", *PERMS, groups=(LEADS,))
    for name in ("fay", "finn"):
        make_user(name, *PERMS, groups=(FINANCE,))
    user = make_user("lena", *PERMS, groups=(LEADS, FINANCE, ONCALL), password=PASSWORD)
    leads = {}
    for label in WIDTHS:
        leads[label] = ask(f"rb-lead-{label}-{tag}", 50_000)
        age(leads[label].run_id, hours=21)  # its escalation is 3 h away
    escalated = ask(f"rb-esc-{tag}", 250_000)
    age(escalated.run_id, hours=25)
    escalate(escalated.run_id)
    moved = ask(f"rb-moved-{tag}", 40_000)
    raised = {"order_id": "7", "amount_cents": 400_000}
    assert da.approve(moved.run_id, CALL, True, by="leo", edit=raised).status == "pending"

    page = browser.page()
    login(page, user.username)
    for label, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.goto("/admin/durable_agents/inbox/")
        card = page.locator(f"#approval-{leads[label].pk}")
        rule = card.locator(".da-rule-line")
        deadline = card.locator(".da-deadline")
        expect(rule).to_contain_text("amount_cents 50000 <= 100000")
        expect(rule).to_contain_text("1 of support-leads")
        expect(deadline).to_contain_text("escalates to oncall in")
        to_top(page, card)
        assert seen(page, rule) and seen(page, deadline), (label, box(rule), box(deadline))
        approve = card.locator(".da-decision-bar button.da-approve")
        assert in_view(page, approve), (label, box(approve))
        assert not sideways(page, "the inbox with rules"), sideways(page, "the inbox")
        page.screenshot(path=str(SHOTS / f"rules-card-{label}-screen.png"))
        screenshot(page, SHOTS / f"rules-card-{label}.png")

        late = page.locator(f"#approval-{escalated.pk} .da-deadline")
        expect(late).to_contain_text("escalated to oncall")
        assert "da-rule-urgent" in (
            page.locator(f"#approval-{escalated.pk} .da-rule").get_attribute("class") or ""
        )
        moved_card = page.locator(f"#approval-{moved.pk}")
        expect(moved_card.locator(".da-moved")).to_contain_text("An edit moved this call")
        expect(moved_card.locator("button.da-approve")).to_have_count(0)
        expect(moved_card.locator("a.da-approve-edit")).to_have_text("Approve the edit…")

        page.goto(f"/admin/durable_agents/approvalrequest/{leads[label].pk}/change/")
        rule = page.locator("#content-main td.da-rule-line")
        deadline = page.locator("#content-main td.da-deadline")
        expect(rule).to_contain_text("1 of support-leads")
        expect(deadline).to_contain_text("escalates to oncall in")
        assert seen(page, rule) and seen(page, deadline), (label, box(rule), box(deadline))
        assert in_view(page, page.locator("#da-decision-bar button.da-approve"))
        assert not sideways(page, "the call's page with rules")
        page.screenshot(path=str(SHOTS / f"rules-call-{label}-screen.png"))
        screenshot(page, SHOTS / f"rules-call-{label}.png")

    # The moved call: its way to approval is the call's page, the edit box holding the edit.
    page.goto("/admin/durable_agents/inbox/")
    page.locator(f"#approval-{moved.pk} a.da-approve-edit").click()
    edit = page.locator("#da-edit-arguments textarea")
    expect(edit).to_be_visible()
    assert '"amount_cents": 400000' in edit.input_value()

    # The bar decides as before: from the phone's card, and from the desktop's call page.
    page.set_viewport_size({"width": 390, "height": 844})
    phone = leads["phone"]
    page.goto("/admin/durable_agents/inbox/")
    page.locator(f"#approval-{phone.pk} .da-decision-bar button.da-approve").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Call call_1_1 of run {phone.run_id}")
    page.set_viewport_size({"width": 1400, "height": 900})
    desktop = leads["desktop"]
    page.goto(f"/admin/durable_agents/approvalrequest/{desktop.pk}/change/")
    page.locator("#da-decision-bar button.da-approve").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Call call_1_1 of run {desktop.run_id}")
    for call in leads.values():
        call.refresh_from_db()
        assert call.status == "approved"
        assert Run.objects.get(run_id=call.run_id).status == "finished"
        assert count_effects(call.run_id) == {CALL: 1}
