"""``python manage.py demo``: the whole promise in under a minute, on SQLite.

A message arrives through the signed webhook; the agent looks the order up, notes it in the
CRM and asks to refund it; the refund waits for staff approval; a worker approving it is
killed (SIGKILL) right after the refund; recovery finishes the run without refunding twice;
the answer goes out; a redelivered webhook is harmless. Then the customer writes again: the
parcel never arrived; the agent ships a replacement, and its tool asks staff which warehouse
ships it (the run waits ``awaiting_input``); staff answer, and the run finishes. Then the
refund policy (docs/approvals.md) decides four refunds of the refund desk: one allowed by a
rule, one escalated to on-call and decided by a lead's deputy, one that expired, one refused
by a rule. Last, the stock desk, whose tools are a small MCP server's (stdio), reserves stock
once staff approved it: exactly once, counted by the server.
(Deadlines count hours and days: the demo moves a request's clock back, as if the
time had passed, then runs the timer sweep beat would run.)

Each run of the story starts clean: the previous story's runs, action log and side-effect
ledger are removed first, so the admin shows one story (``--keep`` keeps them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.test import RequestFactory
from django.urls import resolve, reverse

import durable_agents as da
from durable_agents.celery.recovery import recover
from durable_agents.conf import get_settings
from durable_agents.database.store import site_store
from durable_agents.webhooks import sign
from example_project import agents

CRASH_LEASE_TTL = "2"
SESSION = "demo-chat"


class Command(BaseCommand):
    help = "Run the durable_agents story end to end on the embedded default."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--approve", nargs=2, metavar=("RUN_ID", "CALL_ID"), help=argparse_suppress()
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the previous story's runs (default: reset)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("approve"):
            run_id, call_id = options["approve"]
            da.approve(run_id, call_id, True, by="demo", note="checked the order")
            return
        self.story(reset=not options["keep"])

    def say(self, text: str = "") -> None:
        self.stdout.write(text)

    def story(self, *, reset: bool = True) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        User = get_user_model()
        if not User.objects.filter(username="demo").exists():
            User.objects.create_superuser("demo", "demo@example.com", "demo")
        self.staff()
        chat = SESSION
        if reset:
            self.reset(chat)
        else:
            chat = f"{SESSION}-{int(time.time())}"
        body = json.dumps({"session": chat, "text": "My order 7 is late. Please refund it."})

        self.say("1. A customer message arrives at the signed webhook (delivery d-1).")
        response = self.post_webhook(body, "d-1")
        sent = json.loads(response.content)
        run_id = sent["run_id"]
        self.say(f"   {response.status_code} {sent['status']}: turn run {run_id!r}")
        store = site_store()
        self.say(
            f"   the agent looked order 7 up, noted the CRM, and asked to refund: run is "
            f"{store.get_run(run_id).status}"
        )

        [request] = store.list_approval_requests(run_id=run_id)
        self.say(f"2. Staff see the gated call: {request.tool_name}({request.arguments})")
        again = self.post_webhook(body, "d-1")
        self.say(
            f"   the same delivery arrives again: {again.status_code} "
            f"{json.loads(again.content)['status']} (no second turn)"
        )

        self.say("3. A worker approves it and is killed (SIGKILL) right after the refund.")
        child = subprocess.run(
            [sys.executable, sys.argv[0], "demo", "--approve", run_id, request.call_id],
            env={
                **os.environ,
                "DURABLE_AGENTS_CRASH_AT": f"after-result:{request.call_id}",
                "DURABLE_AGENTS_LEASE_TTL": CRASH_LEASE_TTL,
            },
            capture_output=True,
            text=True,
            check=False,
        )
        self.say(
            f"   worker exit: signal {-child.returncode}; refunds so far: "
            f"{len(agents.effects('refund'))}; run is {store.get_run(run_id).status}"
        )

        self.say("4. Recovery (what Celery beat runs) picks the run up once the lease expires.")
        deadline = time.monotonic() + 30
        while store.get_run(run_id).status != "finished" and time.monotonic() < deadline:
            recover()
            time.sleep(0.5)
        run = store.get_run(run_id)
        self.say(f"   run is {run.status}; answer: {run.answer!r}")
        counts = {k: len(agents.effects(k)) for k in ("crm", "refund", "receipt")}
        self.say(
            f"   side effects: CRM notes {counts['crm']}, refunds {counts['refund']}, "
            f"receipts {counts['receipt']} (each exactly once)"
        )

        third = self.post_webhook(body, "d-1")
        self.say(
            f"5. The delivery arrives once more: {third.status_code} "
            f"{json.loads(third.content)['answer']!r}"
        )
        self.ask_staff(chat, store)
        self.rulebook(store, reset)
        self.stock(store, reset)
        self.say()
        self.say(
            "See the same run in the admin: python manage.py runserver, then open "
            "http://127.0.0.1:8000/admin/ and log in as demo / demo."
        )

    def ask_staff(self, chat: str, store: Any) -> None:
        body = json.dumps({"session": chat, "text": "Order 7 never arrived. Send a new one?"})
        self.say("6. The customer writes again (delivery d-2): the parcel never arrived.")
        response = self.post_webhook(body, "d-2")
        run_id = json.loads(response.content)["run_id"]
        self.say(f"   the agent ships a replacement; run is {store.get_run(run_id).status}")
        [waiting] = da.pending(statuses=["awaiting_input"])
        [question] = waiting.waits
        self.say(f"   staff are asked ({question.name}): {question.prompt}")
        wrong = "PAR"
        try:
            da.answer_interrupt(run_id, question.name, {"code": wrong}, by="demo")
        except da.InterruptAnswerInvalid as exc:
            self.say(f"   an answer of {wrong!r} is refused ({exc.code}), nothing recorded")
        self.say(
            "7. Staff answer HAM (da.answer_interrupt; the answer is checked, journaled once)."
        )
        da.answer_interrupt(run_id, question.name, {"code": "HAM"}, by="demo")
        run = store.get_run(run_id)
        shipments = agents.effects("shipment")
        self.say(f"   run is {run.status}; answer: {run.answer!r}")
        self.say(
            f"   shipments {len(shipments)}, from "
            f"{', '.join(s['warehouse'] for s in shipments)} (exactly once)"
        )

    def staff(self) -> None:
        """The support desk's people: demo and lena lead support, fay and finn are finance,
        olaf is on call, dora stands in for leads who are away. Each may decide calls."""
        from django.contrib.auth.models import Group, Permission

        User = get_user_model()
        decide = Permission.objects.get(codename="approve_toolcall")
        for name, group in (
            ("demo", "support-leads"),
            ("lena", "support-leads"),
            ("fay", "finance"),
            ("finn", "finance"),
            ("olaf", "oncall"),
            ("dora", None),
        ):
            user, _ = User.objects.get_or_create(username=name, defaults={"is_staff": True})
            user.user_permissions.add(decide)
            if group is not None:
                user.groups.add(Group.objects.get_or_create(name=group)[0])

    def rulebook(self, store: Any, reset: bool) -> None:
        from datetime import timedelta

        from django.db.models import F
        from django.utils import timezone

        from durable_agents.engine.commands.timers import wake_timers
        from durable_agents.models import ApprovalRequest

        def age(run_id: str, hours: float) -> None:
            ago = timedelta(hours=hours)
            ApprovalRequest.objects.filter(run_id=run_id).update(
                created_at=F("created_at") - ago, due_at=F("due_at") - ago
            )

        def ask(run_id: str, order: str, cents: int) -> Any:
            try:
                agents.refund_desk.run(run_id, f"refund order {order}: {cents}")
            except da.Pause:
                pass
            return store.get_run(run_id)

        suffix = "" if reset else f"-{int(time.time())}"
        small, escalated, expired, big = (
            f"desk-{name}{suffix}" for name in ("small", "escalated", "expired", "big")
        )
        refunds = len(agents.effects("refund"))
        self.say(
            "8. The refund policy decides four refunds of the refund desk (docs/approvals.md)."
        )
        run = ask(small, "8", 1_500)
        self.say(
            f"   15.00 EUR: allowed by rule small (amount_cents 1500 <= 5000), nobody asked; "
            f"run is {run.status}, refunds {len(agents.effects('refund')) - refunds}"
        )
        run = ask(escalated, "9", 80_000)
        [request] = store.list_approval_requests(run_id=escalated)
        self.say(
            f"   800.00 EUR: rule {request.policy['rule']} asks one of support-leads; run is "
            f"{run.status}"
        )
        age(escalated, 24)
        wake_timers()
        request = store.get_approval_request(escalated, request.call_id)
        steps = [
            r.name.rsplit(":", 1)[-1]
            for r in da.Journal(store).records(escalated)
            if r.name.startswith("deadline:")
        ]
        self.say(
            "   a day later (the demo moves the request back 24 h; the timer sweep runs): "
            f"deadline step(s) {', '.join(steps)}: on-call ({request.policy.get('escalated_to')}) "
            "may decide too"
        )
        now = timezone.now()
        delegation = da.delegate(
            "lena", "dora", starts_at=now, ends_at=now + timedelta(days=7), by="lena",
            note="away this week",
        )  # fmt: skip
        outcome = da.approve(escalated, request.call_id, True, by="dora", note="checked")
        decided = da.Journal(store).get(escalated, f"approval:{request.call_id}")
        self.say(
            "   lena is away this week; her deputy dora decides for her: "
            f"{outcome.status} by {decided.get('decided_by') if decided else '?'}; "
            f"run is {store.get_run(escalated).status}"
        )
        da.revoke_delegation(delegation.id, by="lena")
        run = ask(expired, "10", 60_000)
        [request] = store.list_approval_requests(run_id=expired)
        age(expired, 72)
        wake_timers()
        request = store.get_approval_request(expired, request.call_id)
        self.say(
            f"   600.00 EUR: nobody decided in 3 days (moved back): request {request.status}; "
            f"run is {store.get_run(expired).status}"
        )
        try:
            da.approve(expired, request.call_id, True, by="lena")
        except da.DurableAgentsError as exc:
            self.say(f"   approving it now is refused ({exc.code})")
        run = ask(big, "11", 600_000)
        self.say(
            f"   6,000.00 EUR: refused by rule too-big, nobody asked; run is {run.status}: "
            f"{run.answer!r}"
        )
        self.say(
            f"   refunds made by the desk: {len(agents.effects('refund')) - refunds} (15.00 and "
            "800.00, each exactly once)"
        )

    def stock(self, store: Any, reset: bool) -> None:
        """The stock desk's tools are an MCP server's (``example_project/stock.py``): its
        gated reservation waits in the inbox like any gated call, and fires once."""
        from example_project.stock import mcp_installed, stock_desk, warehouse

        if not mcp_installed():
            self.say("9. (The stock desk's MCP server needs: pip install 'durable-agents[mcp]')")
            return
        run_id = "desk-stock" if reset else f"desk-stock-{int(time.time())}"
        self.say(
            "9. The stock desk's tools come from an MCP server (the warehouse, over stdio): "
            + ", ".join(sorted(stock_desk.tools))
        )
        try:
            stock_desk.run(run_id, "Reserve two mugs for order 7.")
        except da.ApprovalPending:
            pass
        [request] = store.list_approval_requests(run_id=run_id)
        self.say(f"   staff see the gated call: {request.tool_name}({request.arguments})")
        before = len(agents.effects("reservation"))
        da.approve(run_id, request.call_id, True, by="demo", note="in stock")
        run = store.get_run(run_id)
        self.say(f"   approved; run is {run.status}: {run.answer!r}")
        da.resume(run_id)
        self.say(
            f"   reservations made by the server: {len(agents.effects('reservation')) - before}"
            " (exactly once, counted by the server)"
        )
        warehouse.close()

    def reset(self, chat: str) -> None:
        """Remove the previous story: its runs (journal, approvals, halts go with them), their
        action log rows and the side-effect ledger."""
        from durable_agents.models import ActionLog, Delegation, Run

        for prefix in (f"{chat}>", "desk-"):
            Run.objects.filter(run_id__startswith=prefix).delete()
            ActionLog.objects.filter(run_id__startswith=prefix).delete()
        # The refund desk's deputy, recorded and ended by the last story.
        Delegation.objects.filter(approver="lena", deputy="dora").delete()
        ActionLog.objects.filter(action__in=("delegate", "revoke-delegation")).delete()
        agents.effects_path().unlink(missing_ok=True)

    def post_webhook(self, body: str, delivery_id: str) -> Any:
        """A signed delivery, through the site's own webhook view (in this process)."""
        url = reverse("inbound-webhook")
        secret = get_settings().webhook_secrets[0]
        request = RequestFactory().post(
            url,
            data=body,
            content_type="application/json",
            HTTP_X_SIGNATURE=sign(body.encode(), delivery_id, secret),
            HTTP_X_DELIVERY_ID=delivery_id,
        )
        return resolve(url).func(request)


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS
