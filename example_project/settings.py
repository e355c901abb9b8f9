"""Settings for the durable_agents example site.

Every value a deployment changes is read from the environment (or from an optional ``.env``
file next to ``manage.py``; see ``.env.example`` for the full list).

Two ways to run it:

* **Embedded demo** (no ``DATABASE_URL``): SQLite at ``<BASE_DIR>/.demo/db.sqlite3`` and runs
  driven inline in the web process. Nothing else to start. The ``.demo`` folder is created by
  the ``durable_agents demo`` command, not here.
* **Real deployment** (``DATABASE_URL`` set, e.g. ``docker compose up``): PostgreSQL, runs
  handed to Celery workers through Redis, Celery beat recovering runs a dead worker left
  behind.

Safe by default: ``DEBUG`` is off unless ``DJANGO_DEBUG=true``; outside debug the site
refuses to start with the development ``SECRET_KEY`` or webhook secret, and the security
settings (HTTPS redirect, HSTS, secure cookies) default to on, so ``manage.py check
--deploy`` is clean under the production environment docker-compose.yml shows. For local
development (the demo, runserver) set ``DJANGO_DEBUG=true``.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from durable_agents.celery.schedule import beat_schedule

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# An optional .env next to manage.py; real environment variables win over it.
_ENV_FILE = BASE_DIR / ".env"
if _ENV_FILE.is_file():
    env.read_env(_ENV_FILE)

# --- Core ------------------------------------------------------------------------------------

DEBUG = env.bool("DJANGO_DEBUG", default=False)

# Development-only values, refused outside debug (below).
DEV_SECRET_KEY = "django-insecure-durable-agents-example-dev-only-do-not-deploy"
DEV_WEBHOOK_SECRET = "dev-webhook-secret-change-me-before-deploying"

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEV_SECRET_KEY)
# Shared secret the inbound webhook checks on each delivery (DURABLE_AGENTS below).
WEBHOOK_SECRET = env.str("WEBHOOK_SECRET", default=DEV_WEBHOOK_SECRET)

if not DEBUG:
    _weak = [
        name
        for name, value, dev in (
            ("DJANGO_SECRET_KEY", SECRET_KEY, DEV_SECRET_KEY),
            ("WEBHOOK_SECRET", WEBHOOK_SECRET, DEV_WEBHOOK_SECRET),
        )
        if value == dev or value.startswith("django-insecure") or len(value) < 32
    ]
    if _weak:
        raise ImproperlyConfigured(
            f"{' and '.join(_weak)} must be set to a long random secret (at least 32 "
            "characters; 50 for DJANGO_SECRET_KEY to pass check --deploy) when DEBUG is off, "
            "e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'. For local "
            "development set DJANGO_DEBUG=true instead."
        )

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

# --- Security (secure by default outside debug; each one can be set from the environment) ---

# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (docker-compose's web service
# is meant to sit behind one): trust that header to know a request came over HTTPS.
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
# The container healthcheck speaks plain HTTP from inside the container.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool(
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG
)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=not DEBUG)
# Full origins (https://agents.example.com) allowed to POST forms to the admin.
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    # runserver leaves /static/ to WhiteNoise too, so development serves files as production does.
    "whitenoise.runserver_nostatic",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # Swagger UI of /api/docs from local static files, not a CDN
    "durable_agents",
    "example_project",  # the demo command lives in example_project/management
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's, Swagger UI's), before anything that reads the session or the
    # database: see STATIC_* below.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

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
            ],
        },
    },
]

WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

# --- Database --------------------------------------------------------------------------------

# Without DATABASE_URL the site is the embedded demo: one SQLite file under .demo/.
DEMO_DIR = Path(env.str("DURABLE_AGENTS_DEMO_DIR", default=str(BASE_DIR / ".demo")))
DEMO_DATABASE_PATH = DEMO_DIR / "db.sqlite3"

HAS_DATABASE_URL = bool(env.str("DATABASE_URL", default=""))
if not HAS_DATABASE_URL:
    DEMO_DIR.mkdir(parents=True, exist_ok=True)

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{DEMO_DATABASE_PATH}"),
}

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock when a transaction starts, so two writers queue on the
    # busy timeout instead of failing with "database is locked" halfway through; WAL lets
    # readers (the admin) proceed while a run is being journaled.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    # Workers keep their connection between tasks (with CELERY_DB_REUSE_MAX below), checked
    # before each reuse: docs/celery.md.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- durable_agents --------------------------------------------------------------------------

DURABLE_AGENTS = {
    # Dotted paths to Agent objects (or lists of them); imported when the app is ready and
    # in every worker process, so a worker can find an agent by name.
    "AGENTS": [
        "example_project.agents.support",
        "example_project.agents.refund_desk",
        "example_project.trips.trip",
        # Its tools are an MCP server's, listed when first needed: with the mcp extra only
        # (scripts/demo installs it).
        *(["example_project.stock.stock_desk"] if find_spec("mcp") else []),
    ],
    # "inline" drives runs in the calling process (embedded demo); "celery" hands them to
    # a worker after the transaction commits.
    "DISPATCH": env.str(
        "DURABLE_AGENTS_DISPATCH",
        default="celery" if HAS_DATABASE_URL else "inline",
    ),
    "LEASE_TTL": env.float("DURABLE_AGENTS_LEASE_TTL", default=30.0),
    "RECOVERY_INTERVAL": 15,
    "ON_DRIFT": "warn",
    "CELERY_QUEUE": "durable_agents",
    # The inbound webhook's secret (durable_agents.webhooks, mounted in urls.py).
    "WEBHOOK_SECRET": WEBHOOK_SECRET,
}

# --- Celery ----------------------------------------------------------------------------------
# Read by example_project/celery.py through config_from_object(namespace="CELERY").

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Run state lives in the journal, not in Celery results.
CELERY_TASK_IGNORE_RESULT = True
# A message is acknowledged only after its task returns, and put back if the worker process
# dies mid-task; one message at a time per worker process so a slow run does not hold others.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Workers survive a Redis restart: kombu's Redis transport, except that a channel left over
# from the lost connection fails like a lost connection instead of killing the worker
# (celery 5.7's close after collect(); see docs/celery.md, "When Redis restarts").
CELERY_BROKER_TRANSPORT = "durable_agents.celery.transport:Transport"
# Celery 6 turns this on by default: a broker blip would terminate the prefork children
# driving runs, and every run with a side effect in flight would halt for a person. The
# lease and late acks already make a second delivery harmless.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Celery's Django fixup closes every database connection around every task unless this is
# set (it then closes them every this-many tasks): docs/celery.md.
CELERY_DB_REUSE_MAX = 1000
# Keep reconnecting through a long outage instead of exiting after 100 tries (~46 min).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # How long Redis waits before redelivering an unacknowledged message. Beat recovery, not
    # redelivery, bounds how long a run can be stranded (one RECOVERY_INTERVAL after its lease
    # expires), so this stays long: a short value would redeliver runs that are still being
    # driven (the lease makes that harmless, but it is wasted work).
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
}

# Celery beat re-enqueues unfinished runs whose lease is free or expired.
#
# To manage the schedule from the admin with django-celery-beat instead: install it, add
# "django_celery_beat" to INSTALLED_APPS, migrate, start beat with
# `celery -A example_project beat -S django`, and create a PeriodicTask with
# task="durable_agents.tasks.recover_runs" on an IntervalSchedule of RECOVERY_INTERVAL
# seconds on the CELERY_QUEUE queue (then remove the entry below so it is not scheduled twice).
CELERY_BEAT_SCHEDULE = {**beat_schedule(DURABLE_AGENTS)}
# Beat writes its state file after every task it sends (by default: every three minutes),
# so the file's age tells whether beat is sending: docker-compose.yml's beat healthcheck.
CELERY_BEAT_SYNC_EVERY = 1

# --- Internationalization, static files ------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("DJANGO_STATIC_ROOT", default=BASE_DIR / "staticfiles")
# The site serves its own static files (the admin's, Swagger UI's) with WhiteNoise, so one
# process is the whole site: from the web process's memory-mapped files, without a view, a
# database query or a thread held for long. `collectstatic` (the Dockerfile runs it when it
# builds the image) names each file by a hash of its content and compresses it; WhiteNoise
# then serves those names with a cache lifetime of a year (they never change) and the
# compressed copy to browsers that take it. Outside debug a page that names a static file
# collectstatic did not collect fails (a 500) instead of linking a file that is not there.
# In debug WhiteNoise serves the apps' files directly, no collectstatic needed.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# A site whose web server or CDN serves STATIC_ROOT sets DJANGO_SERVE_STATIC=false.
SERVE_STATIC = env.bool("DJANGO_SERVE_STATIC", default=True)
if not SERVE_STATIC:
    MIDDLEWARE.remove("whitenoise.middleware.WhiteNoiseMiddleware")

# --- Logging ---------------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "durable_agents": {
            "handlers": ["console"],
            "level": env.str("DURABLE_AGENTS_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
    },
}
