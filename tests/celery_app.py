"""The Celery app test workers run: `celery -A tests.celery_app worker -Q <queue>`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["durable_agents"])

# Telemetry tests (DA_OTEL_FILE) read the spans this worker ends from a file.
if os.environ.get("DA_OTEL_FILE"):
    from tests.support.otel import export_from_env

    export_from_env()

# Tests that run a real `celery beat` set DA_BEAT_RECOVERY=1: one recovery pass every
# DA_RECOVERY_INTERVAL seconds (the DURABLE_AGENTS["RECOVERY_INTERVAL"] of tests/settings.py),
# sent to the test's own queue (DA_CELERY_QUEUE), where its workers pick it up.
if os.environ.get("DA_BEAT_RECOVERY"):
    app.conf.beat_schedule = {
        "durable-agents-recover-runs": {
            "task": "durable_agents.tasks.recover_runs",
            "schedule": float(os.environ.get("DA_RECOVERY_INTERVAL", "15")),
            "options": {"queue": os.environ.get("DA_CELERY_QUEUE", "durable_agents")},
        }
    }
