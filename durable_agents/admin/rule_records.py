"""The approval rules' records on the run page's timeline, read for people: which rule asked
about a call and the values that decided it (``rule:<call>``), an automatic decision naming
its rule ("allowed by rule small: amount_cents 4000 <= 5000"), an edit that moved a call
under a stricter rule (``rule:<call>:<tag>``, ``edit: true``), and a pending call's deadline
steps (``deadline:<call>[:<tag>]:<step>``).

Built from the records the page read, in commit order: whether an edit *moved* its call is
told by comparing its rule's policy with the one the call was under then (never a laxer one:
``engine.rules.demands_more``), as the ``approve`` command did when it recorded the edit.
"""

from __future__ import annotations

import re
from typing import Any

from ..engine.rules import at_least, demands_more
from ..engine.views import Entry
from ..rule_state import ON_EXPIRY, from_policy
from .pretty import pretty

# ``<call>:<tag>``: a record for arguments other than the first (an edit, a deploy's change).
_TAGGED = re.compile(r"(.+):([0-9a-f]{16})")

Described = tuple[str, str, dict[str, Any]]  # (kind, title, the entry's other parts)


def _call(rest: str) -> tuple[str, str | None]:
    tagged = _TAGGED.fullmatch(rest)
    return (tagged.group(1), tagged.group(2)) if tagged else (rest, None)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class RuleLog:
    """What the timeline has read so far of each call's approval: the policy it is asked
    under, and whether a decision was recorded."""

    def __init__(self) -> None:
        self.policy: dict[str, dict[str, Any]] = {}
        self.decided: set[str] = set()

    def describe(self, entry: Entry) -> Described | None:
        """The entry for a rule record, an automatic decision or a deadline step; None for
        any other record (a person's decision is only noted: its call is decided)."""
        if entry.kind == "rule":
            return self._rule(entry.key, entry.record.body)
        if entry.kind == "deadline":
            return self._deadline(entry.key, entry.record.body)
        if entry.kind == "approval":
            call, _ = _call(entry.key)
            self.decided.add(call)
            if entry.record.body.get("automatic"):
                return _automatic(call, entry.record.body)
        return None

    def _rule(self, rest: str, body: Any) -> Described:
        call, _ = _call(rest)
        rule, explain = body.get("rule"), body.get("explain")
        outcome = body.get("outcome")
        policy = _dict(body.get("policy"))
        said = from_policy({**policy, "rule": rule, "explain": explain})
        meta = [f"rules {body.get('fingerprint')}"] if body.get("fingerprint") else []
        if not body.get("edit"):
            self.policy.setdefault(call, policy)
            return (
                "rule-asked",
                f"Call {call} asked under rule {rule}: {said.why} → {said.who}",
                {"meta": meta},
            )
        edited = [("edited arguments", pretty(body.get("arguments")))]
        if outcome == "deny":
            title = f"An edit of call {call} is refused by rule {rule}: {said.why}"
            extra = {"meta": [*meta, "the edit was not accepted"], "sections": edited}
            return "denial", title, extra
        before = self.policy.get(call)
        if (
            outcome == "ask"
            and call not in self.decided
            and before is not None
            and demands_more(policy, before)
        ):
            self.policy[call] = at_least(policy, before)
            was = before.get("rule")
            return (
                "rule-moved",
                f"An edit moved call {call} under rule {rule}: {said.why} → {said.who}",
                {
                    "meta": [*meta, *([f"it was under rule {was}"] if was else [])],
                    "sections": edited,
                },
            )
        what = said.who if outcome == "ask" else "allowed"
        return (
            "rule-asked",
            f"An edit of call {call} falls under rule {rule}: {said.why} → {what}",
            {
                "meta": [*meta, "an edit never lowers what a call needs"],
                "sections": edited,
            },
        )

    def _deadline(self, rest: str, body: Any) -> Described:
        head, _, step = rest.rpartition(":")
        call, _ = _call(head)
        policy = _dict(body.get("policy"))
        spec = _dict(policy.get("deadline"))
        rule = body.get("rule") or policy.get("rule")
        meta = [f"rule {rule}"] if rule else []
        if step == "remind":
            return "deadline-step", f"Call {call}: its approvers were reminded", {"meta": meta}
        if step == "escalate":
            to = body.get("escalated_to") or policy.get("escalated_to") or spec.get("escalate_to")
            return (
                "deadline-step",
                f"Call {call} escalated to {to or 'more approvers'}: they may decide it too",
                {"meta": meta},
            )
        if step == "expire":
            self.decided.add(call)
            then = str(body.get("on_expiry") or spec.get("on_expiry") or "deny")
            return (
                "denial",
                f"Call {call} expired, nobody decided in time: {ON_EXPIRY.get(then, then)}",
                {"meta": meta},
            )
        return "deadline-step", f"Call {call}: deadline step {step}", {"meta": meta}


def _automatic(call: str, body: Any) -> Described:
    """``"Call c1 allowed by rule small: amount_cents 4000 <= 5000"`` (or refused, with the
    rule's message the model read)."""
    verb = "allowed" if body.get("approved") else "refused"
    explain = body.get("explain")
    title = f"Call {call} {verb} by rule {body.get('rule')}" + (f": {explain}" if explain else "")
    meta = ["automatic: nobody was asked"]
    if body.get("fingerprint"):
        meta.append(f"rules {body.get('fingerprint')}")
    return (
        "approval" if body.get("approved") else "denial",
        title,
        {"text": body.get("note") or None, "meta": meta},
    )
