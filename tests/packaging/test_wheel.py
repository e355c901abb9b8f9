"""The package as users get it: build the wheel and the sdist, check what they carry, install
the wheel into a fresh virtualenv, make a site with ``startproject``, apply the README's own
"Add it to your site" blocks, migrate on PostgreSQL, render every admin page of the app as a
logged-in staff user, drive a gated agent through a Celery worker started from that
virtualenv, approving in the admin, and post a signed message through the shipped webhook
view.

Nothing here imports the checkout: the site runs with a clean environment from a directory
outside the repository, so a file the wheel lacks fails here as it would for a user.
"""

from __future__ import annotations

import hashlib
import hmac
import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import psycopg
import pytest

from tests.support.procs import ROOT
from tests.support.readme_site import apply_readme

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PACKAGE = ROOT / "durable_agents"


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    out = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _clean_env(**extra: str) -> dict[str, str]:
    """No DJANGO_SETTINGS_MODULE, PYTHONPATH or virtualenv of the suite leaks into the site."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    keep["PATH"] = os.pathsep.join(
        p for p in keep.get("PATH", "").split(os.pathsep) if ".venv" not in p
    )
    return {**keep, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def _repo_files(folder: str) -> set[str]:
    base = PACKAGE / folder
    return {
        f"durable_agents/{p.relative_to(PACKAGE).as_posix()}"
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _clean_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked or new, not ignored): a build from the checkout
    itself would reuse a stale ``*.egg-info`` manifest and hide missing package data."""
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        ROOT,
        dict(os.environ),
    )
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    source = _clean_copy(tmp_path_factory.mktemp("source"))
    # Build the sdist, then the wheel from the sdist (what `python -m build` does): a file the
    # sdist lacks is then missing from the wheel too.
    _run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], source, dict(os.environ)
    )
    [wheel] = out.glob("*.whl")
    [sdist] = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_carries_the_package_data(dist: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    for folder in ("templates", "static", "migrations"):
        wanted = {n for n in _repo_files(folder) if not n.endswith(".pyc")}
        assert wanted and wanted <= names, sorted(wanted - names)
    assert "durable_agents/py.typed" in names
    # Tools from MCP servers: the module ships in every wheel, its SDK only with [mcp].
    assert {"durable_agents/mcp/__init__.py", "durable_agents/mcp/server.py"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "example_project/", "bench/"))]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(dist["wheel"]).read(meta).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Dist: celery[redis]" in metadata
    assert "Provides-Extra: mcp" in metadata and 'extra == "mcp"' in metadata
    assert "django-environ" not in metadata.split("Provides-Extra: example")[0]
    assert "Project-URL: Documentation" in metadata


def test_the_sdist_carries_docs_license_and_package_data(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs and docs <= names, sorted(docs - names)
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    package_data = _repo_files("templates") | _repo_files("static")
    assert package_data <= names, sorted(package_data - names)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Site:
    """A ``startproject`` site in a fresh virtualenv with the wheel installed."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        self.dir = root / "site"
        self.python = str(self.venv / "bin" / "python")
        self.db = f"da_pkg_{uuid.uuid4().hex[:10]}"
        self.queue = f"da-pkg-{uuid.uuid4().hex[:10]}"
        # What the README tells the operator to export for the webhook block.
        self.webhook_secret = f"pkg-webhook-{uuid.uuid4().hex}"
        self.env = _clean_env(WEBHOOK_SECRET=self.webhook_secret)
        self.procs: list[subprocess.Popen[bytes]] = []
        _run([sys.executable, "-m", "venv", str(self.venv)], root, self.env)
        _run([self.python, "-m", "pip", "install", "-q", str(wheel)], root, self.env, 600)

    def manage(self, *args: str) -> str:
        return _run([self.python, "manage.py", *args], self.dir, self.env)

    def shell(self, code: str) -> str:
        """What ``code`` prints, run by ``manage.py shell`` (quiet about its auto-imports)."""
        return self.manage("shell", "-v", "0", "-c", code).strip()

    def build(self) -> None:
        self.dir.mkdir()
        _run(
            [str(self.venv / "bin" / "django-admin"), "startproject", "mysite", "."],
            self.dir,
            self.env,
        )
        (self.dir / "myapp").mkdir()
        (self.dir / "myapp" / "__init__.py").write_text("")
        apply_readme(self.dir)
        # This machine's services, not the README's: the test's own database and queue. The
        # database is changed in place, keeping what the README set on it (CONN_MAX_AGE...).
        with (self.dir / "mysite" / "settings.py").open("a") as f:
            f.write(
                f"""
# --- the packaging test's environment ---
DATABASES["default"].update({{"ENGINE": "django.db.backends.postgresql", "NAME": {self.db!r},
    "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"}})
CELERY_BROKER_URL = "redis://127.0.0.1:6379/14"
DURABLE_AGENTS["CELERY_QUEUE"] = {self.queue!r}
CELERY_BEAT_SCHEDULE = {{**beat_schedule(DURABLE_AGENTS)}}
"""
            )
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{self.db}"')

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start a long-running process, its output in ``<name>.log`` (a pipe nobody reads
        would fill up and stall it)."""
        with (self.root / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                list(args),
                cwd=self.dir,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')


@pytest.fixture(scope="module")
def site(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    s = Site(tmp_path_factory.mktemp("pkg"), dist["wheel"])
    try:
        s.build()
        yield s
    finally:
        s.close()


class Browser:
    """A staff member's browser: cookies, the CSRF token, no redirects followed silently."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except urllib.error.URLError as e:  # not listening yet
            return 0, str(e)

    def post_raw(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        """A POST as a machine sends it: no cookies, no CSRF token."""
        request = urllib.request.Request(self.base + path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def post(self, path: str, data: dict[str, str]) -> tuple[int, str]:
        token = next(c.value for c in self.jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(
            self.base + path, data=body, headers={"Referer": self.base + path}
        )
        try:
            with self.opener.open(request, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


def _wait(what: str, check, timeout: float = 60.0, every: float = 0.5):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def _runs(site: Site, *args: str) -> list[dict]:
    return json.loads(site.manage("durable_agents", "runs", "--json", *args))


def test_a_startproject_site_runs_the_wheel_end_to_end(site: Site) -> None:
    where = _run(
        [site.python, "-c", "import durable_agents as d; print(d.__file__, d.__version__)"],
        site.dir,
        site.env,
    )
    assert str(site.venv) in where, f"the site imported {where!r}, not the installed wheel"

    check = site.manage("check")
    assert "no issues" in check, check
    # The README's block is the fast configuration (docs/celery.md, "Database connections";
    # bench/site_throughput.py measures this site), and it survives the site's own DATABASES.
    kept = site.shell(
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        "print(d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'], s.CELERY_DB_REUSE_MAX,"
        " s.CELERY_BROKER_CONNECTION_MAX_RETRIES)"
    )
    assert kept == "60 True 1000 None", kept
    site.manage("migrate", "-v", "0")
    site.shell(
        "from django.contrib.auth.models import Permission, User;"
        "u = User.objects.create_user('staff', password='pw-staff-1', is_staff=True);"
        "u.user_permissions.set(Permission.objects.filter(content_type__app_label='durable_agents'))",
    )
    worker = site.start(
        "worker",
        str(site.venv / "bin" / "celery"),
        "-A",
        "mysite",
        "worker",
        "-Q",
        site.queue,
        "--pool",
        "threads",
        "-c",
        "2",
        "-l",
        "info",
    )
    port = _free_port()
    site.start("web", site.python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload")
    browser = Browser(f"http://127.0.0.1:{port}")
    _wait("the web server", lambda: browser.get("/admin/login/")[0] == 200)

    run_id = site.shell("from myapp.agents import support; print(support.start('Refund order 7'))")
    seen: list[list[dict]] = []

    def paused() -> list[dict]:
        seen.append(_runs(site))
        return [r for r in seen[-1] if r["run_id"] == run_id and r["status"] == "awaiting_approval"]

    try:
        waiting = _wait("the worker to pause the run for approval", paused)
    except AssertionError:
        raise AssertionError(f"run {run_id!r}; runs: {seen[-1:]}\n{site.log('worker')}") from None
    [wait] = waiting[0]["waits"]
    assert (wait["tool"], wait["arguments"]) == ("refund", {"order_id": "7", "amount_cents": 4200})
    assert _refunds(site) == 0

    status, _ = browser.post(
        "/admin/login/?next=/admin/",
        {"username": "staff", "password": "pw-staff-1", "next": "/admin/"},
    )
    assert status == 200
    status, index = browser.get("/admin/durable_agents/")
    assert status == 200, index
    changelists = sorted(set(re.findall(r'href="(/admin/durable_agents/[a-z]+/)"', index)))
    assert len(changelists) >= 5, changelists
    _, approvals = browser.get("/admin/durable_agents/approvalrequest/")
    [approval_page] = set(
        re.findall(r'href="(/admin/durable_agents/approvalrequest/\d+/change/)', approvals)
    )
    quoted = urllib.parse.quote(run_id)
    pages = [
        "/admin/",
        *changelists,
        f"/admin/durable_agents/run/{quoted}/change/",
        f"/admin/durable_agents/run/{quoted}/fork/?step=1",
        f"/admin/durable_agents/run/compare/?a={quoted}&b={quoted}",
        "/admin/durable_agents/run/sessions/",
        approval_page,
        "/admin/durable_agents/apikey/add/",
        "/admin/durable_agents/approverkey/add/",
    ]
    for page in pages:
        status, html = browser.get(page)
        assert status == 200, f"{page} answered {status}:\n{html[:2000]}"
    _, run_page = browser.get(f"/admin/durable_agents/run/{quoted}/change/")
    assert "/static/durable_agents/admin.css" in run_page
    status, css = browser.get("/static/durable_agents/admin.css")
    assert status == 200 and "{" in css

    _, detail = browser.get(approval_page)
    [decide] = re.findall(r'action="([^"]*decide/)"', detail)
    [shown] = re.findall(r'name="shown" value="([^"]*)"', detail)  # what the page showed
    status, _ = browser.post(
        decide, {"decision": "approve", "note": "checked the order", "shown": unescape(shown)}
    )
    assert status == 200
    _wait(
        "the worker to finish the approved run",
        lambda: run_id not in {r["run_id"] for r in _runs(site)},
    )
    answer = site.shell(
        "from durable_agents.models import Run;"
        f"r = Run.objects.get(run_id={run_id!r}); print(r.status, r.answer)"
    )
    assert answer == "finished Refunded order 7."
    assert _refunds(site) == 1  # the README's tool logs each refund: outside the journal
    assert worker.poll() is None, site.log("worker")

    _webhook_delivery(site, browser)


def _refunds(site: Site) -> int:
    """Refunds the README's agent made, as its tool logs them in the worker's log."""
    return site.log("worker").count("refund 7 4200")


def _signed(secret: str, delivery_id: str, body: bytes) -> dict[str, str]:
    """The headers a sender puts on a delivery, by docs/sessions.md (not the package's code)."""
    t = int(time.time())
    mac = hmac.new(secret.encode(), f"{t}.{delivery_id}.".encode() + body, hashlib.sha256)
    return {
        "Content-Type": "application/json",
        "X-Delivery-Id": delivery_id,
        "X-Signature": f"t={t},v1={mac.hexdigest()}",
    }


def _webhook_delivery(site: Site, browser: Browser) -> None:
    """The README's fifth block: a signed message through the wheel's webhook view opens one
    turn, which the worker drives (to the refund awaiting approval); a redelivery opens none,
    and a forgery is a coded 401."""
    body = json.dumps({"session": "chat-1", "text": "Refund order 7 please"}).encode()
    status, answer = browser.post_raw(
        "/webhooks/inbound/", body, _signed(site.webhook_secret, "wh-1", body)
    )
    assert status == 202, answer
    sent = json.loads(answer)
    assert (sent["run_id"], sent["status"]) == ("chat-1>event/wh-1", "queued"), sent

    def turn() -> list[dict]:
        return [
            r
            for r in _runs(site)
            if r["run_id"] == sent["run_id"] and r["status"] == "awaiting_approval"
        ]

    try:
        _wait("the worker to drive the webhook's turn", turn)
    except AssertionError:
        raise AssertionError(f"{_runs(site)}\n{site.log('worker')}") from None
    status, again = browser.post_raw(
        "/webhooks/inbound/", body, _signed(site.webhook_secret, "wh-1", body)
    )
    assert status == 202 and json.loads(again)["run_id"] == sent["run_id"], again
    status, forged = browser.post_raw("/webhooks/inbound/", body, _signed("x" * 40, "wh-2", body))
    assert status == 401 and json.loads(forged)["code"] == "webhook.bad_signature", forged
    turns = site.shell(
        "from durable_agents.models import Run;"
        "print(Run.objects.filter(session_id='chat-1').exclude(run_id__endswith='>session')"
        ".count())"
    )
    assert turns == "1"
    assert "webhook.bad_signature" in site.log("web")  # the reason, logged server-side
