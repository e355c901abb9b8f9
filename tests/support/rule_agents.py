"""Agents under approval rules (issue 42): the support desk's refund policy of the issue,
written as ``da.Rules``, and the same policy with the issue's deadlines (``deadlines``).
Each scripted run asks for one refund of the amount in its input (``"refund 4000"``), so one
agent serves every branch of the policy. Effects are counted outside the journal
(``fire``). Listed in tests/settings.py AGENTS."""

from __future__ import annotations

import json
from typing import Any

import durable_agents as da
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelResponse,
    ToolCall,
    Usage,
)
from tests.support.agents import fire

LEADS, FINANCE, ONCALL = "support-leads", "finance", "oncall"

REFUND_POLICY = da.Rules(
    [
        da.Rule("small", da.arg("amount_cents") <= 5_000, da.allow),
        da.Rule(
            "too-big",
            da.arg("amount_cents") > 500_000,
            da.deny("Refunds above 5,000 EUR are done by phone: ask the customer to call."),
        ),
        da.Rule("lead", da.arg("amount_cents") <= 100_000, da.ask(LEADS)),
    ],
    default=da.ask(da.Quorum(2, FINANCE), requester_may_decide=False),
)


@da.tool(approval=REFUND_POLICY, identifying=["order_id", "amount_cents"])
def refund(order_id: str, amount_cents: int, ctx: da.ToolContext) -> dict:
    """Refund an order."""
    fire(ctx, "refund")
    return {"order_id": order_id, "refunded_cents": amount_cents}


class RefundModel:
    """Asks for the refund its run's input names (``"refund <cents>"``), then answers with
    what the call returned."""

    provider = "scripted"
    model_id = "scripted-refunds"

    def generate(self, request: Any) -> ModelResponse:
        said = [m for m in request.messages if m.role == "assistant"]
        if not said:
            text = next(m.content for m in request.messages if m.role == "user")
            cents = int(str(text).split()[-1])
            call = ToolCall(
                "call_1_1", "refund", json.dumps({"order_id": "7", "amount_cents": cents})
            )
            return ModelResponse(
                Message("assistant", "", tool_calls=(call,)),
                Usage(10, 5),
                FINISH_TOOL_CALLS,
                "scripted",
                self.model_id,
            )
        result = next(m.content for m in reversed(request.messages) if m.role == "tool")
        return ModelResponse(
            Message("assistant", f"done: {result}"),
            Usage(10, 5),
            FINISH_STOP,
            "scripted",
            self.model_id,
        )


refunds = da.Agent("rule-refunds", RefundModel(), "You refund orders.", [refund])


# The deadlines: a lead's refund reminds after 4 h, escalates to on-call after a day
# and is denied after three; finance's halts for a person after three days; an order marked
# "rush" is cancelled outright when nobody decides within the hour. Tests backdate the
# request rows (the database's clock cannot be moved) or use a child process's short ones.
DEADLINE_POLICY = da.Rules(
    [
        da.Rule("small", da.arg("amount_cents") <= 5_000, da.allow),
        da.Rule(
            "rush",
            da.arg("order_id") == "rush",
            da.ask(LEADS, deadline=da.Deadline(expire="1h", on_expiry="cancel")),
        ),
        da.Rule("lead", da.arg("amount_cents") <= 100_000, da.ask(LEADS)),
        da.Rule(
            "finance",
            da.arg("amount_cents") <= 500_000,
            da.ask(
                da.Quorum(2, FINANCE),
                requester_may_decide=False,
                deadline=da.Deadline(remind="1d", expire="3d", on_expiry="halt"),
            ),
        ),
    ],
    default=da.deny("Refunds above 5,000 EUR are done by phone: ask the customer to call."),
    deadline=da.Deadline(remind="4h", escalate=("24h", ONCALL), expire="3d", on_expiry="deny"),
)


@da.tool(name="refund", approval=DEADLINE_POLICY, identifying=["order_id", "amount_cents"])
def refund_in_time(order_id: str, amount_cents: int, ctx: da.ToolContext) -> dict:
    """Refund an order."""
    fire(ctx, "refund")
    return {"order_id": order_id, "refunded_cents": amount_cents}


class RushModel(RefundModel):
    """As ``RefundModel``, for the order its input names first (``"rush 4000"``)."""

    def generate(self, request: Any) -> ModelResponse:
        said = [m for m in request.messages if m.role == "assistant"]
        if said:
            return super().generate(request)
        words = str(next(m.content for m in request.messages if m.role == "user")).split()
        order = words[0] if len(words) > 1 and words[0] != "refund" else "7"
        call = ToolCall(
            "call_1_1",
            "refund",
            json.dumps({"order_id": order, "amount_cents": int(words[-1])}),
        )
        return ModelResponse(
            Message("assistant", "", tool_calls=(call,)),
            Usage(10, 5),
            FINISH_TOOL_CALLS,
            "scripted",
            self.model_id,
        )


deadlines = da.Agent("rule-deadlines", RushModel(), "You refund orders.", [refund_in_time])
