"""The built-in notification: email the people who may decide a gated call when it starts
waiting, with a link to its approval page (``DURABLE_AGENTS["NOTIFY"]``).

Who is told: the *eligible approvers* of the call — active users holding the approve
permission (directly, through a group, or as superusers), and, when the call's policy is a
quorum of a group, only that group's members; users without an email address are skipped.
Each gets an email of their own (no one learns who else was asked). It is a receiver of
``signals.approval_requested``: sent after commit, once per request, by the process that
asked (a worker), through Django's mail framework (``EMAIL_BACKEND``). A failed send is
logged and the run goes on; the approval queue in the admin still lists the call.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core import mail
from django.urls import reverse

from .conf import get_settings
from .engine.approvals import deciding_groups

log = logging.getLogger("durable_agents")


def email_approvers(sender: Any, *, run_id: str, call_id: str, **details: Any) -> None:
    """``approval_requested`` receiver: the email, if ``NOTIFY["APPROVALS"]`` is on."""
    notify = get_settings().notify
    if not notify.approvals:
        return
    from .models import ApprovalRequest
    from .people import approvers

    request = ApprovalRequest.objects.filter(run_id=run_id, call_id=call_id).first()
    if request is None:  # deleted, or replaced, since
        return
    policy = details.get("policy") or {}
    groups = deciding_groups(policy) or (None,)
    addresses = sorted(
        {
            u.email
            for group in groups
            for u in approvers(group).exclude(email="").only("email")
            if u.email
        }
    )
    if not addresses:
        log.warning(
            "run %s: call %s awaits approval, but no eligible approver has an email address",
            run_id,
            call_id,
        )
        return
    link = notify.base_url + reverse(
        "admin:durable_agents_approvalrequest_change", args=[request.pk]
    )
    subject, body = _message(request, details, link, policy)
    messages = [
        mail.EmailMessage(subject, body, notify.from_email, [address]) for address in addresses
    ]
    mail.get_connection().send_messages(messages)


def _message(request: Any, details: dict[str, Any], link: str, policy: Any) -> tuple[str, str]:
    from .admin.readable import fields_of, policy_words, summary_of

    tool = _tool(details.get("agent") or "", request.tool_name)
    summary = summary_of(tool, request.arguments) if tool is not None else None
    what = summary or f"{request.tool_name}"
    # A header cannot hold a line break: the summary is the tool's own text.
    subject = " ".join(f"Approval needed: {what} (run {request.run_id})".split())[:200]
    lines = [
        f"Run {request.run_id} ({details.get('agent') or 'unknown agent'}) waits for a "
        f"decision on call {request.call_id}:",
        "",
        f"  {what}",
        "",
        f"Tool: {request.tool_name}",
    ]
    description = str(getattr(tool, "description", None) or "")
    if description:
        lines.append(f"  {description}")
    for title, value in fields_of(tool, request.arguments):
        lines.append(f"{title}: {value}")
    if request.previous_arguments is not None:
        lines.append("(asked again: it was approved before with other arguments)")
    lines += ["", f"Policy: {policy_words(policy, 0)}", "", f"Decide it here: {link}", ""]
    return subject, "\n".join(lines)


def _tool(agent: str, name: str) -> Any:
    from .engine.errors import DurableAgentsError
    from .engine.registry import get_agent

    try:
        return get_agent(agent).tools.get(name)
    except DurableAgentsError:
        return None
