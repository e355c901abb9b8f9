"""Agents for the regression tests of issue 10 (tests/acceptance/test_unknown_outcomes.py),
shaped by the environment of the process that loads them, so a test can "deploy" another
version between a crash and the resume:

* ``DA_DEPLOY``: ``v1`` (default) — ``charge(order)``; ``v2`` — ``charge(order, currency)``,
  a new required parameter; ``removed`` — no ``charge`` tool at all.
* ``DA_ON_DRIFT``: the agent's drift policy (``warn`` by default).
* ``DA_STOP_INSIDE=<call>``: the process stops itself (SIGSTOP: every thread, the lease
  heartbeat too) inside that call, before its effect fires; after SIGCONT the effect fires.

Every effect is counted outside the journal (``tests.support.agents.fire``), keyed by run id,
call id and idempotency key.
"""

from __future__ import annotations

import os
import signal

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import fire

DEPLOY = os.environ.get("DA_DEPLOY", "v1")

HOLE_SCRIPT = [
    scripted.calls(scripted.call("charge", {"order": "7"})),
    scripted.text("charged"),
]


def _stop_if_asked(ctx: da.ToolContext) -> None:
    if os.environ.get("DA_STOP_INSIDE") == ctx.call_id:
        os.kill(os.getpid(), signal.SIGSTOP)


if DEPLOY == "v2":

    @da.tool
    def charge(order: str, currency: str, ctx: da.ToolContext) -> dict:
        """Charge an order (not safe to repeat)."""
        _stop_if_asked(ctx)
        fire(ctx, "charge")
        return {"charged": order, "currency": currency}

else:

    @da.tool
    def charge(order: str, ctx: da.ToolContext) -> dict:  # type: ignore[misc]
        """Charge an order (not safe to repeat)."""
        _stop_if_asked(ctx)
        fire(ctx, "charge")
        return {"charged": order}


@da.tool(read_only=True)
def peek(order: str) -> dict:
    """Look at an order."""
    return {"order": order}


hole_agent = da.Agent(
    "hole-charge",
    ScriptedModel(HOLE_SCRIPT),
    "Charge the order.",
    [peek] if DEPLOY == "removed" else [charge, peek],
    on_drift=os.environ.get("DA_ON_DRIFT") or None,
)


@da.tool(read_only=True)
def slow_lookup(order: str) -> dict:
    """Look an order up, slowly (so concurrent deliveries overlap)."""
    import time

    time.sleep(0.5)
    return {"order": order, "status": "shipped"}


slow_chat = da.Agent(
    "hole-slow-chat",
    ScriptedModel(
        [scripted.calls(scripted.call("slow_lookup", {"order": "7"})), scripted.text("shipped")]
    ),
    "Answer about orders.",
    [slow_lookup],
)


@da.tool(read_only=True)
def dawdle(order: str) -> dict:
    """Look an order up; a process started with ``DA_DAWDLE=1`` hangs here, holding the
    run's lease, until it is killed (the instant-takeover tests)."""
    if os.environ.get("DA_DAWDLE"):
        import time

        time.sleep(120)
    return {"order": order, "status": "shipped"}


@da.tool(read_only=True)
def hang_up(order: str) -> dict:
    """Look an order up; a process started with ``DA_CLOSED_AT=<file>`` first closes its
    thread's Django connection (housekeeping a tool might do), writes that connection's old
    server pid to the file, and hangs until killed (the liveness tests)."""
    mark = os.environ.get("DA_CLOSED_AT")
    if mark:
        import time
        from pathlib import Path

        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        connection.close()
        Path(mark).write_text(str(pid))
        time.sleep(120)
    return {"order": order, "status": "shipped"}


hanging_up = da.Agent(
    "hole-hang-up",
    ScriptedModel(
        [scripted.calls(scripted.call("hang_up", {"order": "7"})), scripted.text("shipped")]
    ),
    "Answer about orders.",
    [hang_up],
)


dawdling = da.Agent(
    "hole-dawdle",
    ScriptedModel(
        [scripted.calls(scripted.call("dawdle", {"order": "7"})), scripted.text("shipped")]
    ),
    "Answer about orders.",
    [dawdle],
)
