"""Issue 42, notifications people act on: each fact of an approval request reaches each
channel once, through the outbox, at least once, against a real HTTP receiver on
127.0.0.1 that fails (500, a timeout) and recovers, refuses (4xx), or hangs; email through
Django's locmem backend; the reconciling pass; the admin's list and Retry; the settings."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core import mail
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import durable_agents as da
from durable_agents import signals
from durable_agents.celery.schedule import NOTIFY_TASK, beat_schedule
from durable_agents.conf import parse
from durable_agents.database.store import DjangoStore, site_store
from durable_agents.engine import names
from durable_agents.engine.records import encode
from durable_agents.models import ActionLog, ApprovalRequest, Notification, Run
from durable_agents.notifications import deliver, reconcile
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import notify_channels
from tests.support.agents import gated, quorum
from tests.support.people import make_user
from tests.support.procs import ROOT
from tests.support.receiver import HANG, Receiver, verified

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BASE = "https://ops.example.com"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def configure(settings: Any, *channels: dict[str, Any], **extra: Any) -> None:
    """NOTIFY with ``channels`` and a backoff of tens of milliseconds."""
    settings.EMAIL_BACKEND = LOCMEM
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {
            "BASE_URL": BASE,
            "CHANNELS": list(channels),
            "BASE_DELAY": 0.05,
            "MAX_DELAY": 0.2,
            **extra,
        },
    }
    mail.outbox.clear()


def hook(receiver: Receiver, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "webhook",
        "url": receiver.url,
        "secret_setting": "NOTIFY_HOOK_SECRET",
        "timeout": 0.5,
        **extra,
    }


def passes_until(done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Delivery passes until ``done()`` (a poll with a deadline: the backoff is real time)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not delivered in time"
        deliver()
        time.sleep(0.02)


def with_email(user: User, address: str) -> User:
    user.email = address
    user.save()
    return user


# -- the webhook: fails, times out, recovers -----------------------------------------------


def test_a_receiver_that_fails_then_times_out_gets_the_notification_once_it_recovers(
    settings, receiver
):
    configure(settings, hook(receiver))
    receiver.script.extend([500, HANG, 200])
    with pytest.raises(da.ApprovalPending):
        gated.run("hook-1", "refund order 7")
    assert receiver.got == []  # the run never waited on the receiver
    row = Notification.objects.get()
    assert (row.event, row.channel, row.status, row.attempts) == (
        "approval_requested",
        "webhook",
        "pending",
        0,
    )

    first = deliver()
    assert (first.sent, first.retrying, first.failed) == (0, 1, 0)
    row.refresh_from_db()
    assert row.status == "pending" and row.attempts == 1
    assert "answered 500" in row.last_error

    passes_until(lambda: Notification.objects.get().status == "sent")
    row.refresh_from_db()
    assert row.attempts == 3 and row.sent_at is not None and row.next_attempt_at is None
    assert "did not answer" in row.last_error  # the timeout, the last failure
    assert [g.answer for g in receiver.got] == [500, HANG, 200]
    # One delivery id, the row's, and the same bytes on every try; each try signed anew.
    assert {g.headers["X-Delivery-Id"] for g in receiver.got} == {str(row.delivery_id)}
    assert len({g.body for g in receiver.got}) == 1
    payloads = [verified(g) for g in receiver.got]
    request = ApprovalRequest.objects.get(run_id="hook-1")
    link = f"{BASE}/admin/durable_agents/approvalrequest/{request.pk}/change/"
    payload = payloads[-1]
    assert {k: payload[k] for k in ("event", "run_id", "agent", "call_id", "tool", "link")} == {
        "event": "approval_requested",
        "run_id": "hook-1",
        "agent": "gated",
        "call_id": request.call_id,
        "tool": "refund",
        "link": link,
    }
    assert payload["arguments"] == {"order_id": "7", "cents": 500}
    assert payload["summary"] == "Refund 5.00 to order 7"
    assert payload["delivery_id"] == str(row.delivery_id)
    assert payload["policy"] == {"kind": "single"} and payload["rule"] is None
    assert payload["at"].endswith("Z") and "text" not in payload

    # The link opens the call's page, where it is decided.
    client = Client()
    client.force_login(make_user("ann", "approve_toolcall"))
    assert client.get(link.removeprefix(BASE)).status_code == 200
    # Nothing is sent twice once delivered.
    assert deliver().sent == 0
    assert len(receiver.got) == 3


def test_the_receivers_recipe_in_the_docs_verifies_a_real_delivery(settings, receiver):
    """docs/notifications.md's ``verify``, run as written, takes what was sent and refuses a
    body changed on the way, another delivery id, and another secret."""
    configure(settings, hook(receiver))
    with pytest.raises(da.ApprovalPending):
        gated.run("hook-docs", "refund order 7")
    deliver()
    [got] = receiver.got
    text = (ROOT / "docs" / "notifications.md").read_text()
    recipe = re.search(r"```python\n(import hashlib.*?def verify.*?)```", text, re.S)
    assert recipe, "docs/notifications.md lost the receiver's recipe"
    namespace: dict[str, Any] = {}
    exec(compile(recipe.group(1), "docs/notifications.md", "exec"), namespace)  # the docs' code
    verify = namespace["verify"]
    delivery_id, header = got.headers["X-Delivery-Id"], got.headers["X-Signature"]
    secret = django_settings.NOTIFY_HOOK_SECRET
    assert verify(got.body, delivery_id, header, secret)
    assert not verify(got.body.replace(b"500", b"900"), delivery_id, header, secret)
    assert not verify(got.body, "another-id", header, secret)
    assert not verify(got.body, delivery_id, header, "x" + secret)


@pytest.mark.parametrize("status", [400, 403, 404, 301])
def test_a_receiver_refusing_the_request_is_given_up_at_once(settings, receiver, status):
    configure(settings, hook(receiver))
    receiver.script.append(status)
    with pytest.raises(da.ApprovalPending):
        gated.run(f"hook-{status}", "refund order 7")
    assert deliver().failed == 1
    row = Notification.objects.get()
    assert row.status == "failed" and row.attempts == 1 and row.next_attempt_at is None
    assert f"answered {status}" in row.last_error and "given up" in row.last_error
    assert receiver.url.rpartition("/")[2] not in row.last_error  # the host, not the path
    for _ in range(3):
        deliver()
    assert len(receiver.got) == 1


@pytest.mark.parametrize("status", [408, 429, 503])
def test_408_429_and_5xx_are_tried_again(settings, receiver, status):
    configure(settings, hook(receiver))
    receiver.script.append(status)
    with pytest.raises(da.ApprovalPending):
        gated.run(f"hook-{status}", "refund order 7")
    assert deliver().retrying == 1
    passes_until(lambda: Notification.objects.get().status == "sent")
    assert [g.answer for g in receiver.got] == [status, 200]


def test_a_notification_is_given_up_after_max_attempts(settings, receiver):
    configure(settings, hook(receiver), MAX_ATTEMPTS=3)
    receiver.script.extend([500] * 10)
    with pytest.raises(da.ApprovalPending):
        gated.run("hook-cap", "refund order 7")
    passes_until(lambda: Notification.objects.get().status == "failed")
    row = Notification.objects.get()
    assert row.attempts == 3 and len(receiver.got) == 3
    assert row.last_error.startswith("given up after 3 tries; the last:")
    for _ in range(3):
        deliver()
    assert len(receiver.got) == 3


def test_a_receiver_that_is_down_costs_one_try_a_pass_not_one_per_notification(settings, receiver):
    configure(settings, hook(receiver), BASE_DELAY=0.5, MAX_DELAY=0.5)
    receiver.script.extend([500] * 10)
    for i in range(3):
        with pytest.raises(da.ApprovalPending):
            gated.run(f"down-{i}", "refund order 7")
    done = deliver()
    assert (done.sent, done.retrying) == (0, 1)
    assert len(receiver.got) == 1  # the other two wait for the next pass
    receiver.script.clear()
    passes_until(lambda: not Notification.objects.exclude(status="sent").exists())
    assert len(receiver.got) == 4
    assert len({g.headers["X-Delivery-Id"] for g in receiver.got}) == 3


def test_a_receiver_that_hangs_holds_up_no_other_channel(settings, receiver):
    configure(settings, hook(receiver, timeout=30), {"kind": "email"})
    with_email(make_user("ann", "approve_toolcall"), "ann@example.com")
    receiver.script.append(HANG)
    with pytest.raises(da.ApprovalPending):
        gated.run("hook-hang", "refund order 7")

    def in_thread() -> None:
        try:
            deliver()
        finally:
            connections.close_all()

    passing = threading.Thread(target=in_thread)
    passing.start()
    receiver.wait_hanging()
    deadline = time.monotonic() + 10
    while not mail.outbox:
        assert time.monotonic() < deadline, "the email waited for the hanging receiver"
        time.sleep(0.01)
    assert receiver.hanging == 1  # still hanging when the email went
    receiver.release.set()
    passing.join(30)
    assert not passing.is_alive()
    assert set(Notification.objects.values_list("channel", "status")) == {
        ("webhook", "sent"),
        ("email", "sent"),
    }


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_the_outbox_on_sqlite(settings, receiver):
    """The demo's database: claims without FOR UPDATE, backoff in SQLite's date arithmetic."""
    configure(settings, hook(receiver))
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "DATABASE": "sqlite"}
    make_user("ann", "approve_toolcall")
    receiver.script.append(500)
    with pytest.raises(da.ApprovalPending):
        gated.run("lite-1", "refund order 7", store=site_store())
    rows = Notification.objects.using("sqlite")
    assert rows.get().status == "pending" and not Notification.objects.exists()
    assert deliver().retrying == 1
    row = rows.get()
    assert row.next_attempt_at > row.created_at  # backed off
    passes_until(lambda: rows.get().status == "sent")
    da.approve("lite-1", "call_1_1", True, by="ann")
    rows.filter(event="approval_decided").delete()  # as if its signal was lost
    assert reconcile() == 1
    passes_until(lambda: not rows.exclude(status="sent").exists())
    assert [verified(g)["event"] for g in receiver.got] == [
        "approval_requested",
        "approval_requested",
        "approval_decided",
    ]


def test_the_command_runs_one_pass(settings, receiver):
    configure(settings, hook(receiver))
    receiver.script.append(500)
    for run_id in ("cmd-1", "cmd-2"):
        with pytest.raises(da.ApprovalPending):
            gated.run(run_id, "refund order 7")
    out = StringIO()
    call_command("durable_agents", "notify", stdout=out)
    # The receiver failed the first: its channel waits for the next pass.
    assert out.getvalue().strip() == "sent 0, to try again 1, given up 0; 0 missing row(s) written"
    sent, deadline = 0, time.monotonic() + 20
    while sent < 2:  # the other now, the first after its backoff
        assert time.monotonic() < deadline
        out = StringIO()
        call_command("durable_agents", "notify", stdout=out)
        sent += int(out.getvalue().split()[1].rstrip(","))
    assert sent == 2 and len(receiver.got) == 3


# -- each fact, once per step and channel ------------------------------------------------


def _announce(signal: Any, request: ApprovalRequest, **details: Any) -> None:
    """What the deadline steps' code announces (another part of issue 42), announced twice:
    a second announcement of one fact must tell nobody again."""
    for _ in range(2):
        signal.send(
            sender=Run,
            run_id=request.run_id,
            agent="quorum",
            call_id=request.call_id,
            tool=request.tool_name,
            arguments=request.arguments,
            **details,
        )


def test_each_fact_reaches_each_channel_once(settings, receiver):
    configure(
        settings,
        hook(receiver, text=True),
        {"kind": "email"},
        hook(
            receiver, name="decisions", url=receiver.url + "/decisions", events=["approval_decided"]
        ),
    )
    for name, group in (("fin1", "finance"), ("fin2", "finance"), ("oc1", "oncall")):
        with_email(make_user(name, "approve_toolcall", groups=(group,)), f"{name}@example.com")
    with_email(make_user("ops1", "approve_toolcall"), "ops1@example.com")  # in neither group

    with pytest.raises(da.ApprovalPending):
        quorum.run("facts-1", "pay inv-1")
    request = ApprovalRequest.objects.get(run_id="facts-1")
    deliver()
    assert [m.to for m in mail.outbox] == [["fin1@example.com"], ["fin2@example.com"]]
    assert all(m.subject.startswith("Approval needed:") for m in mail.outbox)
    mail.outbox.clear()

    da.approve("facts-1", request.call_id, True, by="fin1")  # a vote: one of two
    policy = {**request.policy, "deadline": {"remind": 60.0, "escalate": 120.0}}
    _announce(signals.approval_reminded, request, policy=policy, step="remind", rule="payouts")
    deliver()
    # A reminder skips who voted already.
    assert [(m.to, m.subject.split(":")[0]) for m in mail.outbox] == [
        (["fin2@example.com"], "Reminder")
    ]
    assert "needs 2 approvals from group finance: 1 of 2 so far" in mail.outbox[0].body
    mail.outbox.clear()

    escalated = {**policy, "escalated_to": "oncall"}
    _announce(
        signals.approval_escalated, request, policy=escalated, step="escalate", rule="payouts"
    )
    deliver()
    # Escalated: the escalation group's members too.
    assert sorted(m.to[0] for m in mail.outbox) == ["fin2@example.com", "oc1@example.com"]
    assert "members of oncall may decide it now too" in mail.outbox[0].body
    mail.outbox.clear()

    da.approve("facts-1", request.call_id, True, by="fin2")  # the second: decided
    deliver()
    assert sorted(m.to[0] for m in mail.outbox) == ["fin1@example.com", "fin2@example.com"]
    assert mail.outbox[0].subject.startswith("Approved by fin2:")

    main = [verified(g) for g in receiver.got if not g.path.endswith("/decisions")]
    side = [verified(g) for g in receiver.got if g.path.endswith("/decisions")]
    assert [p["event"] for p in main] == [
        "approval_requested",
        "approval_reminded",
        "approval_escalated",
        "approval_decided",
    ]
    assert len({p["delivery_id"] for p in main}) == 4
    assert [p["event"] for p in side] == ["approval_decided"]
    texts = [p["text"] for p in main]
    assert texts[0].startswith("Approval needed: pay [run facts-1, quorum] https://ops.")
    assert texts[2].startswith("Escalated to oncall: pay")
    assert texts[3].startswith("Approved by fin2: pay")
    assert all("\n" not in t for t in texts)
    escalation, decision = main[2], main[3]
    assert (escalation["step"], escalation["escalated_to"], escalation["rule"]) == (
        "escalate",
        "oncall",
        "payouts",
    )
    assert (decision["decision"], decision["approved"], decision["by"]) == ("approve", True, "fin2")
    assert "text" not in side[0]

    # Nothing more to tell, whatever passes follow.
    assert reconcile() == 0
    assert deliver().sent == 0
    assert Notification.objects.count() == 4 + 4 + 1
    assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


@da.tool(requires_approval=True, sensitive=["card"])
def charge_card(card: str, cents: int) -> dict:
    """Charge a card."""
    return {"charged": cents}


carded = da.Agent(
    "notify-carded",
    ScriptedModel(
        [
            scripted.calls(scripted.call("charge_card", {"card": "4242424242424242", "cents": 9})),
            scripted.text("charged"),
        ]
    ),
    "Charge cards.",
    [charge_card],
)


def test_sensitive_arguments_are_not_sent(settings, receiver):
    configure(settings, hook(receiver))
    with pytest.raises(da.ApprovalPending):
        carded.run("hook-card", "charge", store=DjangoStore())
    deliver()
    [got] = receiver.got
    assert b"4242" not in got.body
    assert verified(got)["arguments"] == {"card": "[sensitive]", "cents": 9}


def test_a_channel_of_the_sites_own_by_dotted_path(settings):
    notify_channels.received.clear()
    kind = "tests.support.notify_channels.Collect"
    configure(
        settings,
        {"kind": kind, "topic": "approvals"},
        {"kind": kind, "name": "refusing", "refuse": "no such topic"},
    )
    with pytest.raises(da.ApprovalPending):
        gated.run("own-1", "refund order 7")
    done = deliver()
    assert (done.sent, done.failed) == (1, 1)
    [(options, notice)] = notify_channels.received
    assert options == {"topic": "approvals"}
    assert (notice.event, notice.run_id, notice.attempt) == ("approval_requested", "own-1", 1)
    row = Notification.objects.get(channel="refusing")
    assert row.status == "failed" and row.last_error == "no such topic"


# -- the reconciling pass --------------------------------------------------------------


def _record(run_id: str, name: str, body: dict[str, Any]) -> None:
    """Journal a deadline step as its code would, without the signal that follows it (as
    when its process died right after the commit)."""
    DjangoStore().insert(run_id, name, encode(body))


def test_the_reconciling_pass_writes_the_rows_of_facts_whose_signal_was_lost(settings, receiver):
    configure(settings, hook(receiver))
    with pytest.raises(da.ApprovalPending):
        gated.run("lost-1", "refund order 7")
    deliver()
    request = ApprovalRequest.objects.get(run_id="lost-1")
    call = request.call_id
    deadline = {"remind": 60.0, "escalate": 120.0, "escalate_to": "oncall", "expire": 600.0}
    # As a da.Rules request's policy reads: the rule that asked, and its deadline.
    policy = {"kind": "single", "rule": "refund-lead", "deadline": deadline}
    ApprovalRequest.objects.filter(pk=request.pk).update(
        policy=policy, created_at=timezone.now() - timedelta(seconds=150)
    )
    # Due, but not journaled: the steps have not happened, nothing to tell.
    assert reconcile() == 0

    _record("lost-1", names.deadline(call, "remind"), {"step": "remind"})
    assert reconcile() == 1
    assert reconcile() == 0  # idempotent
    escalated = {**policy, "escalated_to": "oncall"}
    _record("lost-1", names.deadline(call, "escalate"), {"step": "escalate", "policy": escalated})
    assert reconcile() == 1
    _record("lost-1", names.deadline(call, "expire"), {"step": "expire", "on_expiry": "deny"})
    ApprovalRequest.objects.filter(pk=request.pk).update(
        status="expired", decided_at=timezone.now()
    )
    assert reconcile() == 1
    assert reconcile() == 0
    deliver()
    events = [verified(g) for g in receiver.got]
    assert [(p["event"], p.get("step")) for p in events] == [
        ("approval_requested", None),
        ("approval_reminded", "remind"),
        ("approval_escalated", "escalate"),
        ("approval_expired", "expire"),
    ]
    assert events[2]["escalated_to"] == "oncall"
    assert [p["rule"] for p in events[1:]] == ["refund-lead"] * 3
    assert events[3]["on_expiry"] == "deny"


def test_the_reconciling_pass_looks_back_only_as_far_as_its_window(settings, receiver):
    configure(settings, hook(receiver, events=["approval_decided"]), WINDOW=3600)
    make_user("ann", "approve_toolcall")
    for run_id in ("old-1", "new-1"):
        with pytest.raises(da.ApprovalPending):
            gated.run(run_id, "refund order 7")
        request = ApprovalRequest.objects.get(run_id=run_id)
        da.approve(run_id, request.call_id, True, by="ann")
    # Their signals' rows, gone as if never written; one decision is two hours old.
    Notification.objects.all().delete()
    ApprovalRequest.objects.filter(run_id="old-1").update(
        decided_at=timezone.now() - timedelta(hours=2)
    )
    assert reconcile() == 1
    [row] = Notification.objects.all()
    assert (row.request.run_id, row.event) == ("new-1", "approval_decided")
    assert row.payload["by"] == "ann" and row.payload["approved"] is True


# -- the admin ---------------------------------------------------------------------------


def _changelist(client: Client, query: str = "") -> tuple[str, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/admin/durable_agents/notification/{query}")
    assert response.status_code == 200
    return response.content.decode(), len(captured.captured_queries)


def test_the_admin_lists_what_was_not_sent_and_retries_it(settings, receiver):
    configure(settings, hook(receiver))
    receiver.script.extend([400] * 5)
    client = Client()
    client.force_login(make_user("ops", "view_notification", "change_notification"))

    with pytest.raises(da.ApprovalPending):
        gated.run("adm-1", "refund order 7")
    deliver()
    page, few = _changelist(client)
    assert "adm-1" in page and "answered 400" in page and "given up" in page
    for i in range(2, 6):
        with pytest.raises(da.ApprovalPending):
            gated.run(f"adm-{i}", "refund order 7")
    deliver()
    page, many = _changelist(client)
    assert all(f"adm-{i}" in page for i in range(1, 6))
    assert many == few  # whatever the page's size

    # Retry, then the receiver takes them.
    ids = list(Notification.objects.values_list("pk", flat=True))
    response = client.post(
        "/admin/durable_agents/notification/",
        {"action": "retry_selected", "_selected_action": ids},
    )
    assert response.status_code == 302
    assert set(Notification.objects.values_list("status", "attempts")) == {("pending", 0)}
    logged = ActionLog.objects.get(action="retry_notifications")
    assert (logged.actor, logged.payload["count"]) == ("ops", 5)
    assert deliver().sent == 5
    row = Notification.objects.get(request__run_id="adm-1")
    detail = client.get(f"/admin/durable_agents/notification/{row.pk}/change/")
    assert detail.status_code == 200 and str(row.delivery_id) in detail.content.decode()
    page, _ = _changelist(client)
    assert "adm-1" not in page  # sent: off the list that opens on what was not
    page, _ = _changelist(client, "?status=sent")
    assert all(f"adm-{i}" in page for i in range(1, 6))


def test_retry_needs_the_change_permission(settings, receiver):
    configure(settings, hook(receiver))
    receiver.script.append(400)
    with pytest.raises(da.ApprovalPending):
        gated.run("adm-view", "refund order 7")
    deliver()
    client = Client()
    client.force_login(make_user("looker", "view_notification"))
    page, _ = _changelist(client)
    assert "adm-view" in page and "retry_selected" not in page
    row = Notification.objects.get()
    client.post(
        "/admin/durable_agents/notification/",
        {"action": "retry_selected", "_selected_action": [row.pk]},
    )
    row.refresh_from_db()
    assert row.status == "failed"
    assert not ActionLog.objects.filter(action="retry_notifications").exists()
    stranger = Client()
    stranger.force_login(make_user("stranger", "view_run"))
    assert stranger.get("/admin/durable_agents/notification/").status_code == 403


# -- settings ----------------------------------------------------------------------------

HOOK = {"kind": "webhook", "url": "https://hooks.example.com/a", "secret_setting": "OPS_SECRET"}


@pytest.mark.parametrize(
    "notify, says",
    [
        ({"BASE_URL": BASE, "CHANNELS": {"kind": "email"}}, "must be a list of channels"),
        ({"BASE_URL": BASE, "CHANNELS": ["email"]}, "['CHANNELS'][0] must be a dict"),
        ({"BASE_URL": BASE, "CHANNELS": [{"kind": "slack"}]}, "must be 'email', 'webhook' or"),
        ({"BASE_URL": BASE, "CHANNELS": [{"kind": "emial"}]}, "did you mean 'email'"),
        ({"CHANNELS": [{"kind": "email"}]}, "['CHANNELS'] needs 'BASE_URL'"),
        ({"BASE_URL": BASE, "APPROVALS": True, "CHANNELS": [{"kind": "email"}]}, "both"),
        ({"BASE_URL": BASE, "CHANNELS": [{"kind": "email", "url": "x"}]}, "unknown key"),
        (
            {"BASE_URL": BASE, "CHANNELS": [{**HOOK, "secret": "x"}]},
            "did you mean 'secret_setting'",
        ),
        ({"BASE_URL": BASE, "CHANNELS": [{**HOOK, "url": "hooks.example.com"}]}, "needs 'url'"),
        (
            {
                "BASE_URL": BASE,
                "CHANNELS": [{k: v for k, v in HOOK.items() if k != "secret_setting"}],
            },
            "needs 'secret_setting'",
        ),
        ({"BASE_URL": BASE, "CHANNELS": [{**HOOK, "timeout": 0}]}, "['timeout'] must be"),
        ({"BASE_URL": BASE, "CHANNELS": [{**HOOK, "text": "yes"}]}, "['text'] must be True or"),
        (
            {"BASE_URL": BASE, "CHANNELS": [{**HOOK, "events": ["approval_decide"]}]},
            "did you mean 'approval_decided'",
        ),
        ({"BASE_URL": BASE, "CHANNELS": [{**HOOK, "events": []}]}, "non-empty list"),
        ({"BASE_URL": BASE, "CHANNELS": [HOOK, HOOK]}, "distinct 'name'"),
        ({"BASE_URL": BASE, "CHANNELS": [{**HOOK, "name": "a b"}]}, "['name'] must be"),
        ({"BASE_URL": BASE, "MAX_ATTEMPTS": 0}, "['MAX_ATTEMPTS'] must be an int"),
        ({"BASE_URL": BASE, "BASE_DELAY": 10, "MAX_DELAY": 5}, "not be longer than 'MAX_DELAY'"),
        ({"BASE_URL": BASE, "INTERVAL": -1}, "must be a positive number"),
    ],
)
def test_a_bad_channel_setting_is_a_system_check_error(settings, site_urls, notify, says):
    assert says in " ".join(parse({"NOTIFY": notify})[1])
    settings.DURABLE_AGENTS = {**django_settings.DURABLE_AGENTS, "NOTIFY": notify}
    errors = [e for e in run_checks() if e.id == "durable_agents.E001"]
    assert errors and any(says in e.msg for e in errors), [e.msg for e in errors]


@pytest.mark.parametrize(
    "kind, says",
    [
        ("tests.support.no_such_module.Channel", "cannot be imported"),
        ("tests.support.notify_channels.not_a_channel", "not a class or function"),
    ],
)
def test_a_channel_of_your_own_that_does_not_import_is_a_system_check_error(
    settings, site_urls, kind, says
):
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"BASE_URL": BASE, "CHANNELS": [{"kind": kind}]},
    }
    errors = [e.msg for e in run_checks() if e.id == "durable_agents.E001"]
    assert any(says in m and kind in m for m in errors), errors


@pytest.mark.parametrize(
    "secret, says", [(None, "which is not set"), ("short", "too short"), ("ab" * 20, "too weak")]
)
def test_an_outbound_webhook_without_a_usable_secret_is_e008(settings, site_urls, secret, says):
    settings.OPS_SECRET = secret
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"BASE_URL": BASE, "CHANNELS": [HOOK]},
    }
    errors = [e.msg for e in run_checks() if e.id == "durable_agents.E008"]
    assert any(says in m and "'webhook'" in m for m in errors), errors
    settings.OPS_SECRET = "a-fine-long-secret-0123456789abcdefXYZ"
    assert not [e for e in run_checks() if e.id == "durable_agents.E008"]


def test_the_beat_schedule_has_the_delivery_pass_when_there_are_channels():
    plain = beat_schedule({"CELERY_QUEUE": "q"})
    assert all(e["task"] != NOTIFY_TASK for e in plain.values())
    entries = beat_schedule(
        {
            "CELERY_QUEUE": "q",
            "NOTIFY": {"BASE_URL": BASE, "CHANNELS": [{"kind": "email"}], "INTERVAL": 7},
        }
    )
    assert entries["durable-agents-notify"] == {
        "task": NOTIFY_TASK,
        "schedule": 7.0,
        "options": {"queue": "q", "expires": 7.0},
    }
    # The shorthand of 0.1 is an email channel too.
    shorthand = beat_schedule({"NOTIFY": {"APPROVALS": True, "BASE_URL": BASE}})
    assert "durable-agents-notify" in shorthand


# -- cost: the pass reads by index, whatever the history -----------------------------------

HISTORY = 5_000
TOUCHED = 500  # rows of one table a statement may touch: a tenth of the history
TABLES = (
    "durable_agents_run",
    "durable_agents_approvalrequest",
    "durable_agents_notification",
    "durable_agents_journalentry",
)


def _wide_reads(sql: str) -> list[str]:
    """The reads of ``sql`` that touch more than ``TOUCHED`` rows of a table (run for real,
    ``EXPLAIN ANALYZE``, with sequential scans off: the planner takes an index whenever one
    can serve): the rows a node returned plus those its filter threw away."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.replace("%", "%%"))
            found = cursor.fetchone()[0]
        finally:
            cursor.execute("RESET enable_seqscan")
    plan = (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]
    out, stack = [], [plan]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", ()))
        if node.get("Relation Name") not in TABLES:
            continue
        touched = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
        touched += node.get("Rows Removed by Filter", 0) + node.get(
            "Rows Removed by Index Recheck", 0
        )
        if node["Node Type"] == "Seq Scan" or touched > TOUCHED:
            out.append(f"{node['Node Type']} on {node['Relation Name']}: {touched} rows")
    return out


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_a_delivery_pass_reads_every_table_by_an_index(settings, receiver):
    """``HISTORY`` requests decided a month ago, each with its notifications sent: each of
    the pass's statements (the reconciling reads, the journal lookup, the claims) touches a
    few rows of each table, through an index, so its cost does not grow with them."""
    configure(settings, hook(receiver))
    make_user("ann", "approve_toolcall")
    with pytest.raises(da.ApprovalPending):
        gated.run("cost-pending", "refund order 7")
    with pytest.raises(da.ApprovalPending):
        gated.run("cost-decided", "refund order 7")
    da.approve("cost-decided", "call_1_1", True, by="ann")
    Notification.objects.filter(event="approval_decided").delete()  # a lost signal
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_agents_run (run_id, agent, status, usage, spend, turns, "
            "attempts, created_at, updated_at, finished_at) SELECT 'hist-' || g, 'gated', "
            "'finished', '{}', '{}', 1, 0, now() - interval '30 days', now(), now() "
            "FROM generate_series(1, %s) g",
            [HISTORY],
        )
        cursor.execute(
            "INSERT INTO durable_agents_approvalrequest (run_id, call_id, tool_name, arguments, "
            "policy, start_seq, status, created_at, decided_at) SELECT 'hist-' || g, 'c', "
            "'refund', '{}', '{}', 1, 'approved', now() - interval '30 days', "
            "now() - interval '30 days' FROM generate_series(1, %s) g",
            [HISTORY],
        )
        cursor.execute(
            "INSERT INTO durable_agents_notification (delivery_id, request_id, asked, event, "
            "channel, status, attempts, last_error, payload, created_at, sent_at) SELECT "
            "gen_random_uuid(), id, '', e, 'webhook', 'sent', 1, '', '{}', decided_at, "
            "decided_at FROM durable_agents_approvalrequest, (VALUES ('approval_requested'), "
            "('approval_decided')) AS v(e) WHERE run_id LIKE 'hist-%%'"
        )
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")
    with CaptureQueriesContext(connection) as captured:
        done = deliver()
    assert done.reconciled == 1 and done.sent == 3  # two waiting, one decided
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
    ]
    assert len(statements) >= 4  # pending, decided, their rows, the journal, the claims
    wide = {sql: found for sql in statements if (found := _wide_reads(sql))}
    assert not wide, json.dumps(wide, indent=1)
