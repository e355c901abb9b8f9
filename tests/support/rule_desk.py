"""The refund policy of issue 42 with its deadline, for what people see of it (the cards, the
call's page, the queue, the run page, the API): the support desk's refund under
``da.Rules`` that remind after 4 h, escalate to on-call after 24 h and expire after 3 days,
with a summary and identifying arguments as a real tool has. Its agent registers when this
module is imported (the tests that use it import it; the live server runs in their process).

The deadline's steps are taken by the timer sweep; ``escalate`` and ``age`` put a request
where a sweep would leave it (its policy's ``escalated_to``, its ``deadline:`` record), and
back-date it, so the pages are read at a known point of its deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.models import ApprovalRequest
from tests.support.agents import fire
from tests.support.rule_agents import FINANCE, LEADS, ONCALL, RefundModel

DESK_POLICY = da.Rules(
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
    deadline=da.Deadline(remind="4h", escalate=("24h", ONCALL), expire="3d"),
)


@da.tool(
    approval=DESK_POLICY,
    identifying=["order_id", "amount_cents"],
    summary=lambda a: f"Refund {a['amount_cents']:,} cents on order {a['order_id']}",
)
def refund(order_id: str, amount_cents: int, ctx: da.ToolContext) -> dict:
    """Refund an order."""
    fire(ctx, "refund")
    return {"order_id": order_id, "refunded_cents": amount_cents}


desk = da.Agent("rule-desk", RefundModel(), "You refund orders.", [refund])

CALL = "call_1_1"


def age(run_id: str, **delta: Any) -> None:
    """Back-date the run's request by ``delta`` (``hours=25``): asked that long ago."""
    ApprovalRequest.objects.filter(run_id=run_id).update(
        created_at=F("created_at") - timedelta(**delta)
    )


def escalate(run_id: str, call_id: str = CALL) -> None:
    """What the sweep does when the request's escalation falls due: its policy names the
    group it escalated to, and the step is journaled once."""
    request = ApprovalRequest.objects.get(run_id=run_id, call_id=call_id)
    policy = {**request.policy, "escalated_to": request.policy["deadline"]["escalate_to"]}
    site_store().update_approval_request(
        run_id, call_id, policy=policy, if_arguments=request.arguments
    )
    Journal(site_store()).write(
        run_id,
        names.deadline(call_id, "escalate"),
        {
            "kind": "deadline",
            "step": "escalate",
            "rule": policy.get("rule"),
            "escalated_to": policy["escalated_to"],
            "policy": policy,
        },
    )
