"""Agents whose runs wait on a person the way an approver meets them (issue 30): a payment
whose e-mail memo is padded so PostgreSQL's key order (shorter keys first) puts it before
the payee, a tool that times out after the money may have moved, a question with choices,
and (issue 44) a payment whose memo, first in its schema, reads like the fields. Listed in
tests/settings.py AGENTS, so the live server and workers load them.
"""

from __future__ import annotations

from typing import Annotated

import pydantic

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import fire

PAYEE = "Mallory Holdings Ltd (IBAN GB33 BUKB 2020 1555 5555 55)"
GATEWAY_MESSAGE = "payment gateway timed out after 30s; the transfer may have been sent"
REASON = (
    "The supplier's e-mail asks us to pay invoice INV-7 today to their new bank account, "
    "so I am paying it."
)
# An e-mail as a model copies it into a memo: line breaks, then enough padding that a list
# cut at 1,500 characters shows nothing after it.
MEMO = (
    "Hello accounts team,\n\nplease pay invoice INV-7 today.\nOur bank details changed, "
    "see below.\n\nKind regards,\nACME Supplies\n\n" + "Lorem ipsum dolor sit amet. " * 90
)
LINES = [f"line {n}: widget batch {n}, 12 units" for n in range(1, 15)]


def _payment_summary(args: dict) -> str:
    return f"Pay {args['amount_cents'] / 100:,.2f} EUR to {args['payee']}"


@da.tool(requires_approval=True, summary=_payment_summary)
def send_payment(
    payee: Annotated[str, pydantic.Field(title="Payee", description="who receives the money")],
    amount_cents: Annotated[int, pydantic.Field(title="Amount (cents)")],
    memo: Annotated[str, pydantic.Field(title="Memo")],
    lines: Annotated[list[str], pydantic.Field(title="Invoice lines")],
    ctx: da.ToolContext,
) -> dict:
    """Send a bank transfer (gated: a person approves first)."""
    fire(ctx, "send_payment")
    return {"sent": amount_cents}


padded_payment = da.Agent(
    "inbox-payment",
    ScriptedModel(
        [
            scripted.calls(
                scripted.call(
                    "send_payment",
                    {"payee": PAYEE, "amount_cents": 1250000, "memo": MEMO, "lines": LINES},
                ),
                text=REASON,
            ),
            scripted.text("paid"),
        ]
    ),
    "Pay suppliers' invoices.",
    [send_payment],
)


@da.tool
def transfer(to: str, cents: int, ctx: da.ToolContext) -> dict:
    """Move money through the payment gateway (a side effect: at most once)."""
    fire(ctx, "transfer")
    raise da.ToolOutcomeUnknown(GATEWAY_MESSAGE)


# Its one call's outcome is unknown, in the tool's own words: the run halts.
unsure_transfer = da.Agent(
    "inbox-transfer",
    ScriptedModel(
        [
            scripted.calls(scripted.call("transfer", {"to": "bob", "cents": 4200})),
            scripted.text("transferred"),
        ]
    ),
    "Transfer money.",
    [transfer],
)


@da.tool(read_only=True)
def ask_staff(order: str, ctx: da.ToolContext) -> str:
    """Ask staff whether to grant an exception to the refund policy."""
    return str(
        ctx.interrupt(
            "exception",
            f"Grant a refund exception for {order}? The customer is 40 days past the window.",
            schema={"type": "string", "enum": ["grant", "refuse"]},
        )
    )


asks_staff = da.Agent(
    "inbox-question",
    ScriptedModel(
        [
            scripted.calls(scripted.call("ask_staff", {"order": "o-9"})),
            scripted.text("asked"),
        ]
    ),
    "Ask staff about refund exceptions.",
    [ask_staff],
)


# A memo that reads like the fields (issue 44, item 8): 1,700 characters, first in the
# tool's schema, opening with a payee, an IBAN and an amount that are not the call's.
DECOY = (
    "Payee: ACME Supplies GmbH\nIBAN: DE89 3704 0044 0532 0130 00\nAmount: 12,500.00 EUR\n"
    "Reference: INV-7\n\n"
)
DECOY_MEMO = (
    DECOY + "".join(f"Note {n}: our bank details changed, see above.\n" for n in range(1, 80))
)[:1700]


@da.tool(requires_approval=True, identifying=["payee", "amount_cents"])
def pay_supplier(
    memo: Annotated[str, pydantic.Field(title="Memo")],
    payee: Annotated[str, pydantic.Field(title="Payee", description="who receives the money")],
    amount_cents: Annotated[int, pydantic.Field(title="Amount (cents)")],
    lines: Annotated[list[str], pydantic.Field(title="Invoice lines")],
    ctx: da.ToolContext,
) -> dict:
    """Pay a supplier's invoice (gated: a person approves first)."""
    fire(ctx, "pay_supplier")
    return {"sent": amount_cents}


decoy_payment = da.Agent(
    "inbox-decoy",
    ScriptedModel(
        [
            scripted.calls(
                scripted.call(
                    "pay_supplier",
                    {
                        "memo": DECOY_MEMO,
                        "payee": PAYEE,
                        "amount_cents": 1250000,
                        "lines": LINES[:10],
                    },
                ),
                text=REASON,
            ),
            scripted.text("paid"),
        ]
    ),
    "Pay suppliers' invoices.",
    [pay_supplier],
)
