"""Starting test subprocesses that talk to the same test databases as the parent."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from django.db import connections

ROOT = Path(__file__).resolve().parents[2]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process: same settings, pointed at the test databases."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = env.get("DJANGO_SETTINGS_MODULE", "tests.settings")
    env["DA_PG_NAME"] = connections["default"].settings_dict["NAME"]
    env["DA_SQLITE_NAME"] = connections["sqlite"].settings_dict["NAME"]
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start(args: Sequence[str], **extra_env: str) -> subprocess.Popen[str]:
    """Start ``python -m <args>`` with pipes for stdin/stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=subprocess_env(**extra_env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Zygote:
    """The pytest process's handle on its warm parent (``tests/support/zygote.py``)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        ready = self._read()
        assert "ready" in ready, ready

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the crash tests' warm parent died")
        return json.loads(line)

    def run(self, module: str, args: Sequence[str], late: dict[str, str], timeout: float) -> Any:
        assert self.proc.stdin is not None
        request = {"module": module, "args": list(args), "env": late, "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired([module, *args], timeout, answer["stdout"])
        return subprocess.CompletedProcess(
            [module, *args], answer["code"], answer["stdout"], answer["stderr"]
        )

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # its loop ends
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _close_zygote() -> None:
    if _zygote is not None:
        _zygote.close()


atexit.register(_close_zygote)


def run_python(
    module: str, args: Sequence[str], timeout: float = 60, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m <module> <args>`` on the test databases, its output captured: forked from
    the warm parent when only variables read at use differ (``zygote.LATE``), else in a
    fresh interpreter."""
    from . import zygote

    global _zygote
    base = {k: v for k, v in extra_env.items() if k not in zygote.LATE}
    late = {k: v for k, v in extra_env.items() if k in zygote.LATE}
    if module in zygote.MODULES and base == {"DA_LEASE_TTL": "1"}:
        env = subprocess_env(**base)
        env.pop("PYTEST_CURRENT_TEST", None)  # (changes with every test)
        with _zygote_lock:
            if _zygote is None or _zygote.env != env or _zygote.proc.poll() is not None:
                if _zygote is not None:
                    _zygote.close()
                _zygote = _Zygote(env)
            return _zygote.run(module, args, late, timeout)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=subprocess_env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released together; return results (or raise the first
    error). Each thread closes its own database connections."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = fn(i)
        except BaseException as exc:  # collected and re-raised in the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def drive_in_child(
    run_id: str, crash_inside: str | None = None, agent: str = "crash-side_effect"
) -> tuple[int, str]:
    """Drive ``agent`` in a child process (``tests.support.drive``), killed inside the call
    ``crash_inside`` if given, with a short lease so the next driver can take over."""
    env = {"DA_LEASE_TTL": "1"}
    if crash_inside:
        env["DA_CRASH_INSIDE"] = crash_inside
    proc = run_python("tests.support.drive", [agent, run_id, "go"], **env)
    return proc.returncode, proc.stdout


def run_module(module: str, *args: str, **env: str) -> tuple[int, str]:
    """Run ``python -m <module> <args>`` on the test databases with a 1 s lease (so the next
    driver takes over a killed one quickly): ``(-9, "")`` if it was SIGKILLed at a failpoint,
    else ``(0, its last line of output)``; any other exit fails the test with its stderr."""
    proc = run_python(module, args, DA_LEASE_TTL="1", **env)
    if proc.returncode == -9:
        return -9, ""
    assert proc.returncode == 0, proc.stderr
    return 0, proc.stdout.strip().splitlines()[-1]


def run_json(module: str, *args: str, **env: str) -> tuple[int, Any]:
    """``run_module`` whose last line is JSON: ``(-9, None)`` if it was killed."""
    code, out = run_module(module, *args, **env)
    return code, json.loads(out) if out else None
