"""The built-in ``"email"`` channel: the eligible approvers of the call, each in a message
of their own, through Django's mail framework (``EMAIL_BACKEND``).

Who: active users holding ``approve_toolcall`` (directly, through a group, or as
superusers) with an email address — for a policy naming a group, only its members, and
once the request escalated, the escalation group's members too
(``engine.approvals.deciding_groups``). A reminder or an escalation skips those who have
voted already. Nobody to write to is a failure given up at once (the admin lists it): the
call still waits in the inbox, and someone should know nobody was told.

At least once per recipient: a send that fails halfway (the SMTP server dropped the
connection after some messages) is tried again whole, so some approvers may get it twice.
"""

from __future__ import annotations

from typing import Any

from django.core import mail

from ..conf import ChannelConfig, get_settings
from ..engine import events
from ..engine.approvals import deciding_groups
from .channels import DeliveryFailed, Notice
from .payloads import decided_by, tool_of


class EmailChannel:
    def __init__(self, config: ChannelConfig) -> None:
        self.config = config

    def send(self, notice: Notice) -> None:
        payload = notice.payload
        addresses, approvals = recipients(notice)
        if not addresses:
            raise DeliveryFailed(
                f"no eligible approver of call {notice.call_id} in run {notice.run_id} has an "
                "email address: nobody was told (give approvers an address, then Retry)",
                retry=False,
            )
        subject, body = message(payload, approvals)
        sender = get_settings().notify.from_email
        messages = [mail.EmailMessage(subject, body, sender, [a]) for a in addresses]
        mail.get_connection().send_messages(messages)


def recipients(notice: Notice) -> tuple[list[str], int]:
    """The addresses to write to, and how many approvals the call has so far (for a
    reminder or an escalation; 0 otherwise)."""
    from ..models import Decision
    from ..people import approvers

    policy = notice.payload.get("policy") or {}
    groups: tuple[str | None, ...] = deciding_groups(policy) or (None,)
    users: dict[str, str] = {}
    for group in groups:
        for user in approvers(group).exclude(email=""):
            users[user.get_username()] = user.email
    approvals = 0
    if notice.event in (events.APPROVAL_REMINDED, events.APPROVAL_ESCALATED):
        # Who voted on a quorum already needs no reminder.
        votes = Decision.objects.filter(
            request__run_id=notice.run_id, request__call_id=notice.call_id
        ).values_list("approver", "approved")
        for approver, approved in votes:
            users.pop(approver, None)
            approvals += approved
    users.update(_deputies(users, str(notice.payload.get("tool") or ""), policy))
    return sorted({email for email in users.values() if email}), approvals


def _deputies(users: dict[str, str], tool: str, policy: Any) -> dict[str, str]:
    """The addresses of the deputies in force now for ``users`` on this call: an approver
    who is away is told through the person deciding for them (``engine.delegation``)."""
    from django.contrib.auth import get_user_model

    from ..database.delegations import in_force_now, to_domain
    from ..models import Delegation

    groups = deciding_groups(policy)
    rows = Delegation.objects.filter(in_force_now(), approver__in=list(users))
    wanted = {d.deputy for d in rows if to_domain(d).covers(tool, groups)} - set(users)
    if not wanted:
        return {}
    User = get_user_model()
    found = User._default_manager.filter(
        **{f"{User.USERNAME_FIELD}__in": wanted}, is_active=True
    ).exclude(email="")
    return {u.get_username(): u.email for u in found}


_SUBJECTS = {
    events.APPROVAL_REQUESTED: "Approval needed",
    events.APPROVAL_REMINDED: "Reminder: approval needed",
    events.APPROVAL_ESCALATED: "Escalated: approval needed",
    events.APPROVAL_EXPIRED: "Expired without a decision",
}


def message(payload: Any, approvals: int = 0) -> tuple[str, str]:
    """The subject and body of ``payload``'s email (``approvals``: so far)."""
    from ..admin.readable import fields_of, policy_words

    event = payload.get("event")
    what = payload.get("summary") or payload.get("tool")
    run_id = payload.get("run_id")
    agent = payload.get("agent") or "unknown agent"
    if event == events.APPROVAL_DECIDED:
        verb = {"approve": "Approved", "edit": "Approved with edits", "deny": "Denied"}
        head = f"{verb.get(payload.get('decision'), 'Decided')} by {decided_by(payload)}"
    else:
        head = _SUBJECTS.get(event, "Approval")
    # A header cannot hold a line break: the summary is the tool's own text.
    subject = " ".join(f"{head}: {what} (run {run_id})".split())[:200]
    call = f"call {payload.get('call_id')}"
    opening = {
        events.APPROVAL_REQUESTED: f"Run {run_id} ({agent}) waits for a decision on {call}:",
        events.APPROVAL_REMINDED: f"Run {run_id} ({agent}) still waits for a decision on {call}:",
        events.APPROVAL_ESCALATED: (
            f"Run {run_id} ({agent}) still waits for a decision on {call}; members of "
            f"{payload.get('escalated_to')} may decide it now too:"
        ),
        events.APPROVAL_EXPIRED: (
            f"Nobody decided {call} of run {run_id} ({agent}) in time; it expired "
            f"({payload.get('on_expiry') or 'deny'}):"
        ),
    }.get(event, f"{head}: {call} of run {run_id} ({agent}):")
    tool = tool_of(str(payload.get("agent") or ""), str(payload.get("tool") or ""))
    lines = [opening, "", f"  {what}", "", f"Tool: {payload.get('tool')}"]
    description = str(getattr(tool, "description", None) or "")
    if description:
        lines.append(f"  {description}")
    for title, value in fields_of(tool, payload.get("arguments")):
        lines.append(f"{title}: {value}")
    if payload.get("asked_again"):
        lines.append("(asked again: it was approved before with other arguments)")
    if event == events.APPROVAL_DECIDED:
        if payload.get("note"):
            lines += ["", f"Note: {payload['note']}"]
        lines += ["", f"See it here: {payload.get('link')}", ""]
    elif event == events.APPROVAL_EXPIRED:
        lines += ["", f"See it here: {payload.get('link')}", ""]
    else:
        policy = payload.get("policy") or {}
        lines += [
            "",
            f"Policy: {policy_words(policy, approvals)}",
            "",
            f"Decide it here: {payload.get('link')}",
            "",
        ]
    return subject, "\n".join(lines)
