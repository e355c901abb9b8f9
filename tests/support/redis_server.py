"""A ``redis-server`` of a test's own, on a free port, without persistence: a test may shut
it down and start it again (a broker restart) without touching the suite's shared Redis on
6379, which other tests' workers use."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import redis

from tests.support.workers import PRIORITY_SUFFIXES


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        if not shutil.which("redis-server"):
            raise AssertionError("redis-server is not installed (the suite needs Redis)")
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A client of its own (close it): the server goes away and comes back."""
        return redis.Redis(port=self.port, socket_timeout=2)

    def up(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False
        finally:
            client.close()

    def start(self) -> None:
        with open(self.workdir / "redis.log", "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [
                    *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 10
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.workdir / "redis.log").read_text(errors="replace")
                raise AssertionError(f"redis-server on {self.port} did not start:\n{log_text}")
            time.sleep(0.05)

    def shutdown(self) -> None:
        """``SHUTDOWN NOSAVE``: what a Redis restart without persistence loses, it loses."""
        client = self.client()
        try:
            client.shutdown(nosave=True)
        except redis.exceptions.ConnectionError:
            pass  # the server closes the connection as it goes
        finally:
            client.close()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def messages_per_run(self, queue: str, task: str) -> Counter[str]:
        """How many messages of ``task`` wait in ``queue`` for each run id (its first
        argument), read from kombu's lists."""
        client = self.client()
        counts: Counter[str] = Counter()
        try:
            for suffix in PRIORITY_SUFFIXES:
                for raw in client.lrange(queue + suffix, 0, -1):
                    message = json.loads(raw)
                    if message["headers"].get("task") != task:
                        continue
                    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
                    counts[str(args[0])] += 1
        except redis.exceptions.ConnectionError:
            pass  # down: nothing waits
        finally:
            client.close()
        return counts
