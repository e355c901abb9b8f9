"""What waits on one person in particular, for the inbox's filter *escalated to me*: calls
whose deadline escalated them to a group of theirs (``policy["escalated_to"]``). *Delegated
to me* is who may decide what, so the engine's one rule answers it
(``deciding.ways_by_row``, through ``engine.delegation``).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from ..models import ApprovalRequest


def escalated_to(
    rows: QuerySet[ApprovalRequest], groups: Iterable[str]
) -> QuerySet[ApprovalRequest]:
    """``rows`` narrowed to the calls a deadline escalated to one of ``groups``."""
    return rows.filter(policy__escalated_to__in=sorted(groups))
