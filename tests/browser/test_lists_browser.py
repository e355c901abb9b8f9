"""Every staff list on a 390 px phone and at 1400 px, in a real browser (headless Chromium),
with real waiting state on PostgreSQL: nothing scrolls sideways — neither the page nor a
table inside it — and each list's decisive cells (a call's status and the buttons that
decide it, what a run waits for, why a call halted…) lie inside the viewport, where a person
sees them without scrolling. Layout is measured, not guessed: bounding boxes and scroll
widths as Chromium lays the page out.

Screenshots of each list at both widths are written to docs/screenshots/ (ignored by git);
docs/admin.md points there.
"""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from django.conf import settings
from django.test.utils import override_settings
from django.utils import timezone
from playwright.sync_api import Page, expect

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import THROTTLED, RunInfo, ThrottleInfo
from durable_agents.models import (
    ActionLog,
    ApiKey,
    ApprovalRequest,
    ApproverKey,
    Halt,
    Notification,
)
from tests.support.agents import echo, gated, gated_tree, quorum
from tests.support.browser import Browser, login, screenshot, staff_user
from tests.support.celery_agents import napper
from tests.support.inbox_agents import asks_staff, padded_payment, unsure_transfer
from tests.support.layout import cells_off_screen, sideways
from tests.support.people import make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}
ADMIN = "/admin/durable_agents"

# Each change list and the cells (``td.field-<name>`` / ``th.field-<name>``) a person must
# see on every row to act on it, or to know whether to.
LISTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue": (
        f"{ADMIN}/approvalrequest/",
        ("call_cell", "arguments_pretty", "quorum", "status_pill", "decide_here"),
    ),
    "halts": (f"{ADMIN}/halt/", ("call_cell", "cause", "status_pill", "lease_live")),
    "runs": (f"{ADMIN}/run/?status__exact=awaiting_approval", ("status_pill", "waits_for")),
    "runs-all": (f"{ADMIN}/run/?kind=all", ("run_cell", "status_pill", "waits_for")),
    "actions": (f"{ADMIN}/actionlog/", ("when", "actor_cell", "action_cell", "run_link")),
    "throttled": (f"{ADMIN}/throttle/", ("run_link", "key", "retry_at")),
    "apikeys": (f"{ADMIN}/apikey/", ("name", "user", "state")),
    "approverkeys": (f"{ADMIN}/approverkey/", ("user", "key_preview", "state")),
    "notifications": (f"{ADMIN}/notification/", ("about_cell", "status_cell", "error_cell")),
    "delegations": (f"{ADMIN}/delegation/", ("who", "window", "state_shown", "end")),
}
# Pages that are lists of their own making (cards, forms, tables).
PAGES = {
    "inbox": f"{ADMIN}/inbox/",
    "waiting": f"{ADMIN}/run/waiting/",
    "sessions": f"{ADMIN}/run/sessions/",
    "delegation-add": f"{ADMIN}/delegation/add/",
}


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(page, SHOTS / f"{name}.png")


def _site_key() -> str:
    private = Ed25519PrivateKey.generate()
    return private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def _public_key() -> str:
    public = Ed25519PrivateKey.generate().public_key()
    return base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def seed(tag: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Something on every list: calls awaiting approval (a padded payment, a quorum, a call
    deep in a tree of sub-runs), a halt, a question, a sleeping run, throttled runs, a
    session, action log rows, API and approver keys."""
    ids = {
        "pay": f"ph-pay-{tag}",
        "tree": f"ph-tree-{tag}",
        "halt": f"ph-halt-{tag}",
        "gated": f"ph-gated-{tag}",
        "decided": f"ph-decided-{tag}-with-a-rather-long-run-id-a-phone-must-wrap",
    }
    with pytest.raises(da.ApprovalPending):
        padded_payment.run(ids["pay"], "pay the supplier")
    with pytest.raises(da.ApprovalPending):
        quorum.run(f"ph-quorum-{tag}", "pay inv-1")
    with pytest.raises(da.ApprovalPending):
        gated_tree[0].run(ids["tree"], "go")
    with pytest.raises(da.ApprovalPending):
        gated.run(ids["gated"], "refund order 7")
    with pytest.raises(da.InterruptPending):
        asks_staff.run(f"ph-ask-{tag}", "refund o-9")
    with pytest.raises(da.OutcomeUnknown):
        unsure_transfer.run(ids["halt"], "move 42")
    monkeypatch.setenv("DA_NAP_SECONDS", "3600")
    with pytest.raises(da.Pause):
        napper.run(f"ph-nap-{tag}", "nap")
    with pytest.raises(da.ApprovalPending):
        gated.run(ids["decided"], "refund order 7")
    da.approve(
        ids["decided"],
        "call_1_1",
        approved=True,
        by=make_user("ops", "approve_toolcall"),
        note="ok",
    )
    echo.session(f"ph-chat-{tag}").send("where is order 7?")
    store = DjangoStore()
    now = store.now()
    for i in range(3):
        run_id = f"ph-throttled-{tag}-{i}"
        store.create_run(RunInfo(run_id, agent="limit-runs", status=THROTTLED))
        store.throttle(
            ThrottleInfo(
                run_id,
                "limit-runs",
                "agent/limit-runs",
                "slots",
                "2 at once",
                now + timedelta(seconds=50 + i),
                now - timedelta(seconds=60 - i),
            )
        )
    ActionLog.objects.create(
        actor="a-rather-long-username@payments.example.com",
        action="resolve",
        run_id=ids["halt"],
        target="call_1_1",
        payload={"evidence": {"provider_ref": "re_" + "9" * 60}, "note": "checked the gateway"},
    )
    # A notification given up, as the outbox leaves one (docs/notifications.md).
    request = ApprovalRequest.objects.get(run_id=ids["gated"])
    Notification.objects.create(
        request=request,
        event="approval_requested",
        channel="payments-team-slack-webhook",
        status=Notification.FAILED,
        attempts=12,
        next_attempt_at=None,
        last_error="given up after 12 tries; the last: hooks.slack.com answered 503: "
        + "upstream_connect_error_or_disconnect_before_headers " * 3,
        payload={
            "run_id": ids["gated"],
            "call_id": "call_1_1",
            "tool": "refund",
            "summary": "Refund 5.00 to order 7",
        },
    )
    # A lead away for a week, a deputy with a long name deciding some of her calls.
    for name in ("lena-lead", "a-rather-long-deputy-name@support.example.com"):
        make_user(name, "approve_toolcall")
    now = timezone.now()
    da.delegate(
        "lena-lead",
        "a-rather-long-deputy-name@support.example.com",
        now,
        now + timedelta(days=7),
        groups=["support-leads", "refunds-over-1000-eur"],
        tools=["refund", "send_goodwill_voucher"],
        by="lena-lead",
        note="On holiday; call me only if the building is on fire.",
    )
    return ids


def test_every_staff_list_fits_a_phone_and_a_desktop(
    live_server, browser: Browser, monkeypatch: pytest.MonkeyPatch
):
    tag = uuid.uuid4().hex[:8]
    signing = override_settings(
        DURABLE_AGENTS={**settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": _site_key()}
    )
    signing.enable()
    try:
        ids = seed(tag, monkeypatch)
        root = staff_user("root")
        root.is_superuser = True
        root.save()
        for i in range(2):
            ApiKey.objects.create(
                user=root,
                name=f"reconciliation-service-{i}",
                prefix=f"pfx{i}",
                key_hash="h",
                created_by=root,
                expires_at=timezone.now() + timedelta(days=90),
                last_used_at=timezone.now(),
            )
        ApproverKey.objects.create(user=root, public_key=_public_key())
        assert Halt.objects.filter(run_id=ids["halt"]).exists()
        page = browser.page()
        login(page, root.username)
        problems: list[str] = []
        for label, (width, height) in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": height})
            for name, (url, decisive) in LISTS.items():
                page.goto(url)
                what = f"{name} ({url})"
                problems += cells_off_screen(page, what, decisive)
                problems += sideways(page, what)
                shot(page, f"list-{name}-{label}")
            for name, url in PAGES.items():
                page.goto(url)
                problems += sideways(page, f"{name} ({url})")
                shot(page, f"list-{name}-{label}")
            page.goto(f"{ADMIN}/run/{ids['decided']}/verify/")
            assert page.locator("#da-verify-head code.da-key").count() == 1  # a signed head
            problems += sideways(page, "the verify page")
            shot(page, f"verify-{label}")
        assert not problems, "\n".join(problems)

        # On the phone, a card's Approve decides what the card shows: its row's digest of
        # the arguments still travels with the button.
        page.goto(f"{ADMIN}/approvalrequest/")
        card = page.locator("#result_list tbody tr", has_text=ids["gated"])
        expect(card.locator("td.field-arguments_pretty")).to_contain_text('"order_id": "7"')
        card.locator(".da-row-approve").click()
        expect(page.locator(".messagelist")).to_contain_text(
            f"Call call_1_1 of run {ids['gated']} is approved"
        )
        assert ApprovalRequest.objects.get(run_id=ids["gated"]).status == "approved"
    finally:
        signing.disable()
