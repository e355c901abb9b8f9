"""Spent ids on the site's database (``engine.spent``): written in the transaction that
deletes runs (``DjangoStore.delete_run``, ``retention.prune``), read by every write that
creates a run and by ``import``.

A deleted run's signed decisions are spent with it (``SpentDecision``, by the sha256 of the
signature): a live import carrying one is refused, so a decision authorises at most the one
firing it was given for, even if the run's id were somehow free again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ..engine.spent import refusal
from ..models import Decision, SpentDecision, SpentRunId

__all__ = ["digest", "refuse_spent", "retire", "spent_decisions", "spent_ids"]


def digest(signature: str) -> str:
    """How a spent decision is known: the sha256 of its signature, hex."""
    return hashlib.sha256(signature.encode("utf-8")).hexdigest()


def retire(using: str, run_ids: Iterable[str], reason: str) -> None:
    """Spend ``run_ids`` and their signed decisions, inside the caller's transaction, before
    it deletes the rows (an id already spent keeps its first reason)."""
    ids = list(run_ids)
    if not ids:
        return
    SpentRunId.objects.using(using).bulk_create(
        [SpentRunId(run_id=rid, reason=reason) for rid in ids], ignore_conflicts=True
    )
    signed = (
        Decision.objects.using(using)
        .filter(request__run_id__in=ids)
        .exclude(signature__isnull=True)
        .exclude(signature="")
        .values_list("signature", "request__run_id", "request__call_id", "approver")
    )
    SpentDecision.objects.using(using).bulk_create(
        [
            SpentDecision(digest=digest(str(sig)), run_id=rid, call_id=call, approver=who)
            for sig, rid, call, who in signed
        ],
        ignore_conflicts=True,
    )


def spent_ids(using: str, run_ids: Iterable[str]) -> dict[str, str]:
    """Which of ``run_ids`` are spent, each with its reason."""
    return dict(
        SpentRunId.objects.using(using).filter(pk__in=list(run_ids)).values_list("run_id", "reason")
    )


def refuse_spent(using: str, run_ids: Iterable[str]) -> None:
    """Raise the engine's refusal (``run.spent``, ``run.pruned``) for the first spent id."""
    found = spent_ids(using, run_ids)
    if found:
        run_id = sorted(found)[0]
        raise refusal(run_id, found[run_id])


def spent_decisions(using: str, signatures: Iterable[str]) -> list[SpentDecision]:
    """The spent decisions among ``signatures``."""
    digests = {digest(s) for s in signatures if s}
    return list(SpentDecision.objects.using(using).filter(pk__in=digests))
