"""What a notification says: the JSON payload every channel is handed, rendered once when
its outbox row is written and kept on the row (so every try sends the same thing).

``{event, delivery_id, run_id, agent, call_id, tool, summary, arguments, policy, rule,
link, at}`` and, by event: ``step`` (``remind``, ``escalate``, ``expire``), ``escalated_to``,
``on_expiry``; for a decision ``decision`` (``approve``, ``edit``, ``deny``), ``approved``,
``by``, ``note`` and, for an edit, ``original_arguments``. ``text`` (one line a person
reads) when the channel asks for it. ``arguments`` are the tool's validated arguments with
the values of its ``sensitive=[...]`` fields replaced by ``"[sensitive]"``: the link opens
the call's page, where staff see them whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.urls import NoReverseMatch, reverse

from ..conf import ChannelConfig
from ..engine import events
from ..engine.errors import DurableAgentsError
from ..engine.registry import get_agent

log = logging.getLogger("durable_agents.notifications")

SENSITIVE = "[sensitive]"
TEXT_LIMIT = 600  # characters of the one-line text (Slack cuts a message far later)


def link_to(base_url: str, request_pk: int) -> str:
    """The call's page in the admin, absolute: where its card, decision bar and whole
    arguments are (the inbox card is gone once the call is decided; this page stays)."""
    try:
        path = reverse("admin:durable_agents_approvalrequest_change", args=[request_pk])
    except NoReverseMatch:  # a site without the admin mounted: its address at least
        path = "/"
    return base_url + path


def tool_of(agent: str, tool_name: str) -> Any:
    try:
        return get_agent(agent).tools.get(tool_name)
    except DurableAgentsError:
        return None


def summary_of(tool: Any, arguments: Any) -> str | None:
    from ..admin.readable import summary_of as readable_summary

    return readable_summary(tool, arguments) if tool is not None else None


def shown_arguments(tool: Any, arguments: Any) -> Any:
    """``arguments`` with the tool's sensitive fields' values replaced."""
    hidden = set(getattr(tool, "sensitive", ()) or ())
    if not hidden or not isinstance(arguments, Mapping):
        return arguments
    return {k: (SENSITIVE if k in hidden else v) for k, v in arguments.items()}


def iso(moment: Any) -> str | None:
    if isinstance(moment, datetime):
        return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(moment, int | float):  # milliseconds since the epoch (journal records)
        return iso(datetime.fromtimestamp(moment / 1000, tz=UTC))
    return None


def render(
    event: str,
    request: Any,
    *,
    agent: str,
    delivery_id: str,
    base_url: str,
    channel: ChannelConfig,
    details: Mapping[str, Any] | None = None,
    at: Any = None,
) -> dict[str, Any]:
    """The payload of ``event`` about the approval request row ``request`` for ``channel``.
    ``details`` are the fact's (a signal's keyword arguments, or what the journal holds)."""
    details = dict(details or {})
    tool = tool_of(agent, request.tool_name)
    policy = details.get("policy") or request.policy or {}
    payload: dict[str, Any] = {
        "event": event,
        "delivery_id": delivery_id,
        "run_id": request.run_id,
        "agent": agent,
        "call_id": request.call_id,
        "tool": request.tool_name,
        "summary": summary_of(tool, request.arguments),
        "arguments": shown_arguments(tool, request.arguments),
        "policy": policy,
        # The rule that asked (``da.Rules``): the fact's, else the one the request names.
        "rule": details.get("rule") or policy.get("rule"),
        "link": link_to(base_url, request.pk),
        "at": iso(at) or iso(datetime.now(UTC)),
    }
    if request.previous_arguments is not None:
        payload["asked_again"] = True
    step = details.get("step")
    if step:
        payload["step"] = step
    if event == events.APPROVAL_ESCALATED:
        payload["escalated_to"] = details.get("escalated_to") or policy.get("escalated_to")
    if event == events.APPROVAL_EXPIRED:
        payload["on_expiry"] = details.get("on_expiry") or (policy.get("deadline") or {}).get(
            "on_expiry"
        )
    if event == events.APPROVAL_DECIDED:
        approved = bool(details.get("approved"))
        payload.update(
            decision=details.get("decision") or ("approve" if approved else "deny"),
            approved=approved,
            by=details.get("by") or "",
            note=details.get("note") or "",
        )
        if details.get("deputy"):  # a deputy decided for ``by`` (engine.delegation)
            payload["deputy"] = details["deputy"]
        if details.get("decision") == "edit":
            payload["arguments"] = shown_arguments(tool, details.get("arguments"))
            payload["original_arguments"] = shown_arguments(tool, request.arguments)
    if channel.text:
        payload["text"] = text_of(payload)
    return payload


def decided_details(record: Mapping[str, Any]) -> dict[str, Any]:
    """A decision's details as the ``approval_decided`` signal gives them, from its journal
    record (``approval:<call>``): for the reconciling pass, which has no signal."""
    approved = bool(record.get("approved"))
    edited = (record.get("edited") or {}).get("arguments")
    out: dict[str, Any] = {
        "decision": ("edit" if edited is not None else "approve") if approved else "deny",
        "approved": approved,
        "by": record.get("by") or "",
        "note": record.get("note") or "",
    }
    if record.get("deputy"):
        out["deputy"] = record.get("deputy")
    if edited is not None:
        out["arguments"] = edited
    return out


def decided_by(payload: Mapping[str, Any]) -> str:
    """Who decided, as people read it: ``"leo for lena"`` when a deputy did."""
    deputy = payload.get("deputy")
    return f"{deputy} for {payload.get('by')}" if deputy else str(payload.get("by") or "")


def text_of(payload: Mapping[str, Any]) -> str:
    """One line a person reads in a chat: what happened, to what, and the link."""
    what = payload.get("summary") or payload.get("tool")
    where = f"run {payload.get('run_id')}, {payload.get('agent') or 'unknown agent'}"
    event = payload.get("event")
    if event == events.APPROVAL_REQUESTED:
        head = f"Approval needed: {what}"
    elif event == events.APPROVAL_REMINDED:
        head = f"Reminder, still waiting for approval: {what}"
    elif event == events.APPROVAL_ESCALATED:
        head = f"Escalated to {payload.get('escalated_to') or 'more approvers'}: {what}"
    elif event == events.APPROVAL_EXPIRED:
        head = f"Expired, nobody decided in time: {what}"
    else:
        verb = {"approve": "Approved", "edit": "Approved with edits", "deny": "Denied"}
        said = verb.get(str(payload.get("decision")), "Decided")
        head = f"{said} by {decided_by(payload)}: {what}"
        if payload.get("note"):
            head += f" ({payload['note']})"
    line = " ".join(f"{head} [{where}]".split())  # one line, whatever the summary held
    if len(line) > TEXT_LIMIT:
        line = line[: TEXT_LIMIT - 1] + "…"
    return f"{line} {payload.get('link')}"
