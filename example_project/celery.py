"""The example site's Celery app.

Workers: ``celery -A example_project worker -Q durable_agents,celery -l info``
Beat:    ``celery -A example_project beat -l info``

Every ``CELERY_*`` Django setting configures it (see settings.py); tasks are found in each
installed app's ``tasks`` module, so ``durable_agents.tasks`` registers ``drive_run`` and
``recover_runs``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
