"""Delegations on the site's database (``engine.delegation``), as a part of ``DjangoStore``.

Recording one is serialised per approver (a transaction-scoped advisory lock on
PostgreSQL; SQLite serialises writers, and the store's transactions are ``IMMEDIATE``), so
two overlapping delegations recorded at once never both stand. Whether one is in force is
judged by the database's clock, in the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Case, CharField, Q, QuerySet, Value, When
from django.db.models.functions import Now

from ..engine.ports import ActionInfo, DelegationInfo
from ..models import Delegation


def to_domain(row: Delegation) -> DelegationInfo:
    return DelegationInfo(
        approver=row.approver,
        deputy=row.deputy,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        groups=tuple(str(g) for g in row.groups or ()),
        tools=tuple(str(t) for t in row.tools or ()),
        note=row.note,
        created_by=row.created_by,
        id=row.pk,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        revoked_by=row.revoked_by,
    )


def in_force_now() -> Q:
    """Rows in force now, by the database's clock."""
    return Q(starts_at__lte=Now(), ends_at__gt=Now(), revoked_at__isnull=True)


UPCOMING, IN_FORCE, ENDED, REVOKED = "upcoming", "in_force", "ended", "revoked"


def with_state(rows: QuerySet[Delegation]) -> QuerySet[Delegation]:
    """``rows`` each annotated with ``state`` (``upcoming``, ``in_force``, ``ended`` or
    ``revoked``) by the database's clock, in the same query."""
    return rows.annotate(
        state=Case(
            When(revoked_at__isnull=False, then=Value(REVOKED)),
            When(ends_at__lte=Now(), then=Value(ENDED)),
            When(starts_at__gt=Now(), then=Value(UPCOMING)),
            default=Value(IN_FORCE),
            output_field=CharField(),
        )
    )


def in_state(state: str) -> Q:
    """Rows in ``state`` (as ``with_state`` names them) by the database's clock; ``current``:
    in force or still to come."""
    live = Q(revoked_at__isnull=True)
    return {
        "current": live & Q(ends_at__gt=Now()),
        IN_FORCE: in_force_now(),
        UPCOMING: live & Q(starts_at__gt=Now()),
        ENDED: live & Q(ends_at__lte=Now()),
        REVOKED: ~live,
    }[state]


class Delegations:
    """Mixed into ``DjangoStore``: uses its ``using``, ``dialect`` and action log."""

    if TYPE_CHECKING:
        using: str

        @property
        def dialect(self) -> Any: ...

        def _execute(self, sql: str, params: Sequence[Any], fetch: str) -> Any: ...

        def log_action(self, action: ActionInfo) -> None: ...

    def save_delegation(
        self, delegation: DelegationInfo, *, log: ActionInfo
    ) -> tuple[DelegationInfo, bool]:
        rows = Delegation.objects.using(self.using)
        with transaction.atomic(using=self.using):
            if self.dialect.postgres:
                self._execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))",
                    [f"durable_agents.delegation:{delegation.approver}"],
                    "one",
                )
            # Overlapping in time here; in scope (JSON lists) below, among a few rows.
            near = rows.filter(
                approver=delegation.approver,
                revoked_at__isnull=True,
                starts_at__lt=delegation.ends_at,
                ends_at__gt=delegation.starts_at,
            ).order_by("starts_at", "pk")
            for row in near:
                standing = to_domain(row)
                if standing.overlaps(delegation):
                    return standing, False
            row = rows.create(
                approver=delegation.approver,
                deputy=delegation.deputy,
                starts_at=delegation.starts_at,
                ends_at=delegation.ends_at,
                groups=list(delegation.groups),
                tools=list(delegation.tools),
                note=delegation.note,
                created_by=delegation.created_by,
            )
            self.log_action(
                replace(
                    log,
                    target=f"delegation:{row.pk}",
                    payload={**log.payload, "delegation": row.pk},
                )
            )
        return to_domain(row), True

    def get_delegation(self, delegation_id: int) -> DelegationInfo | None:
        row = Delegation.objects.using(self.using).filter(pk=delegation_id).first()
        return to_domain(row) if row is not None else None

    def revoke_delegation(self, delegation_id: int, by: str, *, log: ActionInfo) -> bool:
        with transaction.atomic(using=self.using):
            changed = (
                Delegation.objects.using(self.using)
                .filter(pk=delegation_id, revoked_at__isnull=True)
                .update(revoked_at=Now(), revoked_by=by)
            )
            if changed:
                self.log_action(log)
        return bool(changed)

    def list_delegations(
        self,
        *,
        approver: str | None = None,
        deputy: str | None = None,
        in_force: bool = False,
    ) -> Sequence[DelegationInfo]:
        rows = Delegation.objects.using(self.using).order_by("-starts_at", "-id")
        if approver is not None:
            rows = rows.filter(approver=approver)
        if deputy is not None:
            rows = rows.filter(deputy=deputy)
        if in_force:
            rows = rows.filter(in_force_now())
        return [to_domain(r) for r in rows]
