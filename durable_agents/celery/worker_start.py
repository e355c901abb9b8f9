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
"""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings as django_settings
from django.core import checks


def worker_errors() -> list[checks.CheckMessage]:
    """This app's check messages at ``ERROR`` or above that a worker must not start with."""
    from ..checks import check_settings

    silenced = set(getattr(django_settings, "SILENCED_SYSTEM_CHECKS", ()))
    return [m for m in check_settings() if m.is_serious() and m.id not in silenced]


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
    if not errors:
        return
    sys.stderr.write(report(errors))
    sys.stderr.flush()
    raise SystemExit(1)


def connect() -> None:
    """Connect ``refuse_bad_settings`` to Celery's ``worker_init`` (once per process)."""
    from celery import signals

    signals.worker_init.connect(
        refuse_bad_settings, dispatch_uid="durable_agents.celery.worker_start", weak=False
    )
