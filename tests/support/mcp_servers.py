"""Starting the test MCP server (``tests.support.mcp_server``) and counting its effects.

``stdio(effects, ...)`` is a ``da.mcp.Server`` whose process the client starts itself;
``HttpServer`` runs the streamable HTTP flavour as a subprocess of the test on a free port,
which the test can kill and start again on the same port. Effects are counted in a file
outside every journal (``effects(path)``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import durable_agents as da

ROOT = Path(__file__).resolve().parents[2]


def server_env(effects: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "DA_MCP_EFFECTS": str(effects)}


def stdio(effects: Path, name: str = "crm", variant: str = "", **options: Any) -> da.mcp.Server:
    """``variant``: the server's next version (``DA_MCP_VARIANT``, tests.support.mcp_server)."""
    # Starting the server imports the mcp package: seconds on a loaded machine, so more
    # than the default connect timeout is allowed here.
    options.setdefault("connect_timeout", 30)
    env = server_env(effects)
    if variant:
        env["DA_MCP_VARIANT"] = variant
    return da.mcp.Server(
        name,
        command=[sys.executable, "-m", "tests.support.mcp_server", "stdio"],
        env=env,
        cwd=str(ROOT),
        **options,
    )


def effects(path: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The effects the server recorded, in order (of ``tool`` only, if given)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if tool is None or r["tool"] == tool]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """The test server over streamable HTTP, on a port of its own."""

    def __init__(self, effects: Path) -> None:
        self.effects = effects
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 20.0) -> None:
        env = {**os.environ, **server_env(self.effects)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.mcp_server", "http", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the MCP test server exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the MCP test server did not listen on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def server(self, name: str = "tickets", **options: Any) -> da.mcp.Server:
        return da.mcp.Server(name, url=self.url, headers={"X-Test": "yes"}, **options)
