"""Driving the admin in headless Debian Chromium through Playwright's sync API, and waiting
for the Celery worker the live server dispatches to (the fixtures are in
tests/browser/conftest.py).

Playwright cannot download its own browsers here; it launches ``/usr/bin/chromium``
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import User
from django.db import connections
from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import Page, Playwright, expect, sync_playwright

from durable_agents.models import JournalEntry, Run
from tests.support.people import make_user
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


def login(page: Page, username: str, password: str = PASSWORD) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form [type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)


def staff_user(name: str, *perms: str) -> User:
    """A staff user (not a superuser) holding exactly ``perms``, with a password."""
    return make_user(name, *perms, password=PASSWORD)


# -- a real Celery worker -----------------------------------------------------------------


@dataclass
class Celery:
    target: CeleryTarget
    procs: CeleryProcesses

    def worker(self) -> CeleryProcess:
        """Start ``celery -A tests.celery_app worker`` on the test's queue (not yet ready)."""
        return self.procs.worker("threads", 1)


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


def wait_streams_closed(timeout: float = 10.0) -> None:
    """Wait until no run page's live stream holds a database connection (each notices its
    page is gone on its next keep-alive): the test database can then be dropped."""
    from durable_agents.database.events import APPLICATION_NAME

    def closed() -> bool:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND datname = current_database()",
                [APPLICATION_NAME],
            )
            return cursor.fetchone()[0] == 0

    wait_for(closed, timeout, "the run pages' live streams to close")
