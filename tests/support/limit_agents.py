"""Agents the limit tests drive through real Celery workers (tests/integration/test_limits.py).

Each tool measures for itself how many calls run at once: it adds itself to a Redis counter
when it starts (``<prefix>:in``), keeps the highest count seen (``<prefix>:max``), sleeps a
little, fires (``test_effects``, outside the journal) and takes itself off the counter. The
prefix and the Redis URL come from the run's input (``{"redis": url, "prefix": p}``) — so each
test measures only its own runs — and ``DA_LIMIT_KILL_RUN`` (a run id, set only for the worker
that should die) makes the tool SIGKILL its worker's whole process group while it holds its
slot, counted in and never out.
"""

from __future__ import annotations

import json
import os
import signal
import time

import redis

import durable_agents as da
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from tests.support.agents import fire

_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""

SLEEP = 0.25


def _measured(ctx: da.ToolContext, where: str) -> str:
    setup = json.loads(where)
    client = redis.Redis.from_url(setup["redis"])
    prefix = setup["prefix"]
    client.eval(_ENTER, 2, f"{prefix}:in", f"{prefix}:max")
    try:
        if os.environ.get("DA_LIMIT_KILL_RUN") == ctx.run_id:
            client.set(f"{prefix}:killed", ctx.run_id)
            os.killpg(os.getpgrp(), signal.SIGKILL)  # dies holding its slot
        time.sleep(SLEEP)
        fire(ctx, f"{ctx.tool_name}@{os.getpid()}")
        return "done"
    finally:
        client.decr(f"{prefix}:in")


@da.tool(read_only=True)
def limited_work(where: str, ctx: da.ToolContext) -> str:
    """Work that the agent's run limit bounds."""
    return _measured(ctx, where)


@da.tool(read_only=True, max_concurrent=1)
def one_at_a_time(where: str, ctx: da.ToolContext) -> str:
    """Work only one call of which may run at once, across every worker."""
    return _measured(ctx, where)


@da.tool(read_only=True)
def free_work(where: str, ctx: da.ToolContext) -> str:
    """The same work with no limit: what the limits are measured against."""
    return _measured(ctx, where)


class _Echo:
    """Calls ``tool`` with the run's input (the test's Redis URL and prefix) in turns 1 and
    2, then answers. Deterministic in the request alone, as a replay needs."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.model_id = f"limits:{tool}"

    def generate(self, request: ModelRequest) -> ModelResponse:
        where = str(request.messages[0].content)
        n = sum(1 for m in request.messages if m.role == "assistant")
        if n < 2:
            call = ToolCall(f"call_{n + 1}", self.tool, json.dumps({"where": where}))
            message = Message("assistant", "", tool_calls=(call,))
            return ModelResponse(
                message, Usage(10, 5), FINISH_TOOL_CALLS, "scripted", self.model_id
            )
        message = Message("assistant", "all done")
        return ModelResponse(message, Usage(10, 5), FINISH_STOP, "scripted", self.model_id)


limited_runs = da.Agent(
    "limit-runs", _Echo("limited_work"), "", [limited_work], max_concurrent_runs=2
)
limited_tool = da.Agent("limit-tool", _Echo("one_at_a_time"), "", [one_at_a_time])
unlimited = da.Agent("limit-free", _Echo("free_work"), "", [free_work])
dying = da.Agent("limit-dying", _Echo("limited_work"), "", [limited_work], max_concurrent_runs=1)
