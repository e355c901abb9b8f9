"""The run page's journal, for people: each record as a plain dict a template prints without
logic, and what the journal says about the agent the run started under (its fingerprint)
and any drift since.

Read-only: built from records already read, it never queries on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ..engine import names
from ..engine.errors import DurableAgentsError
from ..engine.records import Record


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept as itself."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def pretty_text(text: Any) -> str:
    """A JSON text (tool call arguments are sent as text) pretty-printed, or as it is."""
    if not isinstance(text, str):
        return pretty(text)
    try:
        return pretty(json.loads(text))
    except ValueError:
        return text


def _ms(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if isinstance(value, int | float) else None


def _entry(rec: Record, kind: str, title: str, **extra: Any) -> dict[str, Any]:
    return {
        "seq": rec.seq,
        "name": rec.name,
        "at": rec.created_at,
        "kind": kind,
        "title": title,
        "meta": extra.pop("meta", []),
        "text": extra.pop("text", None),
        "calls": extra.pop("calls", []),
        "sections": [{"label": k, "json": v} for k, v in extra.pop("sections", [])],
        "step": extra.pop("step", None),  # a step a fork can start from
    }


def _usage(usage: Any) -> str:
    if not isinstance(usage, dict):
        return ""
    return f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"


def _describe(rec: Record) -> dict[str, Any]:
    name, body = rec.name, rec.body
    if name == names.HEADER:
        return _entry(rec, "meta", f"Journal opened (format {body.get('format')})")
    if name == names.RUN_START:
        value = body.get("input")
        return _entry(
            rec,
            "start",
            f"Run started by agent {body.get('agent')!r}",
            text=value if isinstance(value, str) else None,
            sections=[] if isinstance(value, str) else [("input", pretty(value))],
            step=0,
        )
    if name.startswith(names.MODEL):
        message = body.get("message") or {}
        calls = [
            {
                "id": c.get("id"),
                "name": c.get("name"),
                "arguments": pretty_text(c.get("arguments")),
            }
            for c in message.get("tool_calls") or ()
        ]
        meta = [f"model {body.get('model')}", f"finish {body.get('finish')}"]
        meta.append(_usage(body.get("usage")))
        return _entry(
            rec,
            "model",
            f"Model turn {name[len(names.MODEL) :]}",
            text=message.get("content") or None,
            calls=calls,
            meta=meta,
            step=int(name[len(names.MODEL) :]),
        )
    if name.startswith((names.ATTEMPT, names.NOT_STARTED)):
        prefix, rest = name.split(":", 1)
        call, _, k = rest.rpartition(":")
        if prefix + ":" == names.ATTEMPT:
            at = _ms(body.get("attempted_at"))
            meta = [f"tool {body.get('tool')}"] + (
                [f"attempted at {at:%Y-%m-%d %H:%M:%S}"] if at else []
            )
            return _entry(rec, "attempt", f"Attempt {k} of call {call} claimed", meta=meta)
        return _entry(rec, "attempt", f"Attempt {k} of call {call} never started")
    if name.startswith(names.TOOL):
        flags = ["error"] if body.get("is_error") else ["ok"]
        if body.get("read_only"):
            flags.append("read-only")
        if body.get("patched"):
            flags.append("patched in a fork")
        sections = [("result", pretty(body.get("result")))]
        if body.get("reconciled"):
            flags.append(f"outcome recorded by {body.get('by') or 'a person'}")
            if body.get("evidence") is not None:
                sections.append(("evidence", pretty(body.get("evidence"))))
        return _entry(
            rec,
            "tool-error" if body.get("is_error") else "tool",
            f"Result of call {name[len(names.TOOL) :]} ({body.get('name')})",
            meta=flags,
            sections=sections,
        )
    if name.startswith(names.APPROVAL):
        verdict = "approved" if body.get("approved") else "denied"
        tally = body.get("tally") or {}
        meta = [f"need {tally.get('need', 1)}"]
        if tally.get("approved_by"):
            meta.append("approved by " + ", ".join(tally["approved_by"]))
        if tally.get("denied_by"):
            meta.append("denied by " + ", ".join(tally["denied_by"]))
        return _entry(
            rec,
            "approval" if body.get("approved") else "denial",
            f"Call {name[len(names.APPROVAL) :]} {verdict} by {body.get('by')}",
            text=body.get("note") or None,
            meta=meta,
            sections=[("tally", pretty(tally))],
        )
    if name == names.RUN_COMPLETE:
        meta = [f"{body.get('turns')} turns", _usage(body.get("spend") or body.get("usage"))]
        return _entry(rec, "complete", "Run finished", text=body.get("answer"), meta=meta)
    if name == names.RUN_CANCELLED:
        return _entry(
            rec, "cancelled", f"Run cancelled by {body.get('by')}", text=body.get("reason") or None
        )
    if name == names.FORK:
        return _entry(
            rec,
            "fork",
            f"Forked from run {body.get('source')!r} at step {body.get('step')}",
            sections=[("patch", pretty(body.get("patch")))],
        )
    if name.startswith(names.DRIFT):
        return _entry(
            rec,
            "drift",
            "Resumed under a changed agent",
            sections=[("changes", pretty(body.get("changes")))],
        )
    if name.startswith(names.SPEND):
        return _entry(
            rec,
            "meta",
            f"Model spend without a turn ({body.get('why')})",
            meta=[_usage(body.get("usage"))],
        )
    if name.startswith(names.USER):
        texts = [body.get("text"), *(body.get("then") or ())]
        shown = "\n\n".join(t if isinstance(t, str) else pretty(t) for t in texts)
        title = "User message" if len(texts) == 1 else f"User messages ({len(texts)})"
        return _entry(rec, "start", title, text=shown)
    if name.startswith(names.STEP):
        return _entry(
            rec,
            "meta",
            f"Step {name[len(names.STEP) :]}",
            sections=[("value", pretty(body.get("value")))],
        )
    return _entry(rec, "meta", name, sections=[("record", pretty(body))])


def build_timeline(records: Iterable[Record]) -> list[dict[str, Any]]:
    """The journal as a list of plain dicts a template can print without logic."""
    out = []
    for rec in records:
        try:
            out.append(_describe(rec))
        except (DurableAgentsError, AttributeError, KeyError, TypeError, ValueError) as exc:
            # An unreadable or oddly shaped record is shown as such; the page still renders.
            out.append(_entry(rec, "tool-error", f"{rec.name}: unreadable", text=str(exc)))
    return out


def _change_lines(changes: Any) -> list[str]:
    """A drift record's ``changes`` as sentences."""
    if not isinstance(changes, dict):
        return [pretty(changes)]
    lines = []
    if "model" in changes:
        pair = changes["model"] if isinstance(changes["model"], list) else [None, None]
        lines.append(f"model {' → '.join(map(str, pair))}")
    for key, label in (
        ("tools_added", "tools added"),
        ("tools_removed", "tools removed"),
        ("tools_changed", "tools changed (description or parameters)"),
    ):
        if changes.get(key):
            lines.append(f"{label}: {', '.join(map(str, changes[key]))}")
    if changes.get("instructions"):
        lines.append("instructions changed")
    known = {"model", "tools_added", "tools_removed", "tools_changed", "instructions"}
    lines += [f"{k}: {pretty(v)}" for k, v in changes.items() if k not in known]
    return lines


def agent_drift(records: Iterable[Record], fallback: Any = None) -> dict[str, Any]:
    """The fingerprint ``run:start`` recorded (``fallback`` when there is none) and every
    ``@drift/`` record: when the run resumed under a changed agent, and what changed."""
    fingerprint, drifts = None, []
    for rec in records:
        if rec.name == names.RUN_START and isinstance(rec.body.get("fingerprint"), dict):
            fingerprint = rec.body["fingerprint"]
        elif rec.name.startswith("@drift/"):
            to = rec.body.get("to")
            drifts.append(
                {
                    "seq": rec.seq,
                    "at": rec.created_at,
                    "hash": to.get("hash") if isinstance(to, dict) else rec.name[7:],
                    "changes": _change_lines(rec.body.get("changes")),
                }
            )
    fingerprint = fingerprint if fingerprint is not None else fallback
    tools = fingerprint.get("tools") if isinstance(fingerprint, dict) else None
    return {
        "fingerprint": fingerprint if isinstance(fingerprint, dict) else None,
        "fingerprint_tools": sorted(tools.items()) if isinstance(tools, dict) else [],
        "drifts": drifts,
    }
