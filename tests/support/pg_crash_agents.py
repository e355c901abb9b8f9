"""Agents the PostgreSQL crash test drives (tests/acceptance/test_postgres_crash.py), one per
durability: ``pgcrash-sync`` and ``pgcrash-async``. Child processes load them through
``DA_EXTRA_AGENTS=tests.support.pg_crash_agents``.

Their tools count every fire in a file (``DA_EFFECTS_FILE``), one line per fire appended
with a single ``write``: outside the database the test crashes, so a fire the journal lost is
still counted.

Each run: turn 1 looks ``a`` up (read-only), turn 2 charges ``a`` (a side effect), turn 3
looks ``b`` up and notifies about ``b`` (idempotent), turn 4 charges ``b``, turn 5 charges
``c``, turn 6 answers.
"""

from __future__ import annotations

import os
import time

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

ANSWER = "charged"
SIDE_EFFECTS = {"call_2_1", "call_4_1", "call_5_1"}  # charge: at most once, ever
RETRY_SAFE = {"call_1_1": "look", "call_3_1": "look", "call_3_2": "notify"}


def fire(ctx: da.ToolContext, tool: str) -> None:
    line = f"{ctx.run_id} {ctx.call_id} {tool} {ctx.idempotency_key}\n".encode()
    fd = os.open(os.environ["DA_EFFECTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of one short line: appends never interleave
    finally:
        os.close(fd)


def _pause() -> None:
    time.sleep(float(os.environ.get("DA_TOOL_SLEEP") or 0))


@da.tool(read_only=True)
def look(item: str, ctx: da.ToolContext) -> dict:
    """Look an item up."""
    _pause()
    fire(ctx, "look")
    return {"item": item, "stock": 3}


@da.tool(idempotent=True)
def notify(item: str, ctx: da.ToolContext) -> dict:
    """Notify about an item (deduplicated by the call's idempotency key)."""
    _pause()
    fire(ctx, "notify")
    return {"sent": item}


@da.tool
def charge(item: str, ctx: da.ToolContext) -> dict:
    """Charge for an item: a side effect, at most once."""
    _pause()
    fire(ctx, "charge")
    return {"charged": item}


SCRIPT = [
    scripted.calls(scripted.call("look", {"item": "a"})),
    scripted.calls(scripted.call("charge", {"item": "a"})),
    scripted.calls(scripted.call("look", {"item": "b"}), scripted.call("notify", {"item": "b"})),
    scripted.calls(scripted.call("charge", {"item": "b"})),
    scripted.calls(scripted.call("charge", {"item": "c"})),
    scripted.text(ANSWER),
]


# ``pgcrash-reads-<durability>``: three turns of one read-only ``peek`` each, then the answer.
# With ``DA_GATE_FILE`` set, the third call writes ``<file>.waiting`` and waits for the file:
# the test crashes the server while the run's records since its start are all relaxed.
READS_ANSWER = "peeked"


@da.tool(read_only=True)
def peek(item: str, ctx: da.ToolContext) -> dict:
    """Peek at an item."""
    fire(ctx, "peek")
    gate = os.environ.get("DA_GATE_FILE")
    if gate and ctx.call_id == "call_3_1":
        with open(f"{gate}.waiting", "w") as f:
            f.write(ctx.run_id)
        deadline = time.monotonic() + 30
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
    return {"item": item}


READS = [scripted.calls(scripted.call("peek", {"item": i})) for i in "abc"]

agents = [
    da.Agent(
        f"pgcrash-{durability}",
        ScriptedModel(SCRIPT),
        "Look, charge, notify, charge, answer.",
        [look, notify, charge],
        durability=durability,
    )
    for durability in ("sync", "async")
] + [
    da.Agent(
        f"pgcrash-reads-{durability}",
        ScriptedModel([*READS, scripted.text(READS_ANSWER)]),
        "Peek three times, answer.",
        [peek],
        durability=durability,
    )
    for durability in ("sync", "async")
]
