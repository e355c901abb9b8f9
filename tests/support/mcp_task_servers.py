"""Starting the task-running test MCP server (``tests.support.mcp_task_server``) over
streamable HTTP, as a process of its own that outlives the processes calling it (a task
must outlive a driver that is killed while polling it). Its tasks are kept in a file next
to the effects file, so the server can be killed and started again on the same port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.mcp_servers import ROOT, HttpServer, server_env


class TaskServer(HttpServer):
    """``tests.support.mcp_task_server`` on a port of its own; ``env`` adds settings
    (``DA_MCP_TASK_SECONDS``, ``DA_MCP_POLL_MS``, ``DA_MCP_FLAKY``)."""

    def __init__(self, effects: Path, **env: str) -> None:
        super().__init__(effects)
        self.extra = env

    def start(self, timeout: float = 20.0) -> None:
        import socket

        # Tasks kept in a file: a restarted server knows the tasks of the one before.
        store = str(self.effects.with_suffix(".tasks.json"))
        env = {**os.environ, **server_env(self.effects), "DA_MCP_TASK_STORE": store, **self.extra}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.mcp_task_server", "http", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the MCP task test server exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the MCP task test server did not listen on {self.port}")
