"""Where a call awaiting approval stands under the rule that asked about it, read once for
the inbox's card, the call's page, the approval queue, the run page's banner and the API's
approvals: which rule asked and the values that decided it (its ``explain``, as journaled),
who must decide ("2 of finance"), whether an edit moved the call under a stricter rule, and
its deadline — when it reminds, escalates and to whom, when it expires and what then.

Built from the request row alone (its ``policy``, ``status``, ``created_at`` and
``decided_at``), so a list builds it for every row without a query. Deadlines are counted
from when the call was asked, against ``now``: the database's clock, which the pages read
with the row (``db_now``, an annotation), as the timer sweep that takes the steps does.

What it does not know: whether a reminder went out (only its journal record says so), so a
reminder whose time has passed is no longer mentioned; and a step whose time has passed but
the sweep has not taken yet is said to be due, not done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .engine.approvals import deciding_groups
from .engine.deadlines import duration
from .engine.ports import APPROVAL_EXPIRED, APPROVAL_PENDING
from .engine.rules import DEFAULT_RULE

# What happens to a call nobody decided in time (``Deadline(on_expiry=...)``).
ON_EXPIRY = {
    "deny": "denied",
    "cancel": "the run is cancelled",
    "halt": "the run halts for a person",
}
SOON = timedelta(hours=1)  # a next step closer than this is drawn as urgent


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class DeadlineState:
    """A request's deadline steps as times (None: the policy has no such step), what its
    escalation added (``escalated_to``, set once it escalated), and the next step not taken
    yet with its time."""

    remind_at: datetime | None
    escalate_at: datetime | None
    escalate_to: str | None
    expire_at: datetime | None
    on_expiry: str | None
    escalated_to: str | None
    next_step: str | None
    next_at: datetime | None
    text: str  # "escalates to oncall in 3 h · expires in 2 d 21 h, then denied"
    urgent: bool  # escalated, expired, or its next step due within the hour (or overdue)


@dataclass(frozen=True)
class RuleState:
    """Which rule asked about a call and why, who decides it, and its deadline."""

    rule: str | None  # None: a one-rule gate (requires_approval=True, a Quorum)
    explain: str | None  # as journaled: "amount_cents 125000 > 100000"
    need: int
    groups: tuple[str, ...]  # who decides: the rule's group, then the escalation's
    requester: str | None
    separate: bool  # the requester may not decide (requester_may_decide=False)
    moved_from: str | None  # the rule an edit moved the call from (None: not moved)
    moved_arguments: Any  # what that edit would run: the arguments its approvals are for
    deadline: DeadlineState | None

    @property
    def moved(self) -> bool:
        return self.moved_arguments is not None

    @property
    def who(self) -> str:
        """``"2 of finance"``, ``"1 of support-leads or oncall"``, ``"1 approver"``, and
        ``", not fred (who asked)"`` where duties are separated."""
        text = (
            f"{self.need} of {' or '.join(self.groups)}"
            if self.groups
            else ("1 approver" if self.need == 1 else f"{self.need} approvers")
        )
        if self.separate:
            text += (
                f", not {self.requester} (who asked)" if self.requester else ", not whoever asked"
            )
        return text

    @property
    def why(self) -> str:
        """What decided the rule: the values it compared, as journaled."""
        if self.rule == DEFAULT_RULE and self.explain in (None, "", "no rule matched"):
            return "no other rule matched"
        return self.explain or ""

    @property
    def text(self) -> str:
        """``"rule lead: amount_cents 50000 <= 100000 → 1 of support-leads"``."""
        if self.rule is None:
            return self.who
        return f"rule {self.rule}: {self.why} → {self.who}"


def rule_state(row: Any, now: datetime | None = None) -> RuleState:
    """The rule state of an approval request row (a model instance, or anything with its
    ``policy``, ``status``, ``created_at`` and ``decided_at``). ``now`` defaults to the
    row's ``db_now`` annotation, then this process's clock."""
    return from_policy(
        row.policy,
        status=getattr(row, "status", APPROVAL_PENDING),
        created_at=getattr(row, "created_at", None),
        decided_at=getattr(row, "decided_at", None),
        now=now or getattr(row, "db_now", None),
    )


def from_policy(
    policy: Any,
    *,
    status: str = APPROVAL_PENDING,
    created_at: datetime | None = None,
    decided_at: datetime | None = None,
    now: datetime | None = None,
) -> RuleState:
    """The rule state a request ``policy`` (or a ``rule:<call>`` record's) describes; its
    deadline only with the time the call was asked (``created_at``)."""
    policy = policy if isinstance(policy, Mapping) else {}
    moved = policy.get("moved_by_edit")
    moved = moved if isinstance(moved, Mapping) else {}
    rule = policy.get("rule")
    need = policy.get("need", 1)
    requester = policy.get("requester")
    return RuleState(
        rule=str(rule) if rule else None,
        explain=str(policy["explain"]) if policy.get("explain") is not None else None,
        need=need if isinstance(need, int) and not isinstance(need, bool) else 1,
        groups=deciding_groups(policy),
        requester=str(requester) if requester else None,
        separate=bool(policy.get("separate")),
        moved_from=(str(moved.get("from") or "") or None) if moved else None,
        moved_arguments=moved.get("arguments") if moved else None,
        deadline=_deadline(policy, status, created_at, decided_at, now or timezone.now()),
    )


def _deadline(
    policy: Mapping[str, Any],
    status: str,
    created: datetime | None,
    decided: datetime | None,
    now: datetime,
) -> DeadlineState | None:
    spec = policy.get("deadline")
    if not isinstance(spec, Mapping) or created is None:
        return None
    at = {
        step: created + timedelta(seconds=after)
        for step in ("remind", "escalate", "expire")
        if (after := _seconds(spec.get(step))) is not None
    }
    if not at:
        return None
    to = str(spec.get("escalate_to") or "") or None
    escalated = str(policy.get("escalated_to") or "") or None
    on_expiry = str(spec.get("on_expiry") or "deny")
    then = ON_EXPIRY.get(on_expiry, on_expiry)
    parts: list[str] = []
    upcoming: list[tuple[str, datetime]] = []
    urgent = False
    if status == APPROVAL_EXPIRED:
        decided = decided or at.get("expire") or now
        parts.append(f"expired {duration((now - decided).total_seconds())} ago: {then}")
        urgent = True
    elif status == APPROVAL_PENDING:
        if "remind" in at and now < at["remind"] and not escalated:
            upcoming.append(("remind", at["remind"]))
            left = duration((at["remind"] - now).total_seconds())
            parts.append(f"reminds its approvers in {left}")
        if escalated:
            parts.append(f"escalated to {escalated}")
            urgent = True
        elif "escalate" in at:
            upcoming.append(("escalate", at["escalate"]))
            parts.append(_step(f"escalates to {to}", f"escalation to {to}", at["escalate"], now))
        if "expire" in at:
            upcoming.append(("expire", at["expire"]))
            parts.append(_step("expires", "expiry", at["expire"], now) + f", then {then}")
    step, when = upcoming[0] if upcoming else (None, None)
    if when is not None and when - now <= SOON:
        urgent = True
    return DeadlineState(
        remind_at=at.get("remind"),
        escalate_at=at.get("escalate"),
        escalate_to=to,
        expire_at=at.get("expire"),
        on_expiry=on_expiry if "expire" in at else None,
        escalated_to=escalated,
        next_step=step,
        next_at=when,
        text=" · ".join(parts),
        urgent=urgent,
    )


def _step(coming: str, due: str, at: datetime, now: datetime) -> str:
    """``"escalates to oncall in 3 h"``; once its time has passed and the sweep has not taken
    it yet, ``"escalation to oncall due 5 min ago"``."""
    if now < at:
        return f"{coming} in {duration((at - now).total_seconds())}"
    return f"{due} due {duration((now - at).total_seconds())} ago"
