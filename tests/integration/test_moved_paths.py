"""The database and Celery glue moved into ``durable_agents.database`` and
``durable_agents.celery``; what sites wrote against the old paths (settings above all) keeps
working, warns, and is the very same module, not a copy."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from kombu.utils.imports import symbol_by_name

from durable_agents._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new
    assert sys.modules[old] is new


def test_what_the_old_readme_told_sites_to_write_still_works():
    for old in ("durable_agents.schedule", "durable_agents.storage"):
        sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning):
        from durable_agents.schedule import beat_schedule
        from durable_agents.storage import DjangoStore
    from durable_agents.celery.schedule import beat_schedule as new_beat_schedule
    from durable_agents.database.store import DjangoStore as NewDjangoStore

    assert beat_schedule is new_beat_schedule and DjangoStore is NewDjangoStore
    sys.modules.pop("durable_agents.celery_transport", None)
    with pytest.warns(DeprecationWarning):
        transport = symbol_by_name("durable_agents.celery_transport:Transport")
    assert transport is symbol_by_name("durable_agents.celery.transport:Transport")


def test_task_names_do_not_follow_the_module():
    """A message queued before an upgrade names ``durable_agents.tasks.drive_run``; the task
    must still answer to it, and Celery's autodiscovery still imports ``durable_agents.tasks``."""
    import durable_agents.tasks as hook
    from durable_agents.celery import tasks

    assert hook.drive_run is tasks.drive_run
    assert {
        t.name for t in (tasks.drive_run, tasks.wake_timers, tasks.recover_runs, tasks.prune)
    } == {
        "durable_agents.tasks.drive_run",
        "durable_agents.tasks.wake_timers",
        "durable_agents.tasks.recover_runs",
        "durable_agents.tasks.prune",
    }


def test_celery_inside_the_package_is_still_celery():
    """``durable_agents.celery`` is a package of ours; ``import celery`` anywhere (ours or the
    site's) must still be Celery, before and after ours is imported."""
    code = (
        "import durable_agents.celery, celery, durable_agents.celery.transport as t; "
        "from celery import Celery; print(Celery.__module__, t.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["celery.app.base", "durable_agents.celery.transport"]


def test_an_unknown_old_looking_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("durable_agents.storages")
