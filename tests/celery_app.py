"""The Celery app test workers run: `celery -A tests.celery_app worker -Q <queue>`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["durable_agents"])
