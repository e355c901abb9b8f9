"""Warm shutdown: a worker told to stop (SIGTERM) finishes the step in flight, releases the
run's lease and leaves the run for another driver.

Celery's ``worker_shutting_down`` signal fires in the worker's main process. Drives run
there with the ``threads`` and ``solo`` pools, which is what we recommend for the
durable_agents queue (model calls are I/O). With the ``prefork`` pool the child running a
drive does not hear it: Celery lets the task run to its end (or a pause) before exiting.
"""

from __future__ import annotations

import threading
from typing import Any

_stopping = threading.Event()


def shutting_down() -> bool:
    return _stopping.is_set()


def _on_worker_shutting_down(sender: Any = None, how: Any = None, **kwargs: Any) -> None:
    _stopping.set()


try:
    from celery.signals import worker_shutting_down

    worker_shutting_down.connect(_on_worker_shutting_down, weak=False)
except ImportError:  # pragma: no cover - celery is a dependency
    pass
