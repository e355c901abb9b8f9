"""A Celery broker that is down, for the tests of what a failed hand-over does: the run is
committed, the caller says so, and recovery hands it over later."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery import Celery
from celery import _state as celery_state
from django.conf import settings
from django.test.utils import override_settings

import durable_agents.tasks  # noqa: F401  (registers drive_run with the Celery app below)


@contextmanager
def broker_down() -> Iterator[None]:
    """Dispatch through Celery to a broker nothing listens on (port 1), failing at once: the
    test's app is current and default (as in tests/browser/conftest.py), without retries."""
    previous_current = celery_state._tls.current_app
    previous_default = celery_state.default_app
    broker = "redis://127.0.0.1:1/0"
    app = Celery("da-tests-broker-down", broker=broker, set_as_current=True)
    app.conf.update(
        broker_connection_timeout=1,
        broker_connection_max_retries=0,
        task_publish_retry=False,
        task_ignore_result=True,
    )
    app.set_default()
    dispatch = override_settings(
        DURABLE_AGENTS={**settings.DURABLE_AGENTS, "DISPATCH": "celery"},
        CELERY_BROKER_URL=broker,
    )
    dispatch.enable()
    try:
        yield
    finally:
        dispatch.disable()
        app.close()
        celery_state.set_default_app(previous_default)
        celery_state._set_current_app(previous_current)
