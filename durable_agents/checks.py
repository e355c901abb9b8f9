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
* ``durable_agents.E007`` — ``DISPATCH`` is ``"celery"`` but this process has no Celery app of
  the site's (the README's ``mysite/__init__.py`` block is missing: hand-overs would go to
  Celery's default broker, where no worker listens), or its app sends to another broker than
  ``CELERY_BROKER_URL`` (it is not configured from the Django settings).
* ``durable_agents.E008`` — a webhook cannot verify deliveries: ``WEBHOOK_SECRET`` (or the
  setting a view's ``secret_setting`` names) is missing, short or weak. The view answers 503
  until it is fixed. Likewise a notification channel's ``secret_setting`` (an outbound
  webhook cannot sign: its notifications wait, tried again, until it is fixed). While
  ``migrate`` runs (checks given a database) it is the warning
  ``durable_agents.W008``: a deploy may migrate before its secrets are in place.
* ``durable_agents.W003`` — runs have waited in the queue for several recovery intervals with
  no driver (``queue_health``): likely no worker consumes ``CELERY_QUEUE``. It reads the
  database, so it runs with ``manage.py check --database default`` (and ``migrate``).
* ``durable_agents.I001`` — ``TRANSACTION_POOLING`` is on with a ``DIRECT_DATABASE``: says
  what is in force behind the pooler (instant takeover and live events on the direct
  connection; prepared statements on or off).
* ``durable_agents.W004`` — ``TRANSACTION_POOLING`` is on without a ``DIRECT_DATABASE`` (or
  with ``INSTANT_TAKEOVER`` off): a dead worker's runs are taken over when their lease
  expires (``LEASE_TTL``), not at once, and live events poll.
* ``durable_agents.E005`` — the ``DATABASE`` (or ``DIRECT_DATABASE``) alias reaches PostgreSQL
  through a transaction pooler, but the settings do not say so: session locks and prepared
  statements would leak to other clients' server connections. It connects, so it runs with
  ``manage.py check --database default`` (docs/pgbouncer.md).
* ``durable_agents.E006`` — ``TRANSACTION_POOLING`` is on but the alias's ``OPTIONS`` set a
  psycopg ``prepare_threshold``: psycopg would prepare statements through the pooler.
* ``durable_agents.E004`` — the audit chain of one of the ``AUDIT_CHECK_SAMPLE`` most
  recently updated runs does not verify (docs/audit.md). Off unless that setting is set;
  it reads the database like W003.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from . import conf
from .agent_loader import agents_at
from .celery.schedule import RECOVER_TASK
from .engine.errors import AgentPathError

SETTINGS_HINT = (
    f"Fix the DURABLE_AGENTS dict in your settings; every key: {conf.DOCS_URL}settings.md"
)
AGENTS_HINT = (
    "DURABLE_AGENTS['AGENTS'] lists dotted paths to Agent objects, lists of them, or modules "
    f"defining them: {conf.DOCS_URL}settings.md"
)
CELERY_HINT = f"Wire Celery into your project: {conf.DOCS_URL}celery.md"
POOLER_HINT = f"Behind PgBouncer: {conf.DOCS_URL}pgbouncer.md"


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems:
        return [checks.Error(p, hint=SETTINGS_HINT, id="durable_agents.E001") for p in problems]
    return [
        *_check_agents(settings.agents),
        *_check_channels(settings),
        *_check_celery(settings),
        *_check_pooler(settings),
    ]


def _check_channels(settings: conf.Settings) -> list[checks.CheckMessage]:
    """A notification channel of the site's own (a dotted ``kind``) imports to something
    that builds a channel: ``conf.parse`` cannot import it (settings.py builds the beat
    schedule before the site's modules can be imported)."""
    from django.utils.module_loading import import_string

    out: list[checks.CheckMessage] = []
    for i, channel in enumerate(settings.notify.channels):
        if channel.kind in conf.CHANNEL_KINDS:
            continue
        where = f"DURABLE_AGENTS['NOTIFY']['CHANNELS'][{i}]['kind']"
        try:
            found = import_string(channel.kind)
        except ImportError as exc:
            problem = f"{where} is {channel.kind!r}, which cannot be imported: {exc}"
        else:
            if callable(found):
                continue
            problem = (
                f"{where} is {channel.kind!r}, which is not a class or function building a "
                "channel (called with the channel's config; its result has send(notice))"
            )
        out.append(
            checks.Error(
                problem,
                hint=f"Channels of your own: {conf.DOCS_URL}notifications.md#a-channel-of-your-own",
                id="durable_agents.E001",
            )
        )
    return out


@checks.register(checks.Tags.urls)
def check_webhooks(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every mounted ``InboundWebhook`` has a usable secret, and so has ``WEBHOOK_SECRET``
    when it is set at all."""
    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems:
        return []  # E001 says what to fix first
    found: dict[str, str] = {}  # problem -> where
    if settings.webhook_secret_problem:
        found[settings.webhook_secret_problem] = ""
    for path, view in _webhook_views():
        from .webhooks import secret_problem

        problem = secret_problem(view)
        if problem:
            found[problem] = found.get(problem) or path
    for channel in settings.notify.channels:
        if channel.kind == "webhook":
            from .notifications.webhook import secrets_of

            _, problem = secrets_of(channel)
            if problem:
                found[
                    f"{problem} (notification channel {channel.name!r}: its notifications "
                    "wait, tried again, until it is fixed)"
                ] = ""
    # Under migrate a deploy may not have its secrets yet: said, not stopped.
    migrating = databases is not None
    level, ident = (checks.Warning, "W008") if migrating else (checks.Error, "E008")
    return [
        level(
            problem + (f" (the webhook at /{path} answers 503 until it is fixed)" if path else ""),
            hint="Read the secret from the environment and share it with the sender: "
            f"{conf.DOCS_URL}sessions.md#the-webhook-view",
            id=f"durable_agents.{ident}",
        )
        for problem, path in found.items()
    ]


def _webhook_views() -> list[tuple[str, Any]]:
    """(route, view) of every ``InboundWebhook`` the URLconf mounts. A URLconf that does not
    import is Django's own check's to report."""
    from django.urls import URLPattern, URLResolver, get_resolver

    from .webhooks import InboundWebhook

    out: list[tuple[str, Any]] = []

    def walk(patterns: Any, prefix: str) -> None:
        for item in patterns:
            if isinstance(item, URLResolver):
                walk(item.url_patterns, prefix + str(item.pattern))
            elif isinstance(item, URLPattern):
                view_class = getattr(item.callback, "view_class", None)
                if isinstance(view_class, type) and issubclass(view_class, InboundWebhook):
                    out.append((prefix + str(item.pattern), item.callback))

    try:
        walk(get_resolver().url_patterns, "")
    except Exception:
        return []
    return out


@checks.register(checks.Tags.database)
def check_queue_health(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from django.db import DatabaseError, connections

    from .celery.queue_health import stalled_runs
    from .models import Run

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


def _check_site_app() -> list[checks.CheckMessage]:
    """The app hand-overs are sent with must be the site's, on the workers' broker."""
    from .celery.site_app import site_app

    app = site_app()
    if app is None:
        return [
            checks.Error(
                "DURABLE_AGENTS['DISPATCH'] is 'celery' but no Celery app of this site is "
                "loaded in this process: runs would be handed to Celery's default app "
                "(broker amqp://guest@localhost), where no worker listens, and would move only "
                "at the next recovery pass",
                hint="Load the site's Celery app whenever Django starts: the README's "
                "mysite/__init__.py block (from .celery import app as celery_app; __all__ = "
                f"('celery_app',)). {CELERY_HINT}",
                id="durable_agents.E007",
            )
        ]
    wanted = getattr(django_settings, "CELERY_BROKER_URL", None)
    sends_to = app.conf.broker_url
    if wanted and sends_to != wanted:
        return [
            checks.Error(
                f"this process hands runs over with the Celery app {app.main!r}, whose broker "
                f"is {_safe_url(sends_to)!r}, but CELERY_BROKER_URL is {_safe_url(wanted)!r}: "
                "workers started with `celery -A <your site>` would not see the messages",
                hint="Configure the app from the Django settings, as the README's "
                "mysite/celery.py block does: app.config_from_object('django.conf:settings', "
                f"namespace='CELERY'). {CELERY_HINT}",
                id="durable_agents.E007",
            )
        ]
    return []


def _safe_url(url: Any) -> str:
    """A broker URL as a check may print it: without its password."""
    from kombu.utils.url import maybe_sanitize_url

    return str(maybe_sanitize_url(str(url)))


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
    found += _check_site_app()
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
                        "{**beat_schedule(DURABLE_AGENTS)} (from durable_agents.celery.schedule "
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

    from .database.audit import sample_check
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


def _check_pooler(settings: conf.Settings) -> list[checks.CheckMessage]:
    """Which takeover is in force behind a transaction pooler (or that none is needed)."""
    if not settings.transaction_pooling:
        return []
    found: list[checks.CheckMessage] = []
    databases = getattr(django_settings, "DATABASES", {}) or {}
    options = (databases.get(settings.database) or {}).get("OPTIONS") or {}
    if options.get("prepare_threshold") is not None:
        found.append(
            checks.Error(
                f"DATABASES[{settings.database!r}]['OPTIONS'] sets prepare_threshold "
                f"{options['prepare_threshold']!r}, but DURABLE_AGENTS['TRANSACTION_POOLING'] "
                "says it goes through a transaction pooler: psycopg would prepare statements "
                "on one server connection and run them on another",
                hint=f"Remove prepare_threshold (or set it to None). {POOLER_HINT}",
                id="durable_agents.E006",
            )
        )
    prepared = (
        "prepared statements on (PgBouncer 1.21 or later with max_prepared_statements > 0 only)"
        if settings.use_prepared
        else "prepared statements off"
    )
    if settings.use_instant_takeover:
        found.append(
            checks.Info(
                f"behind a transaction pooler (DATABASE {settings.database!r}): instant "
                "takeover and live events use the direct connection of DIRECT_DATABASE "
                f"{settings.direct_database!r}; {prepared}",
                id="durable_agents.I001",
            )
        )
        return found
    why = (
        "INSTANT_TAKEOVER is off"
        if not settings.instant_takeover
        else "no DIRECT_DATABASE holds the liveness locks"
    )
    found.append(
        checks.Warning(
            f"behind a transaction pooler (DATABASE {settings.database!r}) and {why}: a "
            "dead worker's runs are taken over only when their lease expires (LEASE_TTL = "
            f"{settings.lease_ttl:g} s), not at once; live events poll; {prepared}",
            hint=(
                "Set DURABLE_AGENTS['DIRECT_DATABASE'] to an alias that reaches the same "
                "database without the pooler, for instant takeover and LISTEN; or silence "
                f"durable_agents.W004 if lease expiry will do. {POOLER_HINT}"
            ),
            id="durable_agents.W004",
        )
    )
    return found


@checks.register(checks.Tags.database)
def check_pooler_detected(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The aliases that keep session state must not go through a transaction pooler
    unbeknownst to the settings (it connects: ``--database``)."""
    settings, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    if problems:
        return []
    asked = set(databases or ())
    found: list[checks.CheckMessage] = []
    direct = settings.direct_database
    # Without TRANSACTION_POOLING, DATABASE holds session locks and prepared statements.
    probe = [] if settings.transaction_pooling else [("DATABASE", settings.database)]
    if direct is not None and settings.use_instant_takeover:
        probe.append(("DIRECT_DATABASE", direct))
    for key, alias in probe:
        if alias not in asked or not _pooled(alias):
            continue
        if key == "DATABASE":
            message = (
                f"database {alias!r} (DURABLE_AGENTS['DATABASE']) reaches PostgreSQL through a "
                "transaction pooler — a session setting made on one connection showed on "
                "another — but DURABLE_AGENTS['TRANSACTION_POOLING'] is off: liveness locks "
                "and prepared statements would land on server connections other clients use"
            )
            hint = "Set DURABLE_AGENTS['TRANSACTION_POOLING'] = True (and DIRECT_DATABASE)."
        else:
            message = (
                f"DURABLE_AGENTS['DIRECT_DATABASE'] {alias!r} reaches PostgreSQL through a "
                "transaction pooler (a session setting made on one connection showed on "
                "another): the liveness locks it holds would not be held"
            )
            hint = "Point it at PostgreSQL itself (its host and port, not the pooler's)."
        found.append(checks.Error(message, hint=f"{hint} {POOLER_HINT}", id="durable_agents.E005"))
    return found


def _pooled(alias: str) -> bool:
    """Whether ``alias`` is behind a transaction pooler: two clients of it share a server
    connection. A session setting made by one client and seen by the other, or a client
    moved to another server process between two statements, can only be a pooler; a
    direct connection (or a session pooler) shows neither. May miss a pooler (then it says
    nothing), never invents one."""
    import secrets

    import psycopg
    from django.db import connections

    if connections[alias].vendor != "postgresql":
        return False
    params = dict(connections[alias].get_connection_params())
    for key in ("cursor_factory", "context"):
        params.pop(key, None)
    params["prepare_threshold"] = None
    name, mark = "durable_agents.pool_probe", secrets.token_hex(8)
    try:
        with (
            psycopg.connect(**params, autocommit=True) as first,
            psycopg.connect(**params, autocommit=True) as second,
        ):
            row = first.execute(
                "SELECT pg_backend_pid(), set_config(%s, %s, false)", [name, mark]
            ).fetchone()
            with second.transaction():  # keeps its server connection while ``first`` asks
                other = second.execute(
                    "SELECT pg_backend_pid(), current_setting(%s, true)", [name]
                ).fetchone()
                again = first.execute(
                    "SELECT pg_backend_pid(), current_setting(%s, true)", [name]
                ).fetchone()
            first.execute("SELECT set_config(%s, '', false)", [name])
    except psycopg.Error:
        return False  # unreachable: other checks and commands say so
    assert row is not None and other is not None and again is not None
    shared = other[0] == row[0] or other[1] == mark
    moved = again[0] != row[0] or again[1] != mark
    return bool(shared or moved)
