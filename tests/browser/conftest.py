"""Fixtures for browser tests: headless Debian Chromium driven by Playwright's sync API
against pytest-django's live server, and a real Celery worker the live server dispatches to
(the helpers they use are in tests/support/browser.py).

A missing browser fails the tests: it never skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from celery import _state as celery_state
from django.conf import settings
from django.test.utils import override_settings
from pytest_django.live_server_helper import LiveServer

import durable_agents.tasks  # noqa: F401  (registers drive_run with the test's Celery app)
from tests.support.browser import CHROMIUM, Browser, Celery
from tests.support.workers import CeleryProcesses, CeleryTarget


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """pytest-django's live server, on 127.0.0.1 unless ``--liveserver`` says otherwise."""
    addr = (
        request.config.getvalue("liveserver")
        or os.getenv("DJANGO_LIVE_TEST_SERVER_ADDRESS")
        or "127.0.0.1"
    )
    server = LiveServer(addr)
    yield server
    server.stop()


# -- the browser and a real Celery worker ------------------------------------------------


@pytest.fixture
def browser(live_server: LiveServer) -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: browser tests need Debian's Chromium "
            "(apt-get install -y chromium). They fail rather than skip without it.",
            pytrace=False,
        )
    opened = Browser(live_server.url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def celery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    """This process, and the live server's threads in it, dispatch runs through Celery to a
    queue of the test's own; every worker the test starts is killed (its whole process
    group) when it ends.

    Celery's "current app" is per thread: the live server answers each request in a thread
    of its own, where ``drive_run.apply_async`` publishes through the *default* app. So the
    test's app is made both the current app here and the default app for every thread, and
    both are put back afterwards.
    """
    target = CeleryTarget.fresh(os.environ.get("PYTEST_XDIST_WORKER", "master"))
    previous_current = celery_state._tls.current_app
    previous_default = celery_state.default_app
    app = target.app()
    app.set_default()
    target.purge(app)
    # Worker logs go beside the test's tmp_path, which holds only its screenshots.
    procs = CeleryProcesses(target, tmp_path_factory.mktemp("celery-logs"))
    dispatch = override_settings(
        DURABLE_AGENTS={
            **settings.DURABLE_AGENTS,
            "DISPATCH": "celery",
            "CELERY_QUEUE": target.queue,
        },
        CELERY_BROKER_URL=target.broker_url,
    )
    dispatch.enable()
    try:
        yield Celery(target, procs)
    finally:
        dispatch.disable()
        procs.kill_all()  # os.killpg(SIGKILL) on each worker's process group
        try:
            target.purge(app)
            target.clean()
        finally:
            app.close()
            celery_state.set_default_app(previous_default)
            celery_state._set_current_app(previous_current)
