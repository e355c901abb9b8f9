"""The example's docker-compose.yml runs the worker and beat under a restart policy (issue
17): a worker or beat that exits after a long broker outage, or on an error Celery calls
unrecoverable, is not replaced by Celery itself. There is no Docker engine in the suite, so
this reads the file as compose would (YAML)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_web_worker_and_beat_restart_unless_stopped():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["web"]["restart"] == "unless-stopped"
    assert services["worker"]["restart"] == "unless-stopped"
    assert services["beat"]["restart"] == "unless-stopped"
    assert "celery" in services["worker"]["command"] and "beat" in services["beat"]["command"]


def test_worker_runs_the_threads_pool_docs_celery_advises():
    """docs/celery.md prefers the threads pool (model calls are I/O; a stop ends a drive
    after its step in flight); the compose worker must not fall back to prefork."""
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"][
        "command"
    ]
    args = command.split()
    assert args[args.index("--pool") + 1] == "threads", command
    assert "-c" in args, command  # threads default to one per CPU: say how many
