"""A pending request's deadline (``da.Deadline``, docs/approvals.md "Deadlines"): when it
reminds its approvers, escalates to more of them, and expires, counted from when it was
asked, on the database's clock.

The deadline is part of the request's recorded policy (``policy["deadline"]``, seconds after
asking): the rule record of a tool with ``da.Rules`` (``rule:<call>``) or the request row of
a plain gated tool holds it, so a deploy that changes the rules while a request waits never
changes when it reminds, escalates or expires. ``due_at`` on the request row is when its next
step falls due; the timer sweep reads the rows due (``commands.deadlines``).

This module holds the timing and the words; the steps themselves are
``engine.commands.deadlines``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

REMIND, ESCALATE, EXPIRE = "remind", "escalate", "expire"
STEPS = (REMIND, ESCALATE, EXPIRE)
ON_EXPIRY_DENY, ON_EXPIRY_CANCEL, ON_EXPIRY_HALT = "deny", "cancel", "halt"

# Who the journal names for what a deadline does (its expiry's denial: ``by: "deadline"``).
# Not a user: nobody logs in as it.
BY = "deadline"


def of(policy: Mapping[str, Any] | None) -> dict[str, Any]:
    """The deadline a request's ``policy`` records (empty: none)."""
    found = (policy or {}).get("deadline")
    return dict(found) if isinstance(found, Mapping) else {}


def steps(policy: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    """The deadline's steps in order, each with its seconds after asking."""
    deadline = of(policy)
    out = []
    for step in STEPS:
        after = deadline.get(step)
        if isinstance(after, int | float) and not isinstance(after, bool):
            out.append((step, float(after)))
    return out


def first_after(policy: Mapping[str, Any] | None) -> float | None:
    """Seconds after asking when the first step falls due (None: no deadline): a request's
    ``due_at`` when it is saved."""
    found = steps(policy)
    return found[0][1] if found else None


def after_step(policy: Mapping[str, Any] | None, step: str) -> float | None:
    """Seconds after asking when the step after ``step`` falls due (None: none is left)."""
    found = steps(policy)
    names = [s for s, _ in found]
    if step not in names:
        return None
    rest = found[names.index(step) + 1 :]
    return rest[0][1] if rest else None


def due(policy: Mapping[str, Any] | None, asked_at: datetime, now: datetime) -> str | None:
    """The latest step whose time has come (None: none yet). Only the latest is taken: a
    sweep that comes late (or a deadline whose steps fall together) does not remind people
    of a request it expires in the same breath."""
    passed = [s for s, after in steps(policy) if asked_at + timedelta(seconds=after) <= now]
    return passed[-1] if passed else None


def on_expiry(policy: Mapping[str, Any] | None) -> str:
    return str(of(policy).get("on_expiry") or ON_EXPIRY_DENY)


def is_expiry(decision: Any) -> bool:
    """Whether a journaled decision is a deadline's expiry, not a person's or a rule's."""
    return decision is not None and bool(decision.get("expired"))


def expiry_note(policy: Mapping[str, Any] | None) -> str:
    """What the model reads when a request expired: nobody decided it in time."""
    after = of(policy).get(EXPIRE)
    waited = f" within {duration(float(after))}" if isinstance(after, int | float) else ""
    return (
        f"nobody decided this call{waited}: its approval request expired and the call was "
        "not made; do not retry it without asking"
    )


def rejection(decision: Any) -> dict[str, Any]:
    """The call's result after its request expired (``on_expiry="deny"``)."""
    note = str(decision.get("note") or "")
    return {"error": "expired", "message": note, "note": note, "by": BY}


def duration(seconds: float) -> str:
    """``"2 d 21 h"``, ``"3 h 12 min"``, ``"40 min"``, ``"12 s"``: the two largest units (no
    seconds once there are minutes), as an approver reads a deadline."""
    seconds = max(0, int(seconds))  # "in 2 h 59 min" until it is 3 h no more
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min"
    return f"{seconds} s"
