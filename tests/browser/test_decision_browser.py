"""A memo that reads like the fields, in a real browser (headless Chromium) at 1400 px and on
a 390 px phone (issue 44, item 8). The tool puts a 1,700-character memo before the payee in
its schema, opening with "Payee: ACME Supplies GmbH", an IBAN and an amount that are not
the call's; it names the payee and the amount as what identifies a call
(``identifying=``). Measured as Chromium lays the pages out:

- the payee and the amount come first, on the folded card, the whole card and the call's
  page; the memo is drawn in a bordered box, quoted, set in from where field titles stand;
- with the card opened whole (or the call's page), Approve is on screen with the real payee
  at the top of the screen, below it, and stays there while the memo scrolls by, on a bar
  that names the payee and the amount;
- the decision made from that bar is for the arguments the page showed (``shown``), and
  goes through: from the phone's card and from the desktop's call page.

Screenshots are written to docs/screenshots/ (ignored by git); docs/admin.md points there.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

import durable_agents as da
from durable_agents.models import ApprovalRequest, Run
from tests.support.agents import count_effects
from tests.support.browser import Browser, login, screenshot, staff_user
from tests.support.inbox_agents import DECOY_MEMO, PAYEE, decoy_payment
from tests.support.layout import box, in_view, sideways

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}
PERMS = ("durable_agents.view_run", "durable_agents.approve_toolcall")
AMOUNT = "1,250,000"


def shot(page: Page, name: str) -> None:
    """The whole page, and the screen as a person sees it now (``<name>-screen.png``)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}-screen.png"))
    screenshot(page, SHOTS / f"{name}.png")


def scroll_to_top(page: Page, *targets: Locator) -> None:
    """Scroll so that the highest of ``targets`` starts at the top of the screen, as for a
    person reading them."""
    top = min(box(t)["top"] for t in targets)
    page.evaluate("(dy) => window.scrollBy(0, dy)", top)


def identifying_first_and_memo_boxed(page: Page, where: Locator) -> None:
    """The payee and the amount are the first fields; the memo's text, decoy and all, is
    drawn quoted inside a bordered box, set in from the field titles."""
    titles = where.locator("dl.da-shown > dt").all_inner_texts()
    assert titles[:4] == ["Payee", "Amount (cents)", "Memo", "Invoice lines"], titles
    payee = where.locator("dl.da-shown > dd[data-key=payee]")
    memo = where.locator("dl.da-shown > dd[data-key=memo]")
    expect(payee).to_contain_text(PAYEE)
    expect(where.locator("dl.da-shown > dd[data-key=amount_cents]")).to_contain_text(AMOUNT)
    assert box(payee)["bottom"] <= box(memo)["top"]
    # The decoy is text inside a box, not a title: bordered, captioned, quoted, set in.
    free = memo.locator(".da-v-free")
    expect(free).to_contain_text("Payee: ACME Supplies GmbH")
    expect(free.locator(".da-free-caption")).to_contain_text("free text, 1,700 characters")
    border = free.evaluate(
        "(e) => { const s = getComputedStyle(e);"
        " return [s.borderTopWidth, s.borderLeftWidth, s.borderBottomStyle]; }"
    )
    assert float(border[0].removesuffix("px")) >= 1 and float(border[1].removesuffix("px")) >= 3
    assert border[2] == "solid", border
    text = free.locator(".da-v-text")
    quote = text.evaluate("(e) => getComputedStyle(e, '::before').content")
    assert "\u201c" in quote, quote
    decoy_left = text.evaluate("(e) => e.getClientRects()[0].left")
    title_left = box(where.locator("dl.da-shown > dt").first)["left"]
    assert decoy_left >= title_left + 8, (decoy_left, title_left)
    # No field of the call is titled as the decoy's lines are.
    assert "Payee: ACME" not in " ".join(titles)


def approve_stays_with_the_payee(page: Page, where: Locator, bar: Locator) -> None:
    """With the real payee at the top of the screen, Approve is on screen below it; while the
    memo scrolls by, Approve stays on screen on a bar naming the payee and the amount."""
    approve = bar.locator("button.da-approve")
    payee = where.locator("dl.da-shown > dd[data-key=payee]")
    expect(bar.locator(".da-cover[data-key=payee]")).to_contain_text(PAYEE)
    expect(bar.locator(".da-cover[data-key=amount_cents]")).to_contain_text(AMOUNT)
    # The first screen (the card, or the page's arguments, at the top): the real payee and
    # Approve, not the decoy alone.
    scroll_to_top(page, where)
    assert in_view(page, payee) and in_view(page, approve), (box(payee), box(approve))
    scroll_to_top(page, where.locator("dl.da-shown > dt").first, payee)
    assert in_view(page, payee), box(payee)
    assert in_view(page, approve), (box(approve), page.viewport_size)
    assert box(approve)["top"] >= box(payee)["bottom"]
    # Half-way down the memo: the payee is off screen, the bar (and what it names) is not.
    memo = where.locator("dl.da-shown > dd[data-key=memo] .da-v-free")
    memo.evaluate("(e) => e.scrollIntoView({block: 'center'})")
    assert in_view(page, approve) and in_view(page, bar), box(bar)
    expect(bar).to_contain_text(PAYEE)


def test_a_memo_cannot_pass_for_the_payee_and_approve_stays_with_it(live_server, browser: Browser):
    tag = uuid.uuid4().hex[:8]
    runs = {label: f"decoy-{label}-{tag}" for label in WIDTHS}
    for run_id in runs.values():
        with pytest.raises(da.ApprovalPending):
            decoy_payment.run(run_id, "pay the supplier")
    calls = {label: ApprovalRequest.objects.get(run_id=runs[label]) for label in WIDTHS}
    assert calls["phone"].arguments["memo"] == DECOY_MEMO
    user = staff_user("approver", *PERMS)
    page = browser.page()
    login(page, user.username)

    for label, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        call = calls[label]
        # The folded card: what identifies the call first, no decision yet.
        page.goto("/admin/durable_agents/inbox/")
        card = page.locator(f"#approval-{call.pk}")
        identifying_first_and_memo_boxed(page, card)
        expect(card.locator("button.da-approve")).to_have_count(0)
        # The queue's row: its JSON opens with the payee too (cut: no one-click decision).
        page.goto("/admin/durable_agents/approvalrequest/")
        row = page.locator("#result_list tbody tr", has_text=call.run_id)
        cell = row.locator("td.field-arguments_pretty pre").inner_text()
        assert cell.startswith('{\n  "payee": "Mallory'), cell[:60]
        expect(row.locator("a.da-row-open")).to_have_text("Open to decide")

        # The card opened whole.
        page.goto("/admin/durable_agents/inbox/")
        page.locator(f"#approval-{call.pk} a.da-show-all").click()
        card = page.locator(f"#approval-{call.pk}")
        expect(card.locator(".da-folded")).to_have_count(0)
        identifying_first_and_memo_boxed(page, card)
        approve_stays_with_the_payee(page, card, card.locator(".da-decision-bar"))
        assert not sideways(page, "the whole card")
        scroll_to_top(page, card)
        shot(page, f"decision-card-{label}")

        # The call's page.
        page.goto(f"/admin/durable_agents/approvalrequest/{call.pk}/change/")
        main = page.locator("#content-main")
        identifying_first_and_memo_boxed(page, main)
        approve_stays_with_the_payee(page, main, page.locator("#da-decision-bar"))
        assert not sideways(page, "the call's page")
        scroll_to_top(page, main)
        shot(page, f"decision-call-{label}")

    # From the phone's whole card, and from the desktop's call page: each decision carries
    # the arguments its page showed, and goes through.
    page.set_viewport_size({"width": 390, "height": 844})
    phone = calls["phone"]
    page.goto(f"/admin/durable_agents/inbox/?whole=approval-{phone.pk}")
    page.locator(f"#approval-{phone.pk} .da-decision-bar button.da-approve").click()
    expect(page.locator(".messagelist")).to_contain_text(
        f"Call call_1_1 of run {phone.run_id} is approved"
    )
    page.set_viewport_size({"width": 1400, "height": 900})
    desktop = calls["desktop"]
    page.goto(f"/admin/durable_agents/approvalrequest/{desktop.pk}/change/")
    page.locator("#da-decision-bar button.da-approve").click()
    expect(page.locator(".messagelist")).to_contain_text(
        f"Call call_1_1 of run {desktop.run_id} is approved"
    )
    for label, call in calls.items():
        call.refresh_from_db()
        assert call.status == "approved"
        # Handed over inline: the payment ran once, with the arguments shown.
        assert Run.objects.get(run_id=call.run_id).status == "finished"
        assert count_effects(call.run_id) == {"call_1_1": 1}, label
