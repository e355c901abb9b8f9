"""``python manage.py demo``: the whole promise in under a minute, on SQLite.

A message arrives through the signed webhook; the agent looks the order up, notes it in the
CRM and asks to refund it; the refund waits for staff approval; a worker approving it is
killed (SIGKILL) right after the refund; recovery finishes the run without refunding twice;
the answer goes out; a redelivered webhook is harmless. Then the customer writes again: the
parcel never arrived; the agent ships a replacement, and its tool asks staff which warehouse
ships it (the run waits ``awaiting_input``); staff answer, and the run finishes.

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

    def reset(self, chat: str) -> None:
        """Remove the previous story: its runs (journal, approvals, halts go with them), their
        action log rows and the side-effect ledger."""
        from durable_agents.models import ActionLog, Run

        prefix = f"{chat}>"
        Run.objects.filter(run_id__startswith=prefix).delete()
        ActionLog.objects.filter(run_id__startswith=prefix).delete()
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
