"""A Celery worker refuses to start on a ``DURABLE_AGENTS['AGENTS']`` entry that does not
import (issue 31): before this, it reported ``ready.``, took a run and failed it.

Real ``celery worker`` subprocesses on Redis and the PostgreSQL test database
(``tests.support.workers``); the bad entry comes through ``DA_EXTRA_AGENTS``, which
``tests/settings.py`` appends to ``AGENTS``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from celery import _state as celery_state

import durable_agents.tasks  # noqa: F401 - registers drive_run with the test's Celery app
from durable_agents.models import Run
from tests.support.celery_agents import ANSWER, steps
from tests.support.workers import CeleryProcesses, CeleryTarget, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]

BAD_PATH = "tests.support.no_such_module.agent"


@pytest.fixture
def celery(settings, tmp_path: Path):
    target = CeleryTarget.fresh(os.environ.get("PYTEST_XDIST_WORKER", "master"))
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "DISPATCH": "celery",
        "CELERY_QUEUE": target.queue,
    }
    previous = celery_state.get_current_app()
    app = target.app()
    procs = CeleryProcesses(target, tmp_path)
    try:
        yield target, procs
    finally:
        procs.kill_all()
        target.purge(app)
        app.close()
        target.clean()
        previous.set_current()


@pytest.mark.timeout(120)
def test_a_worker_with_a_misspelled_agent_path_exits_before_consuming(celery):
    target, procs = celery
    run_id = steps.start("go", run_id=f"bad-path-{uuid.uuid4().hex[:8]}")
    assert target.queue_length() == 1

    worker = procs.worker(DA_EXTRA_AGENTS=BAD_PATH)
    code = worker.wait_exit(60)
    log = worker.log()
    assert code != 0, log
    # What `manage.py check` says, id, message and hint.
    assert "(durable_agents.E002)" in log and BAD_PATH in log and "HINT:" in log, log
    assert "cannot be imported" in log and "this worker does not start" in log, log
    assert "ready." not in log and "received" not in log, log
    assert target.queue_length() == 1, "the run's message was consumed"
    assert Run.objects.get(run_id=run_id).status == "queued"

    # The setting fixed, a worker starts and drives the same message's run.
    good = procs.worker().wait_ready()
    wait_for(
        lambda: Run.objects.get(run_id=run_id).status == "finished",
        60,
        f"the run to finish:\n{good.log()}",
    )
    assert Run.objects.get(run_id=run_id).answer == ANSWER
    assert good.alive()


@pytest.mark.timeout(180)
def test_a_worker_started_before_migrate_says_so_once_and_starts_once_migrated(celery):
    """Issue 44, item 4: before this, the worker said ``ready.`` and then printed a
    ``ProgrammingError`` traceback every few seconds."""
    import subprocess
    import sys
    import time

    import psycopg
    from django.db import connections

    from tests.support.procs import ROOT, subprocess_env

    _target, procs = celery
    name = f"da_unmigrated_{uuid.uuid4().hex[:8]}"
    params = connections["default"].settings_dict
    admin = psycopg.connect(
        dbname="postgres", user=params["USER"], host=params["HOST"], port=params["PORT"]
    )
    admin.autocommit = True
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        worker = procs.worker(DA_PG_NAME=name)
        said = "the database is not migrated"
        log = worker.wait_for_log(said, 60)
        assert "python manage.py migrate" in log, log
        time.sleep(6)  # more than one look again: each one quiet
        log = worker.log()
        assert log.count(said) == 1 and "Traceback" not in log and "ready." not in log, log
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=ROOT,
            env=subprocess_env(DA_PG_NAME=name),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, migrate.stderr
        worker.wait_ready(60)
        log = worker.log()
        assert "the database is migrated; this worker starts" in log
        assert "Traceback" not in log, log
    finally:
        procs.kill_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
