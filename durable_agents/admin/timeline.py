"""The run page's journal, for people: each record as a plain dict a template prints without
logic, and what the journal says about the agent the run started under (its fingerprint)
and any drift since.

Read-only: built from records already read, it never queries on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from ..engine.errors import DurableAgentsError
from ..engine.ports import HALT_ORPHANED, HALT_RESOLVED
from ..engine.transcript import RunState, ToolResult
from ..engine.views import Drift, Entry, Record, Start, kind_of, read
from .pretty import pretty, pretty_text
from .rule_records import RuleLog


def _ms(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if isinstance(value, int | float) else None


# Records the engine keeps for itself (the journal's header, a fork's "copied" mark, spend
# without a turn, late evidence): shown, but styled as internal.
INTERNAL = "internal"


def _entry(rec: Record, kind: str, title: str, **extra: Any) -> dict[str, Any]:
    return {
        "seq": rec.seq,
        "number": None,  # the record's place in this run's journal (build_timeline)
        "name": rec.name,
        "at": rec.created_at,
        "kind": kind,
        "internal": extra.pop("internal", False),
        "title": title,
        "meta": extra.pop("meta", []),
        "text": extra.pop("text", None),
        "calls": extra.pop("calls", []),
        "sections": [{"label": k, "json": v} for k, v in extra.pop("sections", [])],
        "step": extra.pop("step", None),  # a step a fork can start from
        "run_link": extra.pop("run_link", None),  # a run the entry names (a sub-run)
        "raw": pretty(rec.body) if isinstance(rec.body, dict) else None,
    }


def _usage(usage: Any) -> str:
    if not isinstance(usage, dict):
        return ""
    return f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"


def _header(e: Entry) -> dict[str, Any]:
    rec = e.record
    return _entry(rec, INTERNAL, f"Journal opened (format {rec.body.get('format')})", internal=True)


def _fork_done(e: Entry) -> dict[str, Any]:
    return _entry(
        e.record, INTERNAL, "Fork completely copied: from here it may be driven", internal=True
    )


def _late(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    return _entry(
        rec,
        "takeover",
        f"Call {body.get('call_id')} ({body.get('tool')}) settled after its driver lost "
        "the run to another",
        meta=[
            f"attempt {body.get('attempt')}",
            f"outcome {body.get('outcome')}",
            f"driver {body.get('holder')}",
            "kept as evidence, not as the call's result",
        ],
        sections=[("what the tool returned", pretty(body.get("result")))],
    )


def _child(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    child = body.get("run_id")
    return _entry(
        rec,
        "child",
        f"Call {e.key} started sub-run {child}",
        meta=[f"agent {body.get('agent')}"] if body.get("agent") else [],
        run_link=child if isinstance(child, str) and child else None,
    )


def _handle(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    held = body.get("handle") or {}
    where = (
        f"MCP task {held.get('task_id')} on server {held.get('server')}"
        if held.get("kind") == "mcp-task"
        else "its work"
    )
    return _entry(
        rec,
        "child",
        f"Call {body.get('call_id')} ({body.get('tool')}) handed off {where}",
        meta=["a resume waits on it again, never calls again"],
    )


def _progress(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    said = body.get("message") or body.get("status") or ""
    done = body.get("progress")
    total = body.get("total")
    count = f"{done:g} of {total:g}" if isinstance(done, int | float) and total else ""
    return _entry(
        rec,
        INTERNAL,
        f"Call {body.get('call_id')} ({body.get('tool')}) in progress"
        + (f": {count}" if count else "")
        + (f" — {said}" if said else ""),
        internal=True,
    )


def _unknown(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    reason = body.get("reason") or {}
    return _entry(
        rec,
        "halt",
        f"Call {body.get('call_id')} ({body.get('tool')}) could not tell whether its "
        "effect happened",
        text=f"{reason.get('type')}: {reason.get('message')}",
        meta=["what the tool said, kept for the person who records the outcome"],
    )


def _start(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    value = body.get("input")
    return _entry(
        rec,
        "start",
        f"Run started by agent {body.get('agent')!r}",
        text=value if isinstance(value, str) else None,
        sections=[] if isinstance(value, str) else [("input", pretty(value))],
        step=0,
    )


def _model(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    # The transcript's own decoder: the page shows the turn as a resume replays it.
    message = RunState.assistant(rec)
    calls = [
        {"id": c.id, "name": c.name, "arguments": pretty_text(c.arguments)}
        for c in message.tool_calls
    ]
    meta = [f"model {body.get('model')}", f"finish {body.get('finish')}"]
    meta.append(_usage(body.get("usage")))
    return _entry(
        rec,
        "model",
        f"Model turn {e.key}",
        text=message.content or None,
        calls=calls,
        meta=meta,
        step=e.turn,
    )


def _attempt(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    at = _ms(body.get("attempted_at"))
    meta = [f"tool {body.get('tool')}"] + ([f"attempted at {at:%Y-%m-%d %H:%M:%S}"] if at else [])
    if e.undoes is not None:
        title = f"Undo of call {e.undoes}: attempt {e.attempt} claimed"
        return _entry(rec, "attempt", title, meta=meta)
    return _entry(rec, "attempt", f"Attempt {e.attempt} of call {e.call} claimed", meta=meta)


def _not_started(e: Entry) -> dict[str, Any]:
    return _entry(e.record, "attempt", f"Attempt {e.attempt} of call {e.call} never started")


def _outcome(e: Entry) -> tuple[ToolResult, list[str], list[tuple[str, str]]]:
    """A tool's or an undo's outcome: its flags and sections."""
    outcome = ToolResult.of(e.record)
    flags = ["error"] if outcome.is_error else ["ok"]
    if outcome.read_only:
        flags.append("read-only")
    if outcome.patched:
        flags.append("patched in a fork")
    sections = [("result", pretty(outcome.result))]
    if outcome.reconciled:
        flags.append(f"outcome recorded by {outcome.by or 'a person'}")
        if outcome.evidence is not None:
            sections.append(("evidence", pretty(outcome.evidence)))
    return outcome, flags, sections


def _tool(e: Entry) -> dict[str, Any]:
    outcome, flags, sections = _outcome(e)
    kind = "tool-error" if outcome.is_error else "tool"
    title = f"Result of call {e.key} ({outcome.name})"
    return _entry(e.record, kind, title, meta=flags, sections=sections)


def _undo(e: Entry) -> dict[str, Any]:
    outcome, flags, sections = _outcome(e)
    kind = "tool-error" if outcome.is_error else "undo"
    title = f"Undo of call {e.key} ({outcome.name})" + (" failed" if outcome.is_error else "")
    return _entry(e.record, kind, title, meta=flags, sections=sections)


def _saga_abort(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    cause = body.get("cause") or {}
    calls = body.get("calls") or []
    meta = [f"cause {cause.get('code')}"] + (
        [f"to undo: {', '.join(map(str, calls))}"] if calls else []
    )
    who = f" by {body.get('by')}" if body.get("by") else ""
    return _entry(
        rec,
        "cancelled",
        f"Saga aborted{who}: undoing its calls",
        text=cause.get("message"),
        meta=meta,
    )


def _compensated(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    undone = ", ".join(map(str, body.get("undone") or ())) or "nothing"
    meta = [f"undone: {undone}"]
    if body.get("failed"):
        meta.append("undo failed: " + ", ".join(map(str, body["failed"])))
    if body.get("kept"):
        meta.append("kept, its source's to undo: " + ", ".join(map(str, body["kept"])))
    return _entry(
        rec,
        "tool-error" if body.get("failed") else "complete",
        "Run compensated",
        text=(body.get("cause") or {}).get("message"),
        meta=meta,
    )


def _approval(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    verdict = "approved" if body.get("approved") else "denied"
    tally = body.get("tally") or {}
    # A deputy's vote reads "leo for lena" (engine.delegation).
    made = {
        str(d.get("approver")): d.get("deputy")
        for d in tally.get("decisions") or ()
        if isinstance(d, dict) and d.get("deputy")
    }

    def shown_as(users: Any) -> str:
        return ", ".join(f"{made[n]} for {n}" if n in made else str(n) for n in users)

    meta = [f"need {tally.get('need', 1)}"]
    if tally.get("approved_by"):
        meta.append("approved by " + shown_as(tally["approved_by"]))
    if tally.get("denied_by"):
        meta.append("denied by " + shown_as(tally["denied_by"]))
    if tally.get("disagreed_by"):
        meta.append("not counted (approved other arguments) " + ", ".join(tally["disagreed_by"]))
    edited = body.get("edited")
    sections = []
    if isinstance(edited, dict):
        meta.append("arguments edited by " + ", ".join(map(str, edited.get("by") or ())))
        sections.append(("runs with", pretty(edited.get("arguments"))))
    # The tally is in the meta line, and whole in the raw record behind the toggle.
    return _entry(
        rec,
        "approval" if body.get("approved") else "denial",
        f"Call {e.key} {verdict} by " + (body.get("decided_by") or str(body.get("by"))),
        text=body.get("note") or None,
        meta=meta,
        sections=sections,
    )


def _complete(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    meta = [f"{body.get('turns')} turns", _usage(body.get("spend") or body.get("usage"))]
    return _entry(rec, "complete", "Run finished", text=body.get("answer"), meta=meta)


def _cancelled(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    return _entry(
        rec, "cancelled", f"Run cancelled by {body.get('by')}", text=body.get("reason") or None
    )


def _fork(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    return _entry(
        rec,
        "fork",
        f"Forked from run {body.get('source')!r} at step {body.get('step')}",
        sections=[("patch", pretty(body.get("patch")))],
    )


def _drift(e: Entry) -> dict[str, Any]:
    return _entry(
        e.record,
        "drift",
        "Resumed under a changed agent",
        sections=[("changes", pretty(e.record.body.get("changes")))],
    )


def _takeover(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    why = {
        "expired": "its lease had expired",
        "holder gone": "its process was gone (its connection dropped)",
    }.get(str(body.get("reason")), str(body.get("reason")))
    return _entry(
        rec,
        "takeover",
        f"Driver {body.get('holder')} took the run over from {body.get('previous_holder')}",
        meta=[
            f"because {why}",
            f"its lease ran until {body.get('expired_at')}",
            f"last renewed {body.get('renewed_at')}",
        ],
    )


def _spend(e: Entry) -> dict[str, Any]:
    rec, body = e.record, e.record.body
    return _entry(
        rec,
        INTERNAL,
        f"Model spend without a turn ({body.get('why')})",
        meta=[_usage(body.get("usage"))],
        internal=True,
    )


def _user(e: Entry) -> dict[str, Any]:
    body = e.record.body
    texts = [body.get("text"), *(body.get("then") or ())]
    shown = "\n\n".join(t if isinstance(t, str) else pretty(t) for t in texts)
    title = "User message" if len(texts) == 1 else f"User messages ({len(texts)})"
    return _entry(e.record, "start", title, text=shown)


def _step(e: Entry) -> dict[str, Any]:
    return _entry(
        e.record,
        "meta",
        f"Step {e.key}",
        sections=[("value", pretty(e.record.body.get("value")))],
    )


def _other(e: Entry) -> dict[str, Any]:
    """Any record no describer claims (a wait, a signal, a channel's message…): its name."""
    return _entry(e.record, "meta", e.record.name, internal=e.internal)


# One describer per record kind (``engine.views.KINDS``); a kind not here is shown by its
# name (``_other``). Rule records, automatic decisions and deadline steps are the rule log's
# (``rule_records``), asked first.
DESCRIBERS: dict[str, Callable[[Entry], dict[str, Any]]] = {
    "header": _header,
    "fork-done": _fork_done,
    "late": _late,
    "child": _child,
    "handle": _handle,
    "progress": _progress,
    "unknown": _unknown,
    "start": _start,
    "model": _model,
    "attempt": _attempt,
    "not-started": _not_started,
    "tool": _tool,
    "undo": _undo,
    "saga-abort": _saga_abort,
    "compensated": _compensated,
    "approval": _approval,
    "complete": _complete,
    "cancelled": _cancelled,
    "fork": _fork,
    "drift": _drift,
    "takeover": _takeover,
    "spend": _spend,
    "user": _user,
    "step": _step,
}


def _describe(entry: Entry, rules: RuleLog | None = None) -> dict[str, Any]:
    ruled = (rules or RuleLog()).describe(entry)
    if ruled is not None:  # which rule asked, a decision a rule made, a deadline step
        kind, title, extra = ruled
        return _entry(entry.record, kind, title, **extra)
    return DESCRIBERS.get(entry.kind, _other)(entry)


def _halt_entries(halt: Any) -> list[dict[str, Any]]:
    """A halt row as the timeline's own entries: the halt, and its resolution if any (a halt
    is a row beside the journal, not a record in it)."""
    call = f"call {halt.op_id} ({halt.tool_name})" if halt.tool_name else str(halt.op_id)
    cause = {
        "crashed": "its driver stopped after claiming it, before recording an outcome",
        "contended": "another driver had claimed it",
        "outcome_unknown": "the tool said it could not tell whether its effect happened",
    }.get(halt.cause, halt.cause)
    base: dict[str, Any] = {
        "seq": None,
        "number": None,
        "name": halt.attempt or "",
        "internal": False,
        "text": None,
        "calls": [],
        "step": None,
        "raw": None,
    }
    out = [
        {
            **base,
            "at": halt.created_at,
            "kind": "halt",
            "title": f"Run halted: the outcome of {call} is unknown",
            "meta": [f"cause {halt.cause}: {cause}"],
            "sections": [],
        }
    ]
    if halt.status == HALT_ORPHANED:
        out.append(
            {
                **base,
                "at": halt.resolved_at or halt.created_at,
                "kind": "halt",
                "title": f"Halt on {call} closed: the run was cancelled",
                "meta": [],
                "sections": [],
            }
        )
    elif halt.status == HALT_RESOLVED:
        resolution = halt.resolution if isinstance(halt.resolution, dict) else {}
        out.append(
            {
                **base,
                "at": halt.resolved_at or halt.created_at,
                "kind": "recovery",
                "title": f"Halt on {call} resolved by {halt.resolved_by or 'a person'}; the run "
                "continues",
                "meta": ["error" if resolution.get("is_error") else "ok"],
                "sections": [],
            }
        )
    return out


def build_timeline(records: Iterable[Record], halts: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """The journal as a list of plain dicts a template can print without logic: each record
    numbered by its place in this run's journal (1, 2, 3…), and ``halts`` (Halt rows, already
    read) placed among them by time."""
    out = []
    rules = RuleLog()  # what the rule records so far said of each call
    for number, rec in enumerate(records, start=1):
        try:
            entry = _describe(read(rec), rules)
        except (DurableAgentsError, AttributeError, KeyError, TypeError, ValueError) as exc:
            # An unreadable or oddly shaped record is shown as such; the page still renders.
            entry = _entry(rec, "tool-error", f"{rec.name}: unreadable", text=str(exc))
        entry["number"] = number
        out.append(entry)
    for halt in halts:
        for entry in _halt_entries(halt):
            at = entry["at"]
            # After every record written no later than it (the records are in commit order).
            place = next(
                (
                    i
                    for i, e in enumerate(out)
                    if at is not None and e["at"] is not None and e["at"] > at
                ),
                len(out),
            )
            out.insert(place, entry)
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
        kind, key = kind_of(rec.name)
        if kind == "start" and (recorded := Start.of(rec).fingerprint) is not None:
            fingerprint = recorded
        elif kind == "drift":
            drift = Drift.of(rec, key)
            drifts.append(
                {
                    "seq": drift.seq,
                    "at": drift.at,
                    "hash": drift.hash,
                    "changes": _change_lines(drift.changes),
                }
            )
    fingerprint = fingerprint if fingerprint is not None else fallback
    tools = fingerprint.get("tools") if isinstance(fingerprint, dict) else None
    return {
        "fingerprint": fingerprint if isinstance(fingerprint, dict) else None,
        "fingerprint_tools": sorted(tools.items()) if isinstance(tools, dict) else [],
        "drifts": drifts,
    }
