"""The example support agent: five tools, one of each safety class, and a question for staff.

* ``lookup_order`` — read-only: safe to re-run after a crash.
* ``send_receipt`` — idempotent: passes ``ctx.idempotency_key`` to the mailer, which drops
  repeats, so re-running it is harmless.
* ``refund`` — under the support desk's refund policy (``REFUND_POLICY``, docs/approvals.md):
  up to 50 EUR it goes through, up to 1,000 EUR a support lead decides, above that two of
  finance, never above 5,000 EUR; a deadline reminds, escalates to on-call and expires.
* ``update_crm`` — a side effect, not gated: at most once; a crash mid-call halts the run
  for a person to check the CRM.
* ``ship_replacement`` — idempotent, and it waits: it asks staff which warehouse ships the
  parcel (``ctx.interrupt`` with a schema; the run is ``awaiting_input`` until someone
  answers), then books the shipment under ``ctx.idempotency_key``.

The model is OpenAI or Anthropic when their key is in the environment, else a scripted
model that tells the demo's story. The "systems" the tools touch are a small JSON-lines
file (``.demo/effects.jsonl``), so you can count side effects outside the journal.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pydantic
from django.conf import settings

import durable_agents as da
from durable_agents.engine.model import Message, ModelRequest, ModelResponse
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

ORDERS = {
    "7": {"order_id": "7", "customer": "ada@example.com", "total_cents": 42000, "status": "late"},
    "8": {"order_id": "8", "customer": "bob@example.com", "total_cents": 1500, "status": "ok"},
}

# The support desk's refund policy, as docs/approvals.md writes it out: up to 50 EUR goes
# through; up to 1,000 EUR one support lead decides; above that two people from finance;
# never above 5,000 EUR (the customer calls); if nobody decides within 4 hours remind them,
# within 24 hours on-call may decide too, after 3 days it is refused; nobody approves a
# refund they asked for themselves. (Who stands in for a lead who is away is a delegation,
# recorded in the admin: not code.)
REFUND_POLICY = da.Rules(
    [
        da.Rule("small", da.arg("amount_cents") <= 5_000, da.allow),
        da.Rule(
            "too-big",
            da.arg("amount_cents") > 500_000,
            da.deny("Refunds above 5,000 EUR are done by phone: ask the customer to call."),
        ),
        da.Rule(
            "lead",
            da.arg("amount_cents") <= 100_000,
            da.ask("support-leads", requester_may_decide=False),
        ),
    ],
    default=da.ask(da.Quorum(2, "finance"), requester_may_decide=False),
    deadline=da.Deadline(remind="4h", escalate=("24h", "oncall"), expire="3d"),
)


def effects_path() -> Path:
    return Path(getattr(settings, "DEMO_DIR", Path(".demo"))) / "effects.jsonl"


def record_effect(kind: str, **data: Any) -> None:
    """Write down a side effect, outside the journal (append-only, one line each)."""
    path = effects_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"kind": kind, "at": time.time(), **data}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects(kind: str | None = None) -> list[dict[str, Any]]:
    path = effects_path()
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]


@da.tool(read_only=True)
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id: customer, total and status."""
    order = ORDERS.get(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return order


@da.tool(idempotent=True)
def send_receipt(order_id: str, ctx: da.ToolContext) -> str:
    """Email the customer a receipt for the order."""
    sent = {e["key"] for e in effects("receipt")}
    if ctx.idempotency_key not in sent:  # the mailer drops a repeat of the same key
        record_effect("receipt", order_id=order_id, key=ctx.idempotency_key)
    return f"receipt for order {order_id} sent"


@da.tool(approval=REFUND_POLICY, identifying=["order_id", "amount_cents"])
def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund part or all of an order, under the refund policy (staff approve the larger
    ones)."""
    record_effect("refund", order_id=order_id, amount_cents=amount_cents)
    return {"refund_id": f"re_{order_id}_{amount_cents}", "amount_cents": amount_cents}


@da.tool
def update_crm(order_id: str, note: str) -> str:
    """Add a note to the customer's record in the CRM."""
    record_effect("crm", order_id=order_id, note=note)
    return "noted"


WAREHOUSES = {"BER": "Berlin", "HAM": "Hamburg"}


class Warehouse(pydantic.BaseModel):
    """Which warehouse ships the parcel."""

    code: Literal["BER", "HAM"] = pydantic.Field(title="Warehouse (BER or HAM)")


@da.tool(idempotent=True)
def ship_replacement(order_id: str, ctx: da.ToolContext) -> str:
    """Ship the customer a replacement for the order. Staff pick the warehouse."""
    # A retry-safe tool may wait: it runs again from the top once staff answer, and the
    # shipping service drops a repeat of the same key.
    choice = ctx.interrupt(
        f"warehouse-{order_id}",
        f"Order {order_id} never arrived: which warehouse ships the replacement?",
        schema=Warehouse,
    )
    if ctx.idempotency_key not in {e["key"] for e in effects("shipment")}:
        record_effect("shipment", order_id=order_id, warehouse=choice.code, key=ctx.idempotency_key)
    return f"replacement for order {order_id} ships from {WAREHOUSES[choice.code]}"


TOOLS = [lookup_order, send_receipt, refund, update_crm, ship_replacement]
INSTRUCTIONS = (
    "You are a support agent for an online shop. Look orders up before acting. Refunds need "
    "staff approval. Note every refund in the CRM and send a receipt afterwards. When a "
    "parcel never arrived, ship a replacement. Be brief."
)

# The demo's story, for when no provider key is configured.
SCRIPT = [
    scripted.calls(scripted.call("lookup_order", {"order_id": "7"})),
    scripted.calls(
        scripted.call("update_crm", {"order_id": "7", "note": "late delivery, refund asked"}),
        scripted.call("refund", {"order_id": "7", "amount_cents": 42000}),
    ),
    scripted.calls(scripted.call("send_receipt", {"order_id": "7"})),
    scripted.text("I refunded order 7 in full (420.00) and emailed you a receipt."),
]
# The customer's next message in the same chat: the parcel never came at all.
REPLACEMENT_SCRIPT = [
    scripted.calls(scripted.call("ship_replacement", {"order_id": "7"})),
    scripted.text("A replacement for order 7 is on its way; staff picked the warehouse."),
]


class StoryModel:
    """The demo's scripted model: each customer message of the chat gets its own script.
    A chat's turn sees the earlier turns too, so the script's turns are counted from the
    latest user message."""

    model_id = "scripted-support"

    def __init__(self) -> None:
        self.refund = ScriptedModel(SCRIPT, model_id=self.model_id)
        self.replacement = ScriptedModel(REPLACEMENT_SCRIPT, model_id=self.model_id)

    def generate(self, request: ModelRequest) -> ModelResponse:
        messages = list(request.messages)
        last = max((i for i, m in enumerate(messages) if m.role == "user"), default=0)
        script = self.replacement if "never arrived" in messages[last].content else self.refund
        return script.generate(replace(request, messages=messages[last:]))


def _model() -> Any:
    if os.environ.get("OPENAI_API_KEY"):
        from durable_agents.providers import OpenAIChat

        return OpenAIChat(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    if os.environ.get("ANTHROPIC_API_KEY"):
        from durable_agents.providers import AnthropicMessages

        return AnthropicMessages(os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-6"))
    return StoryModel()


support = da.Agent("support", _model(), INSTRUCTIONS, TOOLS, max_turns=12)


class RefundDeskModel:
    """The refund desk's scripted model (when no provider key is set): it asks to refund
    the order and amount its message names (``"refund order 8: 1500"``), then says what the
    call returned."""

    model_id = "scripted-refund-desk"

    def generate(self, request: ModelRequest) -> ModelResponse:
        said = [m for m in request.messages if m.role == "assistant"]
        if not said:
            text = next(m.content for m in request.messages if m.role == "user")
            order, _, cents = text.removeprefix("refund order ").partition(": ")
            ask = scripted.call("refund", {"order_id": order, "amount_cents": int(cents)})
            return ScriptedModel([scripted.calls(ask)], model_id=self.model_id).generate(request)
        result = next(m.content for m in reversed(request.messages) if m.role == "tool")
        return ModelResponse(
            message=Message("assistant", f"The refund desk says: {result}"),
            model=self.model_id,
        )


# Refund requests from the desk's own form, one refund each: the policy decides who is asked.
refund_desk = da.Agent(
    "refund-desk",
    RefundDeskModel(),
    "You refund orders as staff ask.",
    [refund],
    max_turns=4,
)
