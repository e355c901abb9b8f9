"""A gated call as an approver reads it: the tool's own one-line summary, else its arguments
as fields titled from the tool's JSON schema; the approval policy in words. Raw JSON stays on
the page behind a toggle, so nothing here has to be complete, only never wrong or failing."""

from __future__ import annotations

import json
import logging
from typing import Any

from ..engine.errors import DurableAgentsError
from ..engine.registry import get_agent
from ..engine.transcript import RunState
from ..engine.views import canonical
from .pretty import pretty_text
from .rendered import identifying_of, render

log = logging.getLogger(__name__)


def tool_of(obj: Any) -> Any:
    """The tool of a call (an approval request or a halt) as loaded here, or None (its
    agent or tool is gone from the code)."""
    try:
        return get_agent(obj.run.agent).tools.get(obj.tool_name)
    except DurableAgentsError:
        return None


_CLASS_WORDS = {
    "read_only": "read-only (re-run after a crash)",
    "idempotent": "idempotent (re-run after a crash, with its idempotency key)",
    "side_effect": "a side effect (at most once; a crash mid-call halts)",
}
_CLASS_FROM = {
    "override": "set by this site",
    "annotations": "from the server's trusted annotations",
    "default": "the default for a server's tools",
}


def origin_of(tool: Any) -> str:
    """Where a tool comes from when it is not this site's Python (an MCP server's), in
    words: the server, the remote tool, what it declares and the class this site runs it
    as; "" for a Python tool."""
    origin = getattr(tool, "origin", None)
    if not isinstance(origin, dict) or origin.get("kind") != "mcp":
        return ""
    declared = origin.get("annotations") or {}
    hints = ", ".join(f"{k}={v}" for k, v in declared.items() if k.endswith("Hint")) or "none"
    trusted = "trusted" if origin.get("trusted") else "not trusted"
    return (
        f"MCP server {origin.get('server')} ({origin.get('transport')}), tool "
        f"{origin.get('remote_tool')}; declares {hints} ({trusted}); runs as "
        f"{_CLASS_WORDS.get(origin.get('class', ''), origin.get('class'))}, "
        f"{_CLASS_FROM.get(origin.get('class_from', ''), '')}"
        + (
            "; the server runs it as a task (its id is journaled; a resume polls it)"
            if origin.get("as_task")
            else ""
        )
    )


def summary_of(tool: Any, arguments: Any) -> str | None:
    """The tool's ``summary=`` reading of the call, or None (no summary, or one that failed
    or did not return a non-empty string: the page falls back to the fields, never a 500)."""
    fn = getattr(tool, "summary", None)
    if fn is None or not isinstance(arguments, dict):
        return None
    try:
        text = fn(dict(arguments))
    except Exception:
        log.warning("summary of tool %s failed; showing its fields", tool.name, exc_info=True)
        return None
    return text.strip() or None if isinstance(text, str) else None


def fields_of(tool: Any, arguments: Any) -> list[tuple[str, str]]:
    """``[(title, value)]``: each argument under its schema title (or its name made readable),
    those the tool names as identifying the call first, then the schema's order, then any
    the schema does not know."""
    if not isinstance(arguments, dict):
        return []
    props = ((getattr(tool, "parameters", None) or {}).get("properties")) or {}
    first = [k for k in getattr(tool, "identifying", ()) or () if k in arguments]
    order = first + [k for k in props if k in arguments and k not in first]
    order += [k for k in arguments if k not in order]
    out = []
    for key in order:
        spec = props.get(key) or {}
        title = spec.get("title") if isinstance(spec, dict) else None
        value = arguments[key]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        out.append((str(title or key.replace("_", " ").capitalize()), text))
    return out


def policy_words(policy: Any, approvals: int) -> str:
    """``"needs 2 approvals from group finance: 1 of 2 so far"``, ``"needs one approval from
    group support-leads: …"`` or ``"needs one approval: 0 of 1 so far"``."""
    policy = policy if isinstance(policy, dict) else {}
    group = f" from group {policy.get('group')}" if policy.get("group") else ""
    if policy.get("kind") == "quorum":
        need = int(policy.get("need", 1))
        return (
            f"needs {need} approval{'s' if need != 1 else ''}{group}: {approvals} of {need} so far"
        )
    return f"needs one approval{group}: {approvals} of 1 so far"


def edit_changes(tool: Any, arguments: Any, edited: Any) -> list[dict[str, Any]]:
    """What an edit changes, argument by argument, each drawn as the fields are (whole) with
    what it was: ``[{"field", "was"}]``, ``was`` None for an argument the edit added; an
    argument it left out is listed with ``removed``."""
    if not isinstance(arguments, dict) or not isinstance(edited, dict):
        return []
    changed = [
        k for k in edited if k not in arguments or canonical(edited[k]) != canonical(arguments[k])
    ]
    gone = [k for k in arguments if k not in edited]
    schema, first = getattr(tool, "parameters", None), identifying_of(tool)
    now = render(schema, {k: edited[k] for k in changed}, whole=True, first=first).fields
    before = render(
        schema, {k: arguments[k] for k in changed + gone if k in arguments}, whole=True, first=first
    ).fields
    was = {f.key: f for f in before}
    return [{"field": f, "was": was.get(f.key), "removed": False} for f in now] + [
        {"field": was[k], "was": None, "removed": True} for k in gone if k in was
    ]


def conversation(records: Any, call_id: str) -> list[dict[str, Any]]:
    """The run's transcript as the model saw it when it asked for call ``call_id``, built
    from the journal alone (``RunState.messages``): the input (and a session's earlier
    messages), each model turn's text and tool calls, and each earlier call's result. One
    dict per message; the template escapes every text."""
    labels = {"user": "input", "assistant": "model", "tool": "tool result", "system": "system"}
    out = []
    for m in RunState.of(records).messages():
        out.append(
            {
                "role": m.role,
                "label": labels.get(m.role, m.role),
                "text": pretty_text(m.content) if m.role == "tool" else m.content,
                "calls": [
                    {
                        "id": c.id,
                        "name": c.name,
                        "arguments": pretty_text(c.arguments),
                        "this": c.id == call_id,
                    }
                    for c in m.tool_calls
                ],
                "call_id": m.tool_call_id,
                "name": m.name,
                "is_error": m.is_error,
            }
        )
    return out


def stated_reason(records: Any, call_id: str) -> str:
    """What the model wrote in the turn that asked for ``call_id`` (may be empty): why it
    asks, in its own words, for the person deciding."""
    for turn in RunState.of(records).turns:
        message = RunState.assistant(turn)
        if any(c.id == call_id for c in message.tool_calls):
            return message.content.strip()
    return ""
