"""What waits on one person in particular, for the inbox's filters *escalated to me* and
*delegated to me*: calls whose deadline escalated them to a group of theirs
(``policy["escalated_to"]``), and calls they may decide only as the deputy of an approver
who delegated to them (a ``Delegation`` in force on the database's clock: begun, not ended,
not revoked; for all calls, or only those of its ``groups`` and ``tools``).

Read for the page, never per card: the person's delegations in one query, then each
delegating approver (their permissions and groups) and each deciding group's members once.
Who may decide is still the engine's one rule (``check_may_decide``), asked here of the
approver a deputy would stand in for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import Now

from ..engine import runtime
from ..engine.approvals import check_may_decide, deciding_groups, eligible_for
from ..engine.errors import DurableAgentsError
from ..engine.identity import Actor
from ..models import ApprovalRequest, Delegation
from ..people import resolve_actor


def escalated_to(
    rows: QuerySet[ApprovalRequest], groups: Iterable[str]
) -> QuerySet[ApprovalRequest]:
    """``rows`` narrowed to the calls a deadline escalated to one of ``groups``."""
    return rows.filter(policy__escalated_to__in=sorted(groups))


class Deputy:
    """The delegations in force to ``username``, and for each call whom they would decide
    it for."""

    def __init__(self, username: str) -> None:
        self.username = username
        self.delegations = list(
            Delegation.objects.filter(
                deputy=username,
                revoked_at__isnull=True,
                starts_at__lte=Now(),
                ends_at__gt=Now(),
            ).order_by("ends_at", "pk")
        )
        self._actors: dict[str, Actor | None] = {}
        self._members: dict[str, list[str]] = {}

    def stands_in(self, obj: ApprovalRequest, votes: Sequence[Any]) -> list[Delegation]:
        """The delegations under which this deputy may decide ``obj`` for their approver:
        the delegation covers the call's tool and one of its deciding groups, the approver
        has not voted on it, and the approver may decide it."""
        policy = obj.policy if isinstance(obj.policy, dict) else {}
        if policy.get("separate") and policy.get("requester") == self.username:
            return []  # who asked decides nothing, for themselves or anyone
        groups = set(deciding_groups(policy))
        voted = {v.approver for v in votes}
        out = []
        for d in self.delegations:
            if d.tools and obj.tool_name not in d.tools:
                continue
            if d.groups and not groups & set(d.groups):
                continue
            if d.approver in voted or not self._may_decide(d.approver, policy):
                continue
            out.append(d)
        return out

    def _may_decide(self, approver: str, policy: dict[str, Any]) -> bool:
        if approver not in self._actors:
            self._actors[approver] = resolve_actor(approver)
        actor = self._actors[approver]
        if actor is None or not actor.active:
            return False
        try:
            check_may_decide(actor, policy, eligible_for(policy, actor, self._members_of))
        except DurableAgentsError:
            return False
        return True

    def _members_of(self, group: str) -> list[str]:
        if group not in self._members:
            self._members[group] = list(runtime.eligible_approvers(group))
        return self._members[group]
