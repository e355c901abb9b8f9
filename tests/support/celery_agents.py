"""Agents the Celery worker tests drive (tests/integration/test_celery_workers.py).

``celery-steps`` (a side effect) and ``celery-steps-idempotent`` run three turns of one
``step`` call each, then answer; ``celery-mixed`` runs an idempotent ``step``, then a side
``effect``, then answers. Their tools count every fire in ``test_effects``
(``tests.support.agents.fire``), labelled with the process and thread that fired, so a test
can tell which worker fired what.

What a tool does besides firing is steered by environment variables, set only in the
environment of the worker that should do it (so a second worker behaves normally):

* ``DA_GATE_FILE``: the first model request in the process waits until this file exists
  (writing ``<file>.waiting`` first), so a test can hold a drive at a known point.
* ``DA_TOOL_SIGNAL_DIR``: a tool writes ``<run>.<call>.<pid>.started`` here when it starts.
* ``DA_TOOL_SLEEP``: seconds a tool sleeps after it started and before it fires.
* ``DA_KILL_INSIDE``: a call id; that call fires, then SIGKILLs the worker's whole process
  group (a prefork parent and all its children): the effect happened, its result never will.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import durable_agents as da
from durable_agents.engine.model import ModelRequest
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import fire

ANSWER = "steps done"
# Turn n calls step(item) once (call id call_<n>_1); turn 4 answers.
ITEMS = ["a", "b", "c"]
SCRIPT = [
    *(scripted.calls(scripted.call("step", {"item": item})) for item in ITEMS),
    scripted.text(ANSWER),
]
CALLS = [f"call_{n}_1" for n in range(1, len(ITEMS) + 1)]

GATE_DEADLINE = 60.0
_gated = threading.Event()


def driver_label() -> str:
    """Who fired: ``<pid>/<thread name>``; stored in ``test_effects.tool`` after ``step@``."""
    return f"{os.getpid()}/{threading.current_thread().name}"


def _gate(request: ModelRequest) -> None:
    gate = os.environ.get("DA_GATE_FILE")
    if not gate or _gated.is_set():
        return
    _gated.set()
    Path(f"{gate}.waiting").write_text(driver_label())
    deadline = time.monotonic() + GATE_DEADLINE
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def _step(item: str, ctx: da.ToolContext) -> dict:
    signal_dir = os.environ.get("DA_TOOL_SIGNAL_DIR")
    if signal_dir:
        name = f"{ctx.run_id}.{ctx.call_id}.{os.getpid()}.started"
        Path(signal_dir, name).write_text(driver_label())
    pause = float(os.environ.get("DA_TOOL_SLEEP") or 0)
    if pause:
        time.sleep(pause)
    fire(ctx, f"step@{driver_label()}")
    if os.environ.get("DA_KILL_INSIDE") == ctx.call_id:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the whole worker, parent and children
    return {"done": item}


@da.tool
def step(item: str, ctx: da.ToolContext) -> dict:
    """Do one step to an item; a side effect, not safe to repeat."""
    return _step(item, ctx)


@da.tool(name="step", idempotent=True)
def step_idempotent(item: str, ctx: da.ToolContext) -> dict:
    """Do one step to an item; safe to repeat."""
    return _step(item, ctx)


@da.tool(name="effect")
def effect(item: str, ctx: da.ToolContext) -> dict:
    """Do a side effect to an item; not safe to repeat."""
    return _step(item, ctx)


def _agent(name: str, tools: list[da.Tool], script: list[scripted.Turn] = SCRIPT) -> da.Agent:
    return da.Agent(
        name, ScriptedModel(script, on_request=_gate), "Do every step, in order.", tools
    )


# A side effect per step, and the same with a retry-safe (idempotent) step.
steps = _agent("celery-steps", [step])
steps_idempotent = _agent("celery-steps-idempotent", [step_idempotent])

# An idempotent step (call_1_1), then a side effect (call_2_1), then the answer.
MIXED_SCRIPT = [
    scripted.calls(scripted.call("step", {"item": "a"})),
    scripted.calls(scripted.call("effect", {"item": "b"})),
    scripted.text(ANSWER),
]
mixed = _agent("celery-mixed", [step_idempotent, effect], MIXED_SCRIPT)


# ``celery-napper``: one retry-safe ``nap`` call that sleeps ``DA_NAP_SECONDS`` (default 3,
# read by the driver that first meets the timer: that wake time is journaled), fires once it
# woke, then answers.
@da.tool(name="nap", idempotent=True)
def nap(ctx: da.ToolContext) -> dict:
    """Wait a few seconds, then do the step."""
    woke = ctx.sleep("nap", float(os.environ.get("DA_NAP_SECONDS") or 3))
    fire(ctx, f"step@{driver_label()}")
    return {"woke": woke.isoformat()}


napper = _agent(
    "celery-napper", [nap], [scripted.calls(scripted.call("nap", {})), scripted.text(ANSWER)]
)


# ``celery-inbox``: one retry-safe ``drain`` call that handles each message of the channel
# ``box`` (firing ``handle:<key>``) until one says stop, then answers.
@da.tool(name="drain", idempotent=True)
def drain(ctx: da.ToolContext) -> dict:
    """Handle the inbox's messages until one says stop."""
    while True:
        msg = ctx.receive("box")
        fire(ctx, f"handle:{msg.key}")
        ctx.ack("box", msg.key)
        if msg.payload == "stop":
            return {"drained": msg.key}


inbox = _agent(
    "celery-inbox", [drain], [scripted.calls(scripted.call("drain", {})), scripted.text(ANSWER)]
)


# ``celery-backend``: one read-only ``backend`` call that answers with the PostgreSQL backend
# of the driver's database connection (its thread's), then answers: which connection drove.
@da.tool(name="backend", read_only=True)
def backend() -> dict:
    """Name the database backend this driver talks to."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return {"pid": cursor.fetchone()[0]}


backend_agent = _agent(
    "celery-backend",
    [backend],
    [scripted.calls(scripted.call("backend", {})), scripted.text(ANSWER)],
)
