"""Real ``celery worker`` and ``celery beat`` subprocesses for integration tests.

Every process starts in a session of its own (``start_new_session=True``), so its whole
process tree — a prefork parent and its pool children — can be stopped, continued or killed
at once with ``os.killpg``. Its output (stdout and stderr) goes to a log file the test reads:
readiness (``ready.``), task results (``succeeded in …: 'busy'``), warnings.

Workers and beat talk to the test databases (``tests.support.procs.subprocess_env``), to the
test's own Redis database and to the test's own queue (``CeleryTarget``), so concurrent test
runs on one machine never share a broker queue.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from tests.support.procs import ROOT, subprocess_env

READY_TIMEOUT = 60.0
# Kombu's Redis transport keeps a queue's messages in lists named after the queue, one per
# priority step (priority 0 is the bare name).
PRIORITY_SUFFIXES = ["", "\x06\x163", "\x06\x166", "\x06\x169"]


def redis_db(worker_id: str) -> int:
    """A Redis database per pytest-xdist worker: 10 for ``master``/``gw0``, 11 for gw1, …
    (wrapping inside Redis' default 16 databases)."""
    index = int(worker_id[2:]) if worker_id.startswith("gw") else 0
    return 10 + index % 6


@dataclass(frozen=True)
class CeleryTarget:
    """Where a test's Celery messages go: a broker URL (Redis database) and a queue name."""

    broker_url: str
    queue: str

    @classmethod
    def fresh(cls, worker_id: str) -> CeleryTarget:
        return cls(
            broker_url=f"redis://127.0.0.1:6379/{redis_db(worker_id)}",
            queue=f"da-test-{uuid.uuid4().hex[:12]}",
        )

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a worker or beat: the test databases, this broker and queue, and
        dispatch through Celery."""
        return subprocess_env(
            DA_DISPATCH="celery",
            DA_CELERY_QUEUE=self.queue,
            DA_BROKER_URL=self.broker_url,
            PYTHONUNBUFFERED="1",
            **extra,
        )

    def app(self) -> Celery:
        """A Celery app for the test process, on this broker (publishing, purging). Creating
        it makes it the current app, so ``drive_run.apply_async`` publishes through it."""
        app = Celery(f"da-tests-{self.queue}", broker=self.broker_url, set_as_current=True)
        app.conf.update(
            broker_connection_retry_on_startup=True,
            task_ignore_result=True,
            task_acks_late=True,
            task_reject_on_worker_lost=True,
        )
        return app

    def queue_length(self) -> int:
        """Messages waiting in the queue (not the ones a worker has taken)."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            return sum(int(client.llen(self.queue + s)) for s in PRIORITY_SUFFIXES)
        finally:
            client.close()

    def unacked(self) -> list[dict[str, Any]]:
        """Messages of this queue a worker took and never acknowledged (kombu keeps them in
        the ``unacked`` hash until ``visibility_timeout`` passes, then puts them back)."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            held = client.hgetall("unacked")
        finally:
            client.close()
        messages = []
        for tag, raw in held.items():
            message, _exchange, routing_key = json.loads(raw)
            if routing_key == self.queue:
                messages.append({"tag": tag.decode(), **message["headers"]})
        return messages

    def clean(self) -> None:
        """Forget this queue in Redis: its lists, bindings and unacknowledged messages (which
        would otherwise come back to a queue nobody reads, an hour later)."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            for message in self.unacked():
                client.hdel("unacked", message["tag"])
                client.zrem("unacked_index", message["tag"])
            client.delete(
                *(self.queue + s for s in PRIORITY_SUFFIXES),
                f"_kombu.binding.{self.queue}",
                f"_kombu.binding_permanent.{self.queue}",
            )
        finally:
            client.close()

    def purge(self, app: Celery) -> int:
        """Drop every message waiting in the queue (``celery purge -Q <queue>``)."""
        with app.connection_for_write() as conn:
            return int(conn.default_channel.queue_purge(self.queue) or 0)


@dataclass
class CeleryProcess:
    """One ``celery`` subprocess (worker or beat) in its own process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: Any = field(repr=False, default=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, text: str, timeout: float) -> str:
        """Poll the log until ``text`` appears; fail with the log if the process exits or
        the deadline passes."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log()
            if text in log:
                return log
            if not self.alive():
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before logging {text!r}:\n{log}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not log {text!r} in {timeout}s:\n{log}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> CeleryProcess:
        self.wait_for_log("ready.", timeout)
        return self

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit in {timeout}s:\n{self.log()}") from None

    def signal(self, sig: int) -> None:
        """Signal the main process only (what ``kill <pid>`` does)."""
        if self.alive():
            os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Signal every process of the worker (main process and pool children)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group (a stopped process dies too) and reap it."""
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        if self._log is not None:
            self._log.close()
            self._log = None


class CeleryProcesses:
    """Starts workers and beats for one test and kills them all (whole groups) at the end."""

    def __init__(self, target: CeleryTarget, log_dir: Path) -> None:
        self.target = target
        self.log_dir = log_dir
        self.started: list[CeleryProcess] = []

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> CeleryProcess:
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed by CeleryProcess.kill
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.celery_app", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process = CeleryProcess(name, proc, log_path, log)
        self.started.append(process)
        return process

    def worker(
        self, pool: str = "threads", concurrency: int = 1, *, name: str = "", **env: str
    ) -> CeleryProcess:
        """Start ``celery worker`` on the test's queue; returns at once (``wait_ready``)."""
        name = f"{name or 'w'}-{uuid.uuid4().hex[:8]}"
        args = [
            "worker",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            self.target.queue,
            "-c",
            str(concurrency),
            "--pool",
            pool,
            "-n",
            f"{name}@%h",
        ]
        return self._start(name, args, self.target.env(**env))

    def beat(self, *, name: str = "beat", **env: str) -> CeleryProcess:
        """Start ``celery beat`` sending ``recover_runs`` every ``DA_RECOVERY_INTERVAL``
        seconds to the test's queue (``tests/celery_app.py``)."""
        name = f"{name}-{uuid.uuid4().hex[:8]}"
        args = [
            "beat",
            "--loglevel=INFO",
            "--max-interval=1",
            "-s",
            str(self.log_dir / f"{name}-schedule"),
        ]
        return self._start(name, args, self.target.env(DA_BEAT_RECOVERY="1", **env))

    def kill_all(self) -> None:
        for process in self.started:
            process.kill()


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] != "Z"


def holds_for(condition: Callable[[], Any], seconds: float, interval: float = 0.1) -> bool:
    """True if ``condition`` stays truthy for ``seconds`` (checked every ``interval``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        time.sleep(interval)
    return bool(condition())
