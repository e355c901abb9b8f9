"""Issue 14, tell people: ``DURABLE_AGENTS["NOTIFY"]`` emails the eligible approvers of a call
that starts waiting, with a link to its approval page (Django's locmem mail backend). Since
issue 42 the email goes through the notification outbox: a delivery pass sends it."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core import mail
from django.core.checks import run_checks

import durable_agents as da
from durable_agents.conf import parse
from durable_agents.models import ApprovalRequest, Notification
from durable_agents.notifications import deliver
from tests.support.agents import gated, quorum
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://ops.example.com"


@pytest.fixture
def notify(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "site@example.com"
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"APPROVALS": True, "BASE_URL": BASE + "/", "FROM_EMAIL": "ops@example.com"},
    }
    mail.outbox.clear()
    return settings


def _with_email(user: User, address: str) -> User:
    user.email = address
    user.save()
    return user


def _people() -> None:
    _with_email(make_user("ann", "approve_toolcall"), "ann@example.com")
    _with_email(make_user("bob", "view_approvalrequest"), "bob@example.com")  # may only look
    _with_email(make_user("carol", groups=("approvers",)), "carol@example.com")
    from django.contrib.auth.models import Group

    from tests.support.people import perm

    Group.objects.get(name="approvers").permissions.add(perm("approve_toolcall"))
    _with_email(make_user("root", superuser=True), "root@example.com")
    dave = _with_email(make_user("dave", "approve_toolcall"), "dave@example.com")
    dave.is_active = False
    dave.save()
    make_user("eve", "approve_toolcall")  # no address


def test_each_eligible_approver_gets_one_email_with_a_link_to_the_approval_page(notify):
    _people()
    with pytest.raises(da.ApprovalPending):
        gated.run("mail-1", "refund order 7")
    assert mail.outbox == []  # the run never waits for a mail server
    assert deliver().sent == 1
    request = ApprovalRequest.objects.get(run_id="mail-1")
    link = f"{BASE}/admin/durable_agents/approvalrequest/{request.pk}/change/"
    assert sorted(m.to[0] for m in mail.outbox) == [
        "ann@example.com",
        "carol@example.com",
        "root@example.com",
    ]
    for message in mail.outbox:
        assert len(message.to) == 1 and not message.cc and not message.bcc
        assert message.from_email == "ops@example.com"
        assert message.subject == "Approval needed: Refund 5.00 to order 7 (run mail-1)"
        assert link in message.body
        assert "Tool: refund" in message.body and "Refund an order" in message.body
        assert "Cents: 500" in message.body
    # Deciding follows the link: the page is there.
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username="ann"))
    assert client.get(link.removeprefix(BASE)).status_code == 200

    # A resume asks nothing new, and a second pass has nothing to send: no email again.
    with pytest.raises(da.ApprovalPending):
        da.resume("mail-1")
    assert deliver().sent == 0
    assert len(mail.outbox) == 3
    assert Notification.objects.get().status == Notification.SENT


def test_a_quorum_call_is_sent_to_its_groups_eligible_members_only(notify):
    _with_email(make_user("fin1", "approve_toolcall", groups=("finance",)), "fin1@example.com")
    _with_email(make_user("fin2", groups=("finance",)), "fin2@example.com")  # no permission
    _with_email(make_user("ops1", "approve_toolcall"), "ops1@example.com")  # not in finance
    with pytest.raises(da.ApprovalPending):
        quorum.run("mail-q", "pay inv-1")
    deliver()
    assert [m.to for m in mail.outbox] == [["fin1@example.com"]]
    assert "needs 2 approvals from group finance" in mail.outbox[0].body


def test_no_email_unless_approvals_are_turned_on(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    mail.outbox.clear()
    _with_email(make_user("ann", "approve_toolcall"), "ann@example.com")
    with pytest.raises(da.ApprovalPending):
        gated.run("mail-off", "refund order 7")
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"APPROVALS": False, "BASE_URL": BASE},
    }
    with pytest.raises(da.ApprovalPending):
        gated.run("mail-off-2", "refund order 7")
    deliver()
    assert mail.outbox == []
    assert not Notification.objects.exists()


def test_the_default_sender_is_default_from_email(notify):
    notify.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {"APPROVALS": True, "BASE_URL": BASE},
    }
    _with_email(make_user("ann", "approve_toolcall"), "ann@example.com")
    with pytest.raises(da.ApprovalPending):
        gated.run("mail-from", "refund order 7")
    deliver()
    assert [m.from_email for m in mail.outbox] == ["site@example.com"]


@pytest.mark.parametrize(
    "value, says",
    [
        ("yes", "must be a dict"),
        ({"APPROVAL": True}, "did you mean 'APPROVALS'"),
        ({"APPROVALS": "yes", "BASE_URL": BASE}, "must be True or False"),
        ({"APPROVALS": True}, "needs 'BASE_URL'"),
        ({"APPROVALS": True, "BASE_URL": "ops.example.com"}, "absolute address"),
        ({"APPROVALS": True, "BASE_URL": BASE, "FROM_EMAIL": "ops"}, "email address"),
    ],
)
def test_a_bad_notify_value_is_a_system_check_error(settings, value, says):
    assert says in " ".join(parse({"NOTIFY": value})[1])
    settings.DURABLE_AGENTS = {**django_settings.DURABLE_AGENTS, "NOTIFY": value}
    errors = [e for e in run_checks() if e.id == "durable_agents.E001"]
    assert errors and any(says in e.msg for e in errors)
