"""A warm parent for the crash tests' child processes: it imports Django, the app and the
test agents once, then forks one child per request, which runs ``python -m <module>`` as a
fresh interpreter would and is SIGKILLed at its failpoint like any other process.

Why: a crash test starts two to four processes, and each spent about 1.4 s of CPU importing
Django and the engine before its first step: most of the suite's crash tests' cost. A forked
child is a real process of its own (its own connections, leases, liveness locks, PID); only
the imports are shared, and nothing else is: this parent never opens a database connection.

What may differ from a fresh interpreter is what modules read from the environment when
they are imported. So only variables read at the time they are used may vary from one child
to the next (``LATE``); the failpoints, which are read at import, are set again in each
child. A request with any other variable of its own runs in a fresh interpreter instead
(``tests/support/procs.py``). ``python -m tests.support.zygote`` is the parent's loop: one
JSON request a line on stdin, one JSON answer a line on stdout.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tempfile
import time

# Variables read when used, never at import: a child may set them.
LATE = frozenset(
    {
        "DURABLE_AGENTS_CRASH_AT",
        "DA_CRASH_INSIDE",
        "DA_CRASH_AFTER_ANSWER",
        "DA_CRASH_BEFORE_ACK",
        "DA_CRASH_AFTER_ACK",
    }
)
# Modules a request may run: the ones imported here, whose import-time reads are known.
MODULES = frozenset(
    f"tests.support.{name}"
    for name in ("drive", "answer", "enqueue", "deadline_child", "holes_child", "tree_child")
)


def _child(module: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: become ``python -m module args`` and never return."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(os.open(out, os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_TRUNC), 2)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(env)
        from durable_agents.engine import failpoints

        points = os.environ.get("DURABLE_AGENTS_CRASH_AT", "")
        failpoints._POINTS = frozenset(p for p in points.split(",") if p)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_one(request: dict) -> dict:
    with (
        tempfile.NamedTemporaryFile(delete=False) as o,
        tempfile.NamedTemporaryFile(delete=False) as e,
    ):
        out, err = o.name, e.name
    try:
        pid = os.fork()
        if pid == 0:
            _child(request["module"], request["args"], request["env"], out, err)
        deadline = time.monotonic() + float(request.get("timeout", 60))
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(0.005)
        code = -os.WTERMSIG(status) if not timed_out and os.WIFSIGNALED(status) else 0
        if not timed_out and os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        with open(out) as f:
            stdout = f.read()
        with open(err) as f:
            stderr = f.read()
        return {"code": code, "stdout": stdout, "stderr": stderr, "timed_out": timed_out}
    finally:
        for path in (out, err):
            os.unlink(path)


def main() -> None:
    import django

    django.setup()
    from django.db import connections

    for module in MODULES:
        __import__(module)  # its imports; its ``main`` runs in each child
    connections.close_all()  # (none is open: a child must never share one)
    # The protocol's pipes: children replace their 0 and 1, so nothing else writes here.
    requests, answers = sys.stdin, sys.stdout
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    answers.flush()
    while line := requests.readline():
        answer = _serve_one(json.loads(line))
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
