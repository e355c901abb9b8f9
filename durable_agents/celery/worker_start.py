"""A Celery worker refuses to start on a ``DURABLE_AGENTS`` setting ``manage.py check`` refuses.

Celery's Django fixup runs the system checks when a worker starts, but only collects their
messages: a worker with a misspelled ``AGENTS`` path would report ``ready.``, take a run,
fail it (its agent is not loaded) and leave it failed. ``refuse_bad_settings`` runs on
Celery's ``worker_init`` signal, after the task modules are imported and before the worker
connects to the broker, so such a worker prints the check's errors (as ``manage.py check``
words them) and exits with status 1 before it consumes a message.

Only this app's errors stop a worker (``durable_agents.E001`` to ``E003``, the checks that read
no database); warnings are printed and the worker starts. A check silenced in
``SILENCED_SYSTEM_CHECKS`` is silenced here too.

A worker started before ``manage.py migrate`` (a deploy that starts everything at once) says
so once and waits, starting when the database is migrated (``wait_for_migrations``): it
would otherwise report ``ready.`` and fail every task, recovery passes included, with the
same ``ProgrammingError`` traceback every few seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core import checks


def worker_errors() -> list[checks.CheckMessage]:
    """This app's check messages at ``ERROR`` or above that a worker must not start with."""
    from ..checks import check_settings, check_webhooks

    silenced = set(getattr(django_settings, "SILENCED_SYSTEM_CHECKS", ()))
    found = [*check_settings(), *check_webhooks()]
    return [m for m in found if m.is_serious() and m.id not in silenced]


def report(errors: list[checks.CheckMessage]) -> str:
    """The errors as ``manage.py check`` prints them, and what the worker does about it."""
    lines = "\n".join(str(e) for e in errors)
    return (
        "SystemCheckError: System check identified some issues:\n\nERRORS:\n"
        f"{lines}\n\nSystem check identified {len(errors)} issue(s).\n"
        "durable_agents: this worker does not start: with this setting it would take runs "
        "and fail them. Fix DURABLE_AGENTS (python manage.py check shows the same errors), "
        "then start the worker again.\n"
    )


def refuse_bad_settings(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init`` receiver: exit with status 1 if the settings fail this app's checks.

    ``SystemExit``, not an exception: Celery logs and swallows what a signal receiver
    raises, and the worker would start anyway."""
    errors = worker_errors()
    if errors:
        sys.stderr.write(report(errors))
        sys.stderr.flush()
        raise SystemExit(1)
    wait_for_migrations()


def unapplied_migrations() -> list[str]:
    """The migrations ``manage.py migrate`` would apply to the store's database, in order."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from ..conf import get_settings

    executor = MigrationExecutor(connections[get_settings().database])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def wait_for_migrations(poll: float = 5.0, say: Callable[[str], Any] = sys.stderr.write) -> None:
    """Return once the database is migrated; if it is not yet, say so once (what to run)
    and look again every ``poll`` seconds, quietly."""
    from django.db import close_old_connections

    pending = unapplied_migrations()
    if not pending:
        return
    say(
        f"durable_agents: the database is not migrated ({len(pending)} migration(s) to "
        f"apply, {pending[0]} first): run `python manage.py migrate`. This worker waits and "
        "starts once it is.\n"
    )
    while pending:
        time.sleep(poll)
        close_old_connections()
        pending = unapplied_migrations()
    say("durable_agents: the database is migrated; this worker starts.\n")


def connect() -> None:
    """Connect ``refuse_bad_settings`` to Celery's ``worker_init`` (once per process)."""
    from celery import signals

    signals.worker_init.connect(
        refuse_bad_settings, dispatch_uid="durable_agents.celery.worker_start", weak=False
    )
