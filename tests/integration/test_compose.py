"""docker-compose.yml's services, run here as the file says (this machine has no Docker
engine): the web command (gunicorn) serving the example site on the test database while
staff follow live run pages, the static files WhiteNoise serves, the one-shot migrations and
beat's healthcheck. Each command is read from the file, so the file and what is tested
cannot drift; only the address gunicorn binds and beat's state file path are replaced."""

from __future__ import annotations

import gzip
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from django.db import connections

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RUNNING, RunInfo
from tests.support.compose import command, compose, compose_environment, dockerfile_cmd
from tests.support.procs import ROOT
from tests.support.sse import Stream, records
from tests.support.web import PROXIED, RUN_PAGE, Web, executable
from tests.support.workers import PRIORITY_SUFFIXES, redis_db

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# A plain request must answer within this while run pages stream (issue 44's requirement: a
# liveness bound, not a speed target; such a request takes a few milliseconds here, and a
# stalled one waits for a stream to end, i.e. for ever).
BOUND = 1.0
# The web command before issue 44: three sync workers, each held by one open run page.
OLD_WEB_COMMAND = [
    *("gunicorn", "example_project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"),
    *("--access-logfile", "-"),
]
GUNICORN_DEFAULT_TIMEOUT = 30


def _site_env(tmp_path: Path, service: str, **extra: str) -> dict[str, str]:
    """What a container of ``service`` gets: compose's environment, pointed at the test
    database and a Redis database of the tests; nothing of the suite's own settings."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DA_", "DJANGO_", "DATABASE_URL", "WEBHOOK_SECRET", "CELERY_"))
    }
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    name = connections["default"].settings_dict["NAME"]
    return {
        **base,
        **compose_environment(service),
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{name}",
        "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{redis_db('master')}",
        "DJANGO_STATIC_ROOT": str(tmp_path / "staticfiles"),
        **extra,
    }


def _timeout_of(args: list[str]) -> float:
    for i, arg in enumerate(args):
        if arg in ("--timeout", "-t"):
            return float(args[i + 1])
        if arg.startswith("--timeout="):
            return float(arg.split("=", 1)[1])
    return GUNICORN_DEFAULT_TIMEOUT


def _wait(what: str, condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def site(tmp_path: Path, django_user_model) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The example site's environment on the test database with its static files collected
    (as the image's build does), a staff user, and a live run with one record."""
    env = _site_env(tmp_path, "web")
    out = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    django_user_model.objects.create_superuser("ann", "ann@example.com", "pw-ann-compose-1")
    store = DjangoStore()
    store.create_run(RunInfo(run_id="live-page", agent="support", status=RUNNING))
    store.insert("live-page", "step:0", '{"kind":"step"}')
    return env


class Started:
    """What a test started: servers, then the streams of their clients (closed after)."""

    def __init__(self) -> None:
        self.servers: list[Web] = []
        self.streams: list[Stream] = []

    def web(self, args: list[str], env: dict[str, str], log: Path) -> Web:
        self.servers.append(Web(args, env, log))
        return self.servers[-1]

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for stream in self.streams:
            stream.join(timeout=15)
            stream.conn.close()


@pytest.fixture
def started() -> Iterator[Started]:
    things = Started()
    yield things
    things.close()


def _open_pages(web: Web, session: str, streams: list[Stream], count: int) -> None:
    """Open run pages until ``count`` follow the run, each as a browser does: the page, then
    the stream its ``data-events`` names (live.js)."""
    while len(streams) < count:
        stream = Stream(
            web.events_url("live-page", session),
            {**PROXIED, "Cookie": session, "Accept": "text/event-stream"},
        )
        stream.start()
        streams.append(stream)


def _streaming(streams: list[Stream], records_seen: int, timeout: float = 30.0) -> bool:
    """Every stream answered and shows ``records_seen`` records, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(records(s.events)) >= records_seen for s in streams):
            return True
        time.sleep(0.05)
    return False


def _plain_requests(web: Web) -> dict[str, float]:
    """The slowest of three plain requests of each kind: the login page (a template, no
    database) and the container healthcheck's /healthz."""
    return {
        path: max(web.timed(path, cap=3 * BOUND) for _ in range(3))
        for path in ("/admin/login/", "/healthz")
    }


def test_the_image_runs_the_web_command_compose_runs():
    assert dockerfile_cmd() == command("web")
    assert command("web")[:2] == ["gunicorn", "example_project.wsgi"]


def test_the_image_installs_the_mcp_sdk_the_stock_desk_needs():
    """The example site loads its stock desk (an MCP server's tools) only when the mcp
    package is there: an image without the extra would quietly have no stock desk."""
    [install] = [
        line
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("RUN pip install")
    ]
    extras = re.search(r"\[([a-z,]+)\]", install)
    assert extras is not None
    assert {"mcp", "example", "openai", "anthropic"} <= set(extras.group(1).split(","))


@pytest.mark.django_db(transaction=True)
def test_with_twenty_run_pages_open_the_web_command_answers_a_plain_request_at_once(
    site: dict[str, str], started: Started, tmp_path: Path
):
    """The compose's web command, as written: with 3 and then 20 run pages following a live
    run, a plain request answers within a second, every stream stays live past gunicorn's
    worker timeout, and no worker is killed."""
    args = command("web")
    web = started.web(args, site, tmp_path / "web.log")
    cookie = web.login("ann", "pw-ann-compose-1")
    streams = started.streams
    store = DjangoStore()
    for count in (3, 20):
        _open_pages(web, cookie, streams, count)
        assert _streaming(streams, 1), [(s.status, s.error) for s in streams]
        slowest = _plain_requests(web)
        assert max(slowest.values()) < BOUND, (count, slowest)

    # Past the worker timeout (a sync worker held by a stream is killed then, and its streams
    # with it), plain requests keep answering and every stream stays live.
    hold_until = time.monotonic() + _timeout_of(args) + 5
    while time.monotonic() < hold_until:
        slowest = _plain_requests(web)
        assert max(slowest.values()) < BOUND, slowest
        time.sleep(2)
    store.insert("live-page", "step:1", '{"kind":"step"}')
    assert _streaming(streams, 2, timeout=10), [len(records(s.events)) for s in streams]
    assert all(s.status == 200 and s.error is None and s.is_alive() for s in streams)
    assert "WORKER TIMEOUT" not in web.log()

    # The run page's stylesheet, from WhiteNoise: the collected file's hashed name, cached
    # for a year, compressed for a client that takes gzip.
    _, _, page = web.get(RUN_PAGE.format("live-page"), {"Cookie": cookie})
    [css] = re.findall(r'href="(/static/durable_agents/admin\.[0-9a-f]{12}\.css)"', page.decode())
    status, response, body = web.get(css, {"Accept-Encoding": "gzip"})
    assert status == 200 and response is not None
    assert response.getheader("Content-Encoding") == "gzip"
    assert "max-age=315360000" in (response.getheader("Cache-Control") or "")
    collected = Path(site["DJANGO_STATIC_ROOT"]) / css.removeprefix("/static/")
    assert gzip.decompress(body) == collected.read_bytes()


@pytest.mark.django_db(transaction=True)
def test_the_old_sync_command_stalls_with_three_run_pages_open(
    site: dict[str, str], started: Started, tmp_path: Path
):
    """The check above can fail: the web command before issue 44 (three sync workers) with
    three run pages open leaves no worker for a plain request."""
    web = started.web(OLD_WEB_COMMAND, site, tmp_path / "old-web.log")
    cookie = web.login("ann", "pw-ann-compose-1")
    streams = started.streams
    _open_pages(web, cookie, streams, 3)
    assert _streaming(streams, 1)
    assert web.timed("/admin/login/", cap=3 * BOUND) >= BOUND


def test_migrations_are_a_one_shot_service_the_others_wait_for(tmp_path: Path):
    """``migrate`` migrates a fresh database once, as written; web, worker and beat start
    only after it exited successfully, and none of them migrates."""
    services = compose()["services"]
    assert services["migrate"].get("restart", "no") == "no"
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }, name
        assert "migrate" not in command(name), name
    database = f"da_migrate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(
        host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
    ) as c:
        c.execute(f'CREATE DATABASE "{database}"')
    try:
        env = _site_env(
            tmp_path, "migrate", DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{database}"
        )
        for _ in range(2):  # a second `docker compose up` finds nothing to do
            out = subprocess.run(
                executable(["python", *command("migrate")[1:]]),
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert out.returncode == 0, out.stdout + out.stderr
        assert "No migrations to apply" in out.stdout
    finally:
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_the_database_password_comes_from_the_environment():
    services = compose()["services"]
    required = "${POSTGRES_PASSWORD:?"
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(required)
    assert f":{required}" in services["web"]["environment"]["DATABASE_URL"]
    password = "pw-" + uuid.uuid4().hex
    given = {"DJANGO_SECRET_KEY": "x", "WEBHOOK_SECRET": "y", "POSTGRES_PASSWORD": password}
    for name in ("migrate", "web", "worker", "beat"):
        url = compose_environment(name, given)["DATABASE_URL"]
        assert url == f"postgres://postgres:{password}@postgres:5432/durable_agents", name


def _healthcheck(name: str, state_dir: Path) -> list[str]:
    test = compose()["services"][name]["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return [part.replace("/tmp/", f"{state_dir}/") for part in test[1:]]


def _healthy(check: list[str], env: dict[str, str]) -> bool:
    out = subprocess.run(
        executable(check), cwd=ROOT, env=env, capture_output=True, timeout=30, check=False
    )
    return out.returncode == 0


@pytest.mark.django_db(transaction=True)
def test_beats_healthcheck_follows_what_beat_sends(tmp_path: Path):
    """The beat command, as written, is healthy by its healthcheck while it sends its
    schedule (its state file is written after each send), and a state file older than the
    check allows, or none, is unhealthy."""
    env = _site_env(tmp_path, "beat")
    args = [part.replace("/tmp/", f"{tmp_path}/") for part in command("beat")]
    check = _healthcheck("beat", tmp_path)
    assert not _healthy(check, env)  # no state file: beat never ran
    with (tmp_path / "beat.log").open("wb") as log:
        beat = subprocess.Popen(
            executable(args),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    files = lambda: list(tmp_path.glob("celerybeat-schedule*"))  # noqa: E731
    sends = lambda: (tmp_path / "beat.log").read_text().count("Sending due task")  # noqa: E731
    try:
        # The timer sweep is sent every TIMER_SWEEP_INTERVAL (5 s), the recovery pass every
        # RECOVERY_INTERVAL (15 s): after each send, the state file is written again.
        _wait("beat to send a task", lambda: sends() >= 1, timeout=40)
        written, sent = max(f.stat().st_mtime_ns for f in files()), sends()
        _wait("beat to send another", lambda: sends() > sent, timeout=40)
        _wait(
            "beat to write its state after that send",
            lambda: max(f.stat().st_mtime_ns for f in files()) > written,
            timeout=5,
        )
        assert _healthy(check, env), (tmp_path / "beat.log").read_text()
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(timeout=30)
        queues = redis.Redis.from_url(env["CELERY_BROKER_URL"])
        queues.delete(*(q + p for q in ("durable_agents", "celery") for p in PRIORITY_SUFFIXES))
    stale = time.time() - 120
    for f in files():
        os.utime(f, (stale, stale))
    assert not _healthy(check, env)  # beat stopped sending two minutes ago
