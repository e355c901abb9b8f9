"""The shell commands the product prints as hints, built so that each one runs when pasted.

Run ids the engine derives contain ``>`` and ``/`` (``chat-42>turn/3``): unquoted, ``>`` is
a shell redirect. Every argument goes through ``shlex.quote``, every command starts the way
it is run (``python manage.py durable_agents …``) and carries ``--by`` with a username.

What only a person can supply stays a placeholder in angle brackets, quoted so the shell
passes it as it is — ``--value '<json>'``, ``--payload '<json>'``, ``--result '<json>'`` (the
outcome of a halted call), ``'<key>'`` (a channel message's dedupe key), and ``--by '<you>'``
when ``runs`` was not told who acts — which the command refuses as it stands (``not valid
JSON``, ``a placeholder``, ``actor.unknown``), never guesses. Everything else is filled in.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from .engine.ports import FAILED

CLI = "python manage.py durable_agents"
JSON = "'<json>'"  # placeholder: a JSON value only a person can give
KEY = "'<key>'"  # placeholder: a channel message's dedupe key
YOU = "<you>"  # placeholder: who acts, when ``runs`` was not told (quoted by ``command``)
PLACEHOLDERS = frozenset({"<json>", "<key>", YOU})  # as the shell passes them on


def command(action: str, *args: str, by: str, placeholders: tuple[str, ...] = ()) -> str:
    """``python manage.py durable_agents <action> <args…> [placeholders] --by <by>``, each
    argument shell-quoted (``placeholders`` are written as they are)."""
    quoted = [shlex.quote(a) for a in (action, *args)]
    return " ".join([CLI, *quoted, *placeholders, "--by", shlex.quote(by)])


def run_lines(run: Any, by: str) -> list[str]:
    """The lines ``runs`` prints under a pending run (``commands.runs.PendingRun``): what it
    waits on, then a labelled command per way to act on it."""
    lines: list[str] = []
    for wait in run.waits:
        lines.extend(wait_lines(run.run_id, wait, by))
    if run.status == FAILED:
        lines.append(f"  resume: {command('resume', run.run_id, by=by)}")
    return lines


def wait_lines(run_id: str, wait: Any, by: str) -> list[str]:
    """One thing a run waits on (``commands.runs.Wait``) and the commands that act on it."""
    if wait.kind == "approval":
        return [
            f"call {wait.call_id}  {wait.tool}({json.dumps(wait.arguments)})  awaits a decision",
            f"  approve: {command('approve', run_id, wait.call_id, by=by)}",
            f"  deny:    {command('deny', run_id, wait.call_id, by=by)}",
        ]
    if wait.kind == "halt":
        return [
            f"call {wait.call_id}  {wait.tool}({json.dumps(wait.arguments)})  outcome unknown: "
            "check what really happened, and give it as JSON",
            "  resolve: "
            + command("resolve", run_id, wait.call_id, by=by, placeholders=("--result", JSON)),
        ]
    where = f"{wait.kind} {wait.name!r} (call {wait.call_id}, {wait.tool})"
    if wait.kind == "interrupt":
        return [
            f"{where} asks: {wait.prompt!r}; give the answer as JSON",
            "  answer: "
            + command("answer", run_id, wait.name, by=by, placeholders=("--value", JSON)),
        ]
    if wait.kind == "signal":
        timeout = f"; times out at {wait.deadline.isoformat()}" if wait.deadline else ""
        return [
            f"{where} awaits a signal{timeout}",
            "  signal: "
            + command("signal", run_id, wait.name, by=by, placeholders=("--payload", JSON)),
        ]
    if wait.kind == "timer":
        at = wait.deadline.isoformat() if wait.deadline is not None else "its time"
        return [
            f"{where} wakes at {at}",
            f"  wake now: {command('wake', run_id, wait.name, by=by)}",
        ]
    if wait.kind == "channel":
        return [
            f"{where} awaits a message; give it a key of its own and a JSON payload",
            "  send: "
            + command("send", run_id, wait.name, by=by, placeholders=(KEY, "--payload", JSON)),
        ]
    if wait.kind == "sub_run":
        return [f"sub-run {wait.name} ({wait.tool}, call {wait.call_id})  -> see its own line"]
    return [f"{where}  -> see the run's page in the admin"]
