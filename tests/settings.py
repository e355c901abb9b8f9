"""Settings for the test suite: PostgreSQL as `default`, SQLite as `sqlite`.

Subprocesses started by tests (crash and race tests) point at the test databases through
DA_PG_NAME / DA_SQLITE_NAME, which the parent sets to the names pytest-django created.
"""

import os
import tempfile
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_sqlite_dir = Path(os.environ.get("DA_SQLITE_DIR", tempfile.gettempdir()))

# Where the example site's tools write their side-effect ledger (example_project.agents). A
# test that counts those effects gives itself a folder of its own (DA_DEMO_DIR for the child
# processes it starts: tests/integration/test_webhook.py); the rest write here.
DEMO_DIR = Path(os.environ.get("DA_DEMO_DIR") or Path(tempfile.gettempdir()) / "da-demo")

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DA_PG_NAME", "durable_agents"),
        "USER": os.environ.get("DA_PG_USER", "postgres"),
        "HOST": os.environ.get("DA_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DA_PG_PORT", "5432"),
        # Workers keep their connection between tasks (benchmarks set it; 0 in tests).
        "CONN_MAX_AGE": int(os.environ.get("DA_CONN_MAX_AGE", "0")),
        "TEST": {"NAME": os.environ.get("DA_PG_TEST_NAME") or None},
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DA_SQLITE_NAME", str(_sqlite_dir / "durable_agents.sqlite3")),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL;",
        },
        "TEST": {
            "NAME": os.environ.get("DA_SQLITE_TEST_NAME")
            or str(_sqlite_dir / f"test_durable_agents_{os.getpid()}.sqlite3")
        },
    },
}

# The PgBouncer tests (tests/support/pgbouncer.py) point a child's `default` at the pooler
# (DA_PG_PORT) and add `direct`: the same database on PostgreSQL itself.
if os.environ.get("DA_PG_DIRECT_PORT"):
    DATABASES["direct"] = {
        **DATABASES["default"],
        "PORT": os.environ["DA_PG_DIRECT_PORT"],
        "TEST": {"MIRROR": "default"},
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # Swagger UI of /api/docs from local static files, not a CDN
    "durable_agents",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"

# The example site's webhook and support agent are tested here too.
WEBHOOK_SECRET = "tests-webhook-secret-not-for-production"
DEMO_DIR = Path(os.environ.get("DA_DEMO_DIR", tempfile.gettempdir())) / "da-test-demo"

DURABLE_AGENTS = {
    "AGENTS": [
        "example_project.agents.support",
        "example_project.agents.refund_desk",
        "tests.support.agents",
        "tests.support.celery_agents",
        "tests.support.holes",
        "tests.support.inbox_agents",
        "tests.support.limit_agents",
        "tests.support.rule_agents",
        "tests.support.trust_agents",
        # Benchmarks add their own agents (bench/throughput.py).
        *[a for a in os.environ.get("DA_EXTRA_AGENTS", "").split(",") if a],
    ],
    # Tests that start Celery workers set DA_DISPATCH=celery and a queue of their own.
    "DISPATCH": os.environ.get("DA_DISPATCH", "inline"),
    "CELERY_QUEUE": os.environ.get("DA_CELERY_QUEUE", "durable_agents"),
    "RECOVERY_INTERVAL": float(os.environ.get("DA_RECOVERY_INTERVAL", "15")),
    # Child processes of crash tests run with a short lease, so a killed driver's run can be
    # taken over quickly by the process that resumes it.
    "LEASE_TTL": float(os.environ.get("DA_LEASE_TTL", "30")),
    # Child processes of crash tests may drive on SQLite, or without prepared statements.
    "DATABASE": os.environ.get("DA_DATABASE", "default"),
    # Unset: the default (on, unless behind a transaction pooler).
    "PREPARED_STATEMENTS": {"1": True, "0": False}.get(os.environ.get("DA_PREPARED", "")),
    # Children of the PgBouncer tests reach `default` through a transaction pooler.
    "TRANSACTION_POOLING": os.environ.get("DA_POOLING") == "1",
    "DIRECT_DATABASE": os.environ.get("DA_DIRECT_DATABASE") or None,
    # Halts resolve at once in tests (the default, twice LEASE_TTL, is tested on its own).
    "HALT_MIN_AGE": float(os.environ.get("DA_HALT_MIN_AGE", "0")),
    # The shipped webhook view (tests/urls.py) checks deliveries against it.
    "WEBHOOK_SECRET": WEBHOOK_SECRET,
    # Children of the telemetry tests export their spans to this file (tests/support/otel.py).
    "TELEMETRY": bool(os.environ.get("DA_OTEL_FILE")),
}

# The secret outbound notification webhooks are signed with in tests (docs/notifications.md).
NOTIFY_HOOK_SECRET = "tests-notify-hook-secret-not-for-production"
# Children of the notification crash test tell a webhook of the parent's (a real receiver).
if os.environ.get("DA_NOTIFY_URL"):
    DURABLE_AGENTS["NOTIFY"] = {
        "BASE_URL": "https://ops.example.com",
        "CHANNELS": [
            {
                "kind": "webhook",
                "url": os.environ["DA_NOTIFY_URL"],
                "secret_setting": "NOTIFY_HOOK_SECRET",
            }
        ],
    }

# Celery (tests/celery_app.py): a Redis database of its own, late acks, one message at a time.
CELERY_BROKER_URL = os.environ.get("DA_BROKER_URL", "redis://127.0.0.1:6379/9")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
# What docs/celery.md asks of every site: workers that survive a Redis restart, and no
# cancelled drives on a broker blip.
CELERY_BROKER_TRANSPORT = "durable_agents.celery.transport:Transport"
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Celery's Django fixup closes every database connection before and after each task unless
# this is set (then every this-many tasks): docs/celery.md. Tests keep Celery's default
# (CONN_MAX_AGE 0 closes them anyway); the throughput benchmark sets it, as a site should.
CELERY_DB_REUSE_MAX = int(os.environ.get("DA_CELERY_DB_REUSE_MAX", "0")) or None
