"""Issue 10 on every path a person takes (Python, the admin, the API, the management command)
on PostgreSQL: ``HALT_MIN_AGE`` is applied on each, and names when the halt can be resolved;
a cancelled run's halt is refused as orphaned; an approval asked again for other arguments
shows both."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

import durable_agents as da
from durable_agents.api.auth import issue_api_key
from durable_agents.conf import parse
from durable_agents.models import ApprovalRequest, Halt, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import halting

pytestmark = pytest.mark.django_db(transaction=True)


def _halted(run_id: str) -> Halt:
    halting.start("charge it", run_id=run_id)
    assert Run.objects.get(run_id=run_id).status == "halted"
    return Halt.objects.get(run_id=run_id)


def _api_post(user: User, path: str, body: dict):
    _, raw = issue_api_key(user, "ops")
    return Client().post(
        "/api/agents" + path,
        json.dumps(body),
        content_type="application/json",
        headers={"X-API-Key": raw},
    )


def _api_get(user: User, path: str):
    _, raw = issue_api_key(user, "ops")
    return Client().get("/api/agents" + path, headers={"X-API-Key": raw})


def _min_age(seconds: float | None):
    return override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "HALT_MIN_AGE": seconds})


def test_the_default_is_twice_the_lease_and_bad_values_are_refused():
    assert parse({})[0].effective_halt_min_age == 60
    assert parse({"LEASE_TTL": 5})[0].effective_halt_min_age == 10
    assert parse({"HALT_MIN_AGE": 0})[0].effective_halt_min_age == 0
    for bad in (-1, "60", True):
        assert "HALT_MIN_AGE" in " ".join(parse({"HALT_MIN_AGE": bad})[1])
    with _min_age(None):
        from durable_agents.engine import runtime

        assert runtime.halt_min_age() == 2 * float(settings.DURABLE_AGENTS["LEASE_TTL"])


def test_every_path_refuses_a_halt_younger_than_halt_min_age():
    halt = _halted("young-1")
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    with _min_age(3600):
        with pytest.raises(da.HaltTooYoung) as info:
            da.resolve_halt("young-1", "call_1_1", {"charged": True}, by="root")
        when = info.value.details["resolvable_at"]
        assert when in str(info.value)

        client = Client()
        client.force_login(root)
        url = reverse("admin:durable_agents_halt_resolve", args=[halt.pk])
        page = client.post(url, {"result": '{"charged": true}', "min_age": "0"})
        assert page.status_code == 200 and "halt.too_young" in page.content.decode()
        assert when in page.content.decode()

        response = _api_post(
            root, "/runs/young-1/halts/call_1_1/resolve", {"result": True, "min_age": 0}
        )
        assert response.status_code == 409 and response.json()["code"] == "halt.too_young"

        with pytest.raises(CommandError, match=r"halt\.too_young"):
            call_command(
                "durable_agents", "resolve", "young-1", "call_1_1", "--result", "1", "--by", "root"
            )
    assert Halt.objects.get(pk=halt.pk).status == "open"
    assert Run.objects.get(run_id="young-1").status == "halted"
    with _min_age(0):
        out = StringIO()
        call_command(
            "durable_agents",
            "resolve",
            "young-1",
            "call_1_1",
            "--result",
            "1",
            "--by",
            "root",
            stdout=out,
        )
    assert Halt.objects.get(pk=halt.pk).status == "resolved"


def test_a_cancelled_runs_halt_is_orphaned_on_every_path():
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    halt = _halted("gone-1")
    da.cancel("gone-1", by="root")
    assert Halt.objects.get(pk=halt.pk).status == "orphaned"
    response = _api_post(root, "/runs/gone-1/halts/call_1_1/resolve", {"result": True})
    assert response.status_code == 409 and response.json()["code"] == "halt.orphaned"
    orphaned = _api_get(root, "/halts?status=orphaned").json()
    assert [h["run_id"] for h in orphaned["items"]] == ["gone-1"]
    assert Run.objects.get(run_id="gone-1").status == "cancelled"


def test_an_approval_asked_again_shows_both_arguments():
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    paid = []

    @da.tool(requires_approval=True)
    def pay(cents: int) -> str:
        paid.append(cents)
        return "paid"

    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
    da.Agent("rules-args", ScriptedModel(script), "", [pay]).start("pay", run_id="args-1")

    @da.tool(requires_approval=True)
    def pay(cents: int, memo: str = "") -> str:  # the next deploy's tool
        paid.append((cents, memo))
        return "paid"

    da.Agent("rules-args", ScriptedModel(script), "", [pay])
    da.approve("args-1", "call_1_1", True, by="root")
    assert paid == [] and Run.objects.get(run_id="args-1").status == "awaiting_approval"
    request = ApprovalRequest.objects.get(run_id="args-1")
    assert request.previous_arguments == {"cents": 5}
    client = Client()
    client.force_login(root)
    page = client.get(reverse("admin:durable_agents_approvalrequest_change", args=[request.pk]))
    text = page.content.decode()
    assert "Arguments approved before" in text and "&quot;memo&quot;: &quot;&quot;" in text
    listed = _api_get(root, "/approvals").json()
    assert listed["items"][0]["previous_arguments"] == {"cents": 5}
    da.approve("args-1", "call_1_1", True, by="root")
    assert paid == [(5, "")] and Run.objects.get(run_id="args-1").status == "finished"
