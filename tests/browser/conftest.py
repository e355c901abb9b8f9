"""Fixtures for browser tests: headless Debian Chromium driven by Playwright's sync API
against pytest-django's live server, and a real Celery worker the live server dispatches to.

Playwright cannot download its own browsers here; it launches ``/usr/bin/chromium``
(``apt-get install -y chromium``). A missing browser fails the tests: it never skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import _state as celery_state
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test.utils import override_settings
from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import Page, Playwright, expect, sync_playwright
from pytest_django.live_server_helper import LiveServer

import durable_agents.tasks  # noqa: F401  (registers drive_run with the test's Celery app)
from durable_agents.models import JournalEntry, Run
from tests.support.workers import CeleryProcess, CeleryProcesses, CeleryTarget, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_TIMEOUT_MS = 15_000  # any navigation, click or fill
RUN_TIMEOUT = 30.0  # a worker drives a scripted run in well under a second
PASSWORD = "browser-test-password"


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


# -- the browser --------------------------------------------------------------------------


class Browser:
    """One headless Chromium for one test, launched on first use.

    While Playwright's sync API is running, the test's thread has a running asyncio loop, so
    Django would refuse every ORM call the test makes (``SynchronousOnlyOperation``). The
    test's own queries are plain synchronous code, so ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set
    for exactly as long as the browser is open (and the connections those queries open are
    closed before it shuts). Launching late also keeps the variable out of the environment
    of subprocesses (workers, drivers) the test starts before.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._playwright: Playwright | None = None
        self._browser: PlaywrightBrowser | None = None
        self._page: Page | None = None
        self._env_before: str | None = None

    def page(self) -> Page:
        if self._page is None:
            self._env_before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            context = self._browser.new_context(
                base_url=self.base_url, viewport={"width": 1280, "height": 900}
            )
            self._page = context.new_page()
            self._page.set_default_timeout(PAGE_TIMEOUT_MS)
        return self._page

    def close(self) -> None:
        try:
            if self._playwright is not None:
                # Queries made while the loop runs use connections Django keeps per asyncio
                # context, not the thread's: close them while that context is still current,
                # or they outlive the test and the test database cannot be dropped.
                connections.close_all()
            if self._browser is not None:
                self._browser.close()
        finally:
            if self._playwright is not None:
                self._playwright.stop()
            self._playwright, self._browser, self._page = None, None, None
            if self._env_before is None:
                os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
            else:
                os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = self._env_before


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


def login(page: Page, username: str, password: str = PASSWORD) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form [type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)


def staff_user(name: str, *perms: str) -> User:
    """A staff user (not a superuser) holding exactly ``perms``, with a password."""
    user = User.objects.create_user(name, password=PASSWORD, is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


# -- a real Celery worker -----------------------------------------------------------------


@dataclass
class Celery:
    target: CeleryTarget
    procs: CeleryProcesses

    def worker(self) -> CeleryProcess:
        """Start ``celery -A tests.celery_app worker`` on the test's queue (not yet ready)."""
        return self.procs.worker("threads", 1)


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


def wait_status(run_id: str, wanted: str, *workers: CeleryProcess) -> Run:
    """Poll the run's row until its status is ``wanted``; fail (with the journal and the
    workers' logs) after ``RUN_TIMEOUT``."""

    def reached() -> Run | None:
        row = Run.objects.filter(run_id=run_id).first()
        return row if row is not None and row.status == wanted else None

    try:
        run: Run = wait_for(reached, RUN_TIMEOUT, f"run {run_id} to be {wanted}")
    except AssertionError as exc:
        row = Run.objects.filter(run_id=run_id).first()
        names = list(
            JournalEntry.objects.filter(run_id=run_id)
            .order_by("seq")
            .values_list("name", flat=True)
        )
        logs = "\n".join(f"--- {w.name}\n{w.log()}" for w in workers)
        raise AssertionError(
            f"{exc}; it is {row and row.status} ({row and row.last_error}); journal {names}\n{logs}"
        ) from None
    return run


def screenshot(page: Page, path: Path) -> Path:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    return path
