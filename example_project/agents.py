"""The example support agent: five tools, one of each safety class, and a question for staff.

* ``lookup_order`` — read-only: safe to re-run after a crash.
* ``send_receipt`` — idempotent: passes ``ctx.idempotency_key`` to the mailer, which drops
  repeats, so re-running it is harmless.
* ``refund`` — requires approval: staff decide in the admin before it runs, once.
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
from durable_agents.engine.model import ModelRequest, ModelResponse
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

ORDERS = {
    "7": {"order_id": "7", "customer": "ada@example.com", "total_cents": 4200, "status": "late"},
    "8": {"order_id": "8", "customer": "bob@example.com", "total_cents": 1500, "status": "ok"},
}


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


@da.tool(requires_approval=True)
def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund part or all of an order. A staff member approves every refund."""
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
        scripted.call("refund", {"order_id": "7", "amount_cents": 4200}),
    ),
    scripted.calls(scripted.call("send_receipt", {"order_id": "7"})),
    scripted.text("I refunded order 7 in full (42.00) and emailed you a receipt."),
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
