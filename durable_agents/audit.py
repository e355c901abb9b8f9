"""The audit chains on the site's database (docs/audit.md): verification, and the SQL
function SQLite's journal trigger calls.

The chain's definition and the verifier are the engine's (``engine/audit.py``); the hash of
a journal record is computed by the database in the statement that inserts it (migration
``0006_audit_chain``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import receiver

from .engine.audit import ChainReport, chain_hash, verify_actions, verify_run
from .engine.errors import NotFound

__all__ = ["sample_check", "verify"]


@receiver(connection_created, dispatch_uid="durable_agents.audit.sqlite")
def _register_sqlite_hash(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function(
            "durable_agents_chain_hash", 3, _sqlite_hash, deterministic=True
        )


def _sqlite_hash(prev: str | None, name: str, data: str) -> str:
    return chain_hash(prev, name, data)


def verify(
    run_ids: Iterable[str] | None = None, *, actions: bool = False, using: str | None = None
) -> list[ChainReport]:
    """Verify the chains of ``run_ids`` (every run when None), and the site's action log
    when ``actions``; one report each, in that order."""
    from .models import Run
    from .storage import DjangoStore

    store = DjangoStore(using)
    runs = Run.objects.using(store.using)
    if run_ids is None:
        run_ids = runs.order_by("run_id").values_list("pk", flat=True).iterator()
    else:
        run_ids = list(run_ids)
        missing = sorted(
            set(run_ids) - set(runs.filter(pk__in=run_ids).values_list("pk", flat=True))
        )
        if missing:
            raise NotFound(f"no run {', '.join(map(repr, missing))}", code="run.not_found")
    reports = [verify_run(store, run_id) for run_id in run_ids]
    if actions:
        reports.append(verify_actions(store))
    return reports


def sample_check(size: int, *, using: str | None = None) -> list[ChainReport]:
    """Verify the chains of the ``size`` most recently updated runs (the system check)."""
    from .models import Run

    runs = Run.objects.using(using or _database()).order_by("-updated_at")
    return [
        r for r in verify(list(runs.values_list("pk", flat=True)[:size]), using=using) if not r.ok
    ]


def _database() -> str:
    from .conf import get_settings

    return get_settings().database
