"""A broker that cannot be reached never fails what already committed (issue 44, item 2):
the webhook answers JSON 202 with its turn queued and says the hand-over is deferred, the
API's start answers 202, ``agent.start()`` returns its run id and logs a warning, and beat
recovery hands each run over once the broker is back. Nothing is lost and nothing runs
twice."""

from __future__ import annotations

import json
import logging

import pytest
from django.conf import settings
from django.test import Client

from durable_agents.engine.commands.recovery import recover
from durable_agents.models import JournalEntry, Run
from durable_agents.webhooks import sign
from tests.support.agents import count_effects, gated
from tests.support.api import API
from tests.support.broker import broker_down
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _deliver(session: str, text: str, delivery_id: str):
    body = json.dumps({"session": session, "text": text}).encode()
    secret = settings.DURABLE_AGENTS["WEBHOOK_SECRET"]
    headers = {"X-Signature": sign(body, delivery_id, secret), "X-Delivery-Id": delivery_id}
    return Client(enforce_csrf_checks=True).post(
        "/webhooks/inbound/", body, content_type="application/json", headers=headers
    )


def test_the_webhook_answers_json_and_recovery_hands_the_turn_over(caplog):
    caplog.set_level(logging.WARNING, logger="durable_agents.dispatch")
    with broker_down():
        response = _deliver("bd-chat", "Where is order 7?", "bd-1")
        assert response.status_code == 202, response.content
        assert response["Content-Type"] == "application/json"
        body = response.json()
        assert body["status"] == "queued" and body["handover"] == "deferred"
        assert "beat recovery hands it over" in body["note"]
        # A redelivery while the broker is still down is the same accepted delivery.
        again = _deliver("bd-chat", "Where is order 7?", "bd-1")
        assert again.status_code == 202 and again.json()["run_id"] == body["run_id"]
    assert any(body["run_id"] in r.getMessage() for r in caplog.records)
    turn = Run.objects.get(pk=body["run_id"])
    assert turn.status == "queued"
    assert JournalEntry.objects.filter(run_id=turn.pk, name="run:start").exists()
    # The broker is back (inline dispatch in the tests' settings): recovery hands it over,
    # and the example's support agent drives it to its gated refund.
    assert body["run_id"] in recover(interval=0)
    assert Run.objects.get(pk=body["run_id"]).status == "awaiting_approval"
    assert JournalEntry.objects.filter(run_id=turn.pk, name="model:1").exists()


def test_the_api_and_agent_start_say_what_happened(caplog):
    caplog.set_level(logging.WARNING, logger="durable_agents.dispatch")
    caller = Client()
    caller.force_login(make_user("ops", "add_run", staff=True))
    with broker_down():
        started = caller.post(
            f"{API}/runs",
            json.dumps({"agent": "gated", "input": "refund order 7", "run_id": "bd-api"}),
            content_type="application/json",
        )
        assert started.status_code == 202, started.content
        assert gated.start("refund order 7", run_id="bd-py") == "bd-py"
    said = [r.getMessage() for r in caplog.records]
    for run_id in ("bd-api", "bd-py"):
        assert Run.objects.get(pk=run_id).status == "queued"
        assert any(f"run {run_id} is recorded" in m and "recovery" in m for m in said)
    handed = recover(interval=0)
    assert {"bd-api", "bd-py"} <= set(handed)
    for run_id in ("bd-api", "bd-py"):
        assert Run.objects.get(pk=run_id).status == "awaiting_approval"
        assert count_effects(run_id) == {}
