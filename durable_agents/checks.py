"""System checks: a bad ``DURABLE_AGENTS`` setting stops ``manage.py`` with a fix-it hint.

Each kind of problem has its own id, so a deployment can silence one kind
(``SILENCED_SYSTEM_CHECKS``) without hiding the others:

* ``durable_agents.E001`` — the ``DURABLE_AGENTS`` dict is invalid (a key, a value).
* ``durable_agents.E002`` — an ``AGENTS`` entry cannot be imported or defines no agent.
* ``durable_agents.E003`` — two agents share a name.
* ``durable_agents.W001`` — the beat entry for ``recover_runs`` sends to another queue than
  ``CELERY_QUEUE`` (no worker would consume recovery passes).
* ``durable_agents.W002`` — ``DISPATCH`` is ``"celery"`` but ``CELERY_BROKER_URL`` is not set
  (Celery would quietly try ``amqp://guest@localhost``).
* ``durable_agents.W003`` — runs have waited in the queue for several recovery intervals with
  no driver (``queue_health``): likely no worker consumes ``CELERY_QUEUE``. It reads the
  database, so it runs with ``manage.py check --database default`` (and ``migrate``).
* ``durable_agents.E004`` — the audit chain of one of the ``AUDIT_CHECK_SAMPLE`` most
  recently updated runs does not verify (docs/audit.md). Off unless that setting is set;
  it reads the database like W003.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from . import conf
from .engine.errors import AgentPathError
from .registry import agents_at
from .schedule import RECOVER_TASK

SETTINGS_HINT = (
    f"Fix the DURABLE_AGENTS dict in your settings; every key: {conf.DOCS_URL}settings.md"
)
AGENTS_HINT = (
    "DURABLE_AGENTS['AGENTS'] lists dotted paths to Agent objects, lists of them, or modules "
    f"defining them: {conf.DOCS_URL}settings.md"
)
CELERY_HINT = f"Wire Celery into your project: {conf.DOCS_URL}celery.md"


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems:
        return [checks.Error(p, hint=SETTINGS_HINT, id="durable_agents.E001") for p in problems]
    return [*_check_agents(settings.agents), *_check_celery(settings)]


@checks.register(checks.Tags.database)
def check_queue_health(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from django.db import DatabaseError, connections

    from .models import Run
    from .queue_health import stalled_runs

    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems or settings.database not in (databases or ()):
        return []
    try:
        if Run._meta.db_table not in connections[settings.database].introspection.table_names():
            return []  # not migrated yet (this check also runs before `migrate`)
        health = stalled_runs(settings=settings)
    except DatabaseError:
        return []  # unreachable: other checks and commands say so
    if not health:
        return []
    return [
        checks.Warning(
            health.message(),
            hint=(
                "Run a worker on that queue, and Celery beat (or `python manage.py "
                "durable_agents recover` from cron); `python manage.py durable_agents runs "
                f"--stalled` lists them. "
                f"{CELERY_HINT}"
            ),
            id="durable_agents.W003",
        )
    ]


def _check_agents(paths: tuple[str, ...]) -> list[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    named: dict[str, tuple[Any, str]] = {}
    for path in paths:
        try:
            agents = agents_at(path)
        except AgentPathError as exc:
            found.append(checks.Error(str(exc), hint=AGENTS_HINT, id="durable_agents.E002"))
            continue
        for agent in agents:
            other = named.get(agent.name)
            if other is not None and other[0] is not agent:
                found.append(
                    checks.Error(
                        f"two agents are named {agent.name!r} (in {other[1]!r} and {path!r}); "
                        "a run names its agent, so a worker could not tell them apart",
                        hint="Give each agent its own name.",
                        id="durable_agents.E003",
                    )
                )
            named.setdefault(agent.name, (agent, path))
    return found


def _check_celery(settings: conf.Settings) -> list[checks.CheckMessage]:
    if settings.dispatch != "celery":
        return []
    found: list[checks.CheckMessage] = []
    if not getattr(django_settings, "CELERY_BROKER_URL", None):
        found.append(
            checks.Warning(
                "DURABLE_AGENTS['DISPATCH'] is 'celery' but CELERY_BROKER_URL is not set; "
                "Celery would try amqp://guest@localhost",
                hint=f"Set CELERY_BROKER_URL (e.g. 'redis://127.0.0.1:6379/0'). {CELERY_HINT}",
                id="durable_agents.W002",
            )
        )
    schedule = getattr(django_settings, "CELERY_BEAT_SCHEDULE", None) or {}
    for key, entry in schedule.items() if isinstance(schedule, dict) else ():
        if not isinstance(entry, dict) or entry.get("task") != RECOVER_TASK:
            continue
        queue = (entry.get("options") or {}).get("queue")
        if queue is not None and queue != settings.celery_queue:
            found.append(
                checks.Warning(
                    f"CELERY_BEAT_SCHEDULE[{key!r}] sends recovery passes to queue {queue!r}, "
                    f"but DURABLE_AGENTS['CELERY_QUEUE'] is {settings.celery_queue!r}",
                    hint=(
                        "Build the entry from your settings: CELERY_BEAT_SCHEDULE = "
                        "{**beat_schedule(DURABLE_AGENTS)} (from durable_agents.schedule "
                        f"import beat_schedule). {CELERY_HINT}"
                    ),
                    id="durable_agents.W001",
                )
            )
    return found


@checks.register(checks.Tags.database)
def check_audit_chains(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Opt-in (``AUDIT_CHECK_SAMPLE``): verify the audit chains of the latest runs."""
    from django.db import DatabaseError, connections

    from .audit import sample_check
    from .models import JournalEntry

    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems or not settings.audit_check_sample or settings.database not in (databases or ()):
        return []
    try:
        tables = connections[settings.database].introspection.table_names()
        if JournalEntry._meta.db_table not in tables:
            return []  # not migrated yet
        broken = sample_check(settings.audit_check_sample, using=settings.database)
    except DatabaseError:
        return []  # unreachable: other checks and commands say so
    return [
        checks.Error(
            f"audit chain of run {report.message()}",
            hint="Someone changed the journal behind the library's back, or a record was lost. "
            "`python manage.py durable_agents verify --all` lists every broken chain; see "
            f"{conf.DOCS_URL}audit.md",
            id="durable_agents.E004",
        )
        for report in broken
    ]
