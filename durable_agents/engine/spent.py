"""Spent run ids (docs/retention.md, "Spent ids"): the one rule for an id a deleted run held.

A run id this site held and then deleted — by ``delete`` (the admin, the API, the command
line) or by ``prune`` — is spent for good: no run row is created under it again, whatever
would create it (a start, a fork, an import, a sub-run, a session's turn or journal, a
journal write). Everything keyed by a run id — a webhook's delivery, a parent's call, a
signed decision, an idempotency key a tool passed on — would take a new run under that id
for the one that already did its work, and could do that work again.

Every store records the spent id in the write that deletes the run, and refuses it in the
write that would create a row under it; ``refusal`` is the error both raise.
"""

from __future__ import annotations

from .errors import RunIdSpent, RunPruned

PRUNED = "pruned"
DELETED = "deleted"
REASONS = (PRUNED, DELETED)


def refusal(run_id: str, reason: str) -> RunIdSpent:
    """The error for creating a run under ``run_id``, spent because its run was ``reason``."""
    if reason == PRUNED:
        return RunPruned(
            f"run {run_id!r} was pruned (durable_agents prune); its id is spent: a run "
            "started again under it would do again what it did. Its answer is in its "
            "export; start new work under a new run id",
            run_id=run_id,
        )
    return RunIdSpent(
        f"run {run_id!r} was deleted; its id is spent: a run created again under it would "
        "be taken for the one that was deleted, and could do again what that one did. Use "
        "a new run id",
        run_id=run_id,
        reason=reason,
    )
