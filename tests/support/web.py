"""The example site served by a real gunicorn started from a command line (docker-compose.yml's
web command, or another to compare), and a staff member's requests to it as they arrive
through the TLS proxy compose expects in front: used by tests/integration/test_compose.py and
bench/web_server.py."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from tests.support.procs import ROOT

# Requests reach gunicorn as they would through the proxy that terminates TLS.
PROXIED = {"Host": "localhost", "X-Forwarded-Proto": "https"}
RUN_PAGE = "/admin/durable_agents/run/{}/change/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def executable(args: list[str]) -> list[str]:
    """The command with its program taken from this virtualenv (the image's is on PATH)."""
    program = Path(sys.executable).parent / args[0]
    assert program.exists(), f"{args[0]} is not installed here: pip install -e '.[dev]'"
    return [str(program), *args[1:]]


def cookie(response: http.client.HTTPResponse, name: str) -> str:
    for header in response.headers.get_all("Set-Cookie") or []:
        match = re.match(rf"{name}=([^;]*)", header)
        if match:
            return match.group(1)
    raise AssertionError(f"no {name} cookie in {response.headers}")


class Web:
    """A gunicorn started from ``args`` (its one ``--bind`` pointed at a free local port),
    its output (access and error log) in ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        binds = [i for i, a in enumerate(args) if a == "--bind" or a.startswith("--bind=")]
        assert len(binds) == 1, f"one --bind in {args}"
        args = list(args)
        if args[binds[0]] == "--bind":
            args[binds[0] + 1] = f"127.0.0.1:{self.port}"
        else:
            args[binds[0]] = f"--bind=127.0.0.1:{self.port}"
        self.args, self.log_path = args, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                executable(args),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while self.get("/healthz", timeout=2)[0] != 200:
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, f"gunicorn did not answer:\n{self.log()}"
            time.sleep(0.2)

    def get(
        self, path: str, headers: dict[str, str] | None = None, timeout: float = 10
    ) -> tuple[int, http.client.HTTPResponse | None, bytes]:
        """(status, response, body); status 0 when nothing answered within ``timeout``."""
        return self.request("GET", path, headers=headers, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10,
    ) -> tuple[int, http.client.HTTPResponse | None, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={**PROXIED, **(headers or {})})
            response = conn.getresponse()
            return response.status, response, response.read()
        except OSError:
            return 0, None, b""
        finally:
            conn.close()

    def timed(self, path: str, cap: float, headers: dict[str, str] | None = None) -> float:
        """Seconds until a GET of ``path`` answered 200; ``cap`` or more when it did not
        answer within ``cap``."""
        start = time.monotonic()
        status, _, _ = self.get(path, headers, timeout=cap)
        elapsed = time.monotonic() - start
        return elapsed if status == 200 else max(elapsed, cap)

    def login(self, username: str, password: str) -> str:
        """A staff session through the admin's login form: the ``Cookie`` header to send."""
        _, response, _ = self.get("/admin/login/")
        assert response is not None, self.log()
        token = cookie(response, "csrftoken")
        body = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token}
        ).encode()
        status, response, page = self.request(
            "POST",
            "/admin/login/?next=/admin/",
            body,
            {
                "Cookie": f"csrftoken={token}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": "https://localhost",
                "Referer": "https://localhost/admin/login/",
            },
        )
        assert status == 302 and response is not None, page.decode(errors="replace")[:2000]
        return f"sessionid={cookie(response, 'sessionid')}"

    def events_url(self, run_id: str, session: str) -> str:
        """The stream a run page opens (``data-events``, followed by live.js), from the page."""
        status, _, page = self.get(RUN_PAGE.format(run_id), {"Cookie": session})
        assert status == 200, page.decode(errors="replace")[:2000]
        [events] = re.findall(r'data-events="([^"]+)"', page.decode())
        return f"http://127.0.0.1:{self.port}{events}?after=0"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Killed: gunicorn's shutdown, quick or graceful, waits for the open streams (they do
        not end) until its graceful timeout."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=15)
