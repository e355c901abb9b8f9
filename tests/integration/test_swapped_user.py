"""durable_agents on a site whose user model is not ``auth.User``
(``AUTH_USER_MODEL = "swapped_user.Person"``): its migrations apply, none is missing, and
keys, actors, approver groups and a decision all go through the swapped model.

A subprocess, because the user model is fixed when Django starts."""

from __future__ import annotations

import subprocess
import sys

from tests.support.procs import ROOT, subprocess_env

SCRIPT = r"""
import base64

import django

django.setup()

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command

call_command("migrate", verbosity=0)
call_command("makemigrations", "durable_agents", check=True, dry_run=True)

import durable_agents as da
from durable_agents.api.auth import issue_api_key, new_key
from durable_agents.people_keys import register_approver_key
from durable_agents.models import ActionLog, ApiKey, ApprovalRequest, ApproverKey, Run
from durable_agents.people import eligible_approvers, resolve_actor
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

Person = get_user_model()
assert Person._meta.label == "swapped_user.Person", Person._meta.label
ann = Person.objects.create_user("ann", is_staff=True)
finance = Group.objects.create(name="finance")
finance.permissions.add(
    Permission.objects.get(codename="approve_toolcall", content_type__app_label="durable_agents")
)
ann.groups.add(finance)

raw, prefix, key_hash = new_key()
ApiKey.objects.create(user=ann, name="ci", prefix=prefix, key_hash=key_hash, created_by=ann)
ApproverKey.objects.create(user=ann, public_key=base64.b64encode(bytes(32)).decode())
assert list(ann.durable_agents_api_keys.values_list("name", flat=True)) == ["ci"]
# The key rules and their action-log rows with a swapped user model: her own keys take
# effect at once; a superuser's key for her waits for her.
boss = Person.objects.create_superuser("boss")
issue_api_key(ann, "mine")
invited = register_approver_key(ann, base64.b64encode(bytes(range(32))).decode(), by=boss)
assert invited.confirmed_at is None and invited.created_by == boss
made = ActionLog.objects.filter(action="create_key").order_by("id")
assert [(r.actor, r.payload["owner"]) for r in made] == [("ann", "ann"), ("boss", "ann")]

actor = resolve_actor("ann")
assert actor is not None and actor.id == str(ann.pk), actor
assert "durable_agents.approve_toolcall" in actor.permissions, actor.permissions
assert eligible_approvers("finance") == ["ann"]


@da.tool(requires_approval=True)
def refund(order_id: str) -> dict:
    '''Refund an order.'''
    return {"refunded": order_id}


agent = da.Agent(
    "swapped-gated",
    ScriptedModel(
        [scripted.calls(scripted.call("refund", {"order_id": "7"})), scripted.text("done")]
    ),
    "Refund.",
    [refund],
)
try:
    agent.run("swapped-1", "refund order 7")
except da.ApprovalPending:
    pass
else:
    raise AssertionError("the refund should wait for a decision")
call_id = ApprovalRequest.objects.get(run_id="swapped-1").call_id
da.approve("swapped-1", call_id, approved=True, by="ann")
da.resume("swapped-1")
assert Run.objects.get(run_id="swapped-1").status == "finished"
row = ActionLog.objects.get(run_id="swapped-1", action="approve")
assert (row.actor, row.actor_id) == ("ann", str(ann.pk)), (row.actor, row.actor_id)
print("swapped user: ok")
"""


def test_a_swapped_user_model_migrates_and_decides(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=subprocess_env(
            DJANGO_SETTINGS_MODULE="tests.support.swapped_user.settings",
            DA_SWAPPED_DB=str(tmp_path / "swapped.sqlite3"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "swapped user: ok" in done.stdout
