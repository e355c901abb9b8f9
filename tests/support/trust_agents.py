"""Agents for the edges of trust around trees (issue 41), driven by the acceptance tests'
child processes (listed in tests/settings.py AGENTS). Every effect is counted in
``test_effects``, outside the journal.

* ``vet-pay`` asks its sub-agent ``vet-check`` who is owed (call ``call_1_1``, so the sub-run
  is ``<run>/call_1_1``), then pays whoever the answer names (``pay``, at most once, call
  ``call_2_1``); a call that failed: it answers without paying. ``vet-check`` has staff sign
  the payee off (gated), then answers the payee: ``DA_VET_PAYEE`` (``bob`` unless set).
  What an import at ``<run>/call_1_1`` would steer: the payee, past the sign-off.
* ``daily-root`` asks ``daily-leaf``, whose one call posts the daily digest: a tool whose
  rate is ``1/d``, so a second run in a day waits, ``throttled``, until tomorrow.
"""

from __future__ import annotations

import json
import os

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
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import fire


def _say(text: str, model_id: str) -> ModelResponse:
    message = Message("assistant", text)
    return ModelResponse(message, Usage(10, 5), FINISH_STOP, "scripted", model_id)


def _call(call_id: str, tool: str, args: dict, model_id: str) -> ModelResponse:
    message = Message("assistant", "", tool_calls=(ToolCall(call_id, tool, json.dumps(args)),))
    return ModelResponse(message, Usage(10, 5), FINISH_TOOL_CALLS, "scripted", model_id)


@da.tool(requires_approval=True)
def sign_off_payee(payee: str, ctx: da.ToolContext) -> dict:
    """Record that staff vetted the payee (gated: a person signs it off)."""
    fire(ctx, "sign_off_payee")
    return {"signed_off": payee}


@da.tool
def pay(to: str, ctx: da.ToolContext) -> dict:
    """Pay the vetted payee (a side effect: at most once)."""
    fire(ctx, f"pay:{to}")
    return {"paid": to}


class _Checker:
    """Signs the payee off, then answers the payee's name."""

    model_id = "trust:checker"

    def generate(self, request: ModelRequest) -> ModelResponse:
        payee = os.environ.get("DA_VET_PAYEE", "bob")
        if not any(m.role == "assistant" for m in request.messages):
            return _call("call_1_1", "sign_off_payee", {"payee": payee}, self.model_id)
        return _say(payee, self.model_id)


class _Payer:
    """Asks who is owed, then pays whoever the answer names; an error result: no payment."""

    model_id = "trust:payer"

    def generate(self, request: ModelRequest) -> ModelResponse:
        turns = sum(1 for m in request.messages if m.role == "assistant")
        results = [m for m in request.messages if m.role == "tool"]
        if turns == 0:
            return _call("call_1_1", "vet-check", {"input": "who is owed?"}, self.model_id)
        if turns == 1:
            if results[-1].is_error:
                return _say("not paid: the payee could not be vetted", self.model_id)
            payee = results[-1].content
            return _call("call_2_1", "pay", {"to": payee}, self.model_id)
        return _say("paid", self.model_id)


vet_check = da.Agent("vet-check", _Checker(), "Vet the payee.", [sign_off_payee])
vet_pay = da.Agent("vet-pay", _Payer(), "Pay whoever is owed, once vetted.", [vet_check.as_tool()])


@da.tool(rate="1/d")
def post_digest(day: str, ctx: da.ToolContext) -> dict:
    """Post the daily digest (a side effect, at most once a day across the site)."""
    fire(ctx, "post_digest")
    return {"posted": day}


daily_leaf = da.Agent(
    "daily-leaf",
    ScriptedModel(
        [scripted.calls(scripted.call("post_digest", {"day": "mon"})), scripted.text("posted")]
    ),
    "Post the digest.",
    [post_digest],
)
daily_root = da.Agent(
    "daily-root",
    ScriptedModel(
        [
            scripted.calls(scripted.call("daily-leaf", {"input": "digest"})),
            scripted.text("done"),
        ]
    ),
    "Have the digest posted.",
    [daily_leaf.as_tool()],
)
