"""``manage.py durable_agents``: what waits and on which call, and acting on it as a named user
with the permission the admin would ask for."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError

import durable_agents as da
from durable_agents.models import ActionLog, ApprovalRequest, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import count_effects, gated, halting, inbox, waiting
from tests.support.api import error, with_key
from tests.support.people import make_user
from tests.support.procs import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def _user(name: str, *perms: str, active: bool = True, is_superuser: bool = False):
    user = get_user_model().objects.create_user(
        name, is_staff=True, is_active=active, is_superuser=is_superuser
    )
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="durable_agents")
        )
    return user


def _waiting(run_id: str) -> str:
    gated.start("refund order 7", run_id=run_id)
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    return ApprovalRequest.objects.get(run_id=run_id).call_id


def _runs_json(*args: str) -> list[dict]:
    out = StringIO()
    call_command("durable_agents", "runs", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_runs_names_the_call_each_run_waits_on():
    call_id = _waiting("cmd-wait")
    [row] = [r for r in _runs_json() if r["run_id"] == "cmd-wait"]
    assert row["status"] == "awaiting_approval"
    assert row["waits"] == [
        {
            "kind": "approval",
            "call_id": call_id,
            "tool": "refund",
            "arguments": {"order_id": "7", "cents": 500},
        }
    ]
    out = StringIO()
    call_command("durable_agents", "runs", stdout=out)
    text = out.getvalue()
    assert f"python manage.py durable_agents approve cmd-wait {call_id} --by " in text
    assert f"python manage.py durable_agents deny cmd-wait {call_id} --by " in text
    assert _runs_json("--status", "halted") == []
    assert [r["run_id"] for r in _runs_json("--status", "awaiting_approval")] == ["cmd-wait"]


@da.tool(idempotent=True)
def _await_payment(ctx: da.ToolContext) -> str:
    """Wait for the payment callback."""
    return str(ctx.await_signal("paid", timeout=3600))


@da.tool(idempotent=True)
def _nap(ctx: da.ToolContext) -> str:
    """Sleep an hour."""
    return ctx.sleep("cool-off", 3600).isoformat()


def _one_call(name: str, tool) -> da.Agent:
    script = [scripted.calls(scripted.call(tool.name, {})), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [tool])


def test_runs_prints_the_right_hint_for_each_kind_of_wait():
    with pytest.raises(da.InterruptPending):
        waiting.run("cmd-ask", "ship o-7")
    with pytest.raises(da.SignalPending):
        _one_call("cmd-pay", _await_payment).run("cmd-pay", "go")
    with pytest.raises(da.TimerPending):
        _one_call("cmd-nap", _nap).run("cmd-nap", "go")
    with pytest.raises(da.Pause):
        inbox.run("cmd-read", "read")
    halted = "cmd-halt"
    with pytest.raises(da.OutcomeUnknown):
        halting.run(halted, "charge")
    _user("ops", is_superuser=True)
    out = StringIO()
    call_command("durable_agents", "runs", "--by", "ops", stdout=out)
    text = out.getvalue()
    cli = "python manage.py durable_agents"
    assert f"{cli} answer cmd-ask warehouse --value '<json>' --by ops" in text
    assert f"{cli} signal cmd-pay paid --payload '<json>' --by ops" in text
    assert "awaits a signal; times out at" in text
    assert f"{cli} wake cmd-nap cool-off --by ops" in text
    assert f"{cli} send cmd-read box '<key>' --payload '<json>' --by ops" in text
    assert f"{cli} resolve {halted} " in text
    # A wait is never offered the halt's command, nor a halt a wait's.
    commands = [line.strip() for line in text.splitlines() if cli in line]
    resolves = [c for c in commands if f"{cli} resolve " in c]
    assert len(resolves) == 1 and f"resolve {halted} " in resolves[0], commands


def test_approve_acts_as_an_active_user_with_the_permission():
    call_id = _waiting("cmd-approve")
    _user("viewer", "view_run")
    _user("gone", "approve_toolcall", active=False)
    for who, code in (
        ("nobody", r"actor\.unknown"),
        ("gone", r"actor\.inactive"),
        ("viewer", r"approval\.not_eligible"),
    ):
        with pytest.raises(CommandError, match=code):
            call_command("durable_agents", "approve", "cmd-approve", call_id, "--by", who)
    assert Run.objects.get(run_id="cmd-approve").status == "awaiting_approval"
    assert not ActionLog.objects.filter(run_id="cmd-approve").exists()

    _user("ops", "approve_toolcall")
    out = StringIO()
    call_command(
        "durable_agents",
        "approve",
        "cmd-approve",
        call_id,
        "--by",
        "ops",
        "--note",
        "ok",
        stdout=out,
    )
    assert "approved" in out.getvalue()
    assert Run.objects.get(run_id="cmd-approve").status == "finished"
    assert count_effects("cmd-approve") == {call_id: 1}
    entry = ActionLog.objects.get(run_id="cmd-approve", action="approve")
    assert (entry.actor, entry.channel) == ("ops", "command")


def test_deny_reaches_the_model_and_fires_nothing():
    call_id = _waiting("cmd-deny")
    _user("ops", "approve_toolcall")
    call_command(
        "durable_agents", "deny", "cmd-deny", call_id, "--by", "ops", "--note", "wrong order"
    )
    assert Run.objects.get(run_id="cmd-deny").status == "finished"
    assert count_effects("cmd-deny") == {}


def test_approve_with_edits_runs_the_edit():
    call_id = _waiting("cmd-edit")
    _user("ops", "approve_toolcall")
    decide = ("durable_agents", "approve", "cmd-edit", call_id, "--by", "ops", "--edit")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command(*decide, "{oops")
    with pytest.raises(CommandError, match=r"approval\.edit_invalid"):
        call_command(*decide, '{"order_id": "7", "cents": "lots"}')
    assert not ActionLog.objects.filter(run_id="cmd-edit").exists()
    call_command(*decide, '{"order_id": "7", "cents": 300}', stdout=StringIO())
    assert Run.objects.get(run_id="cmd-edit").status == "finished"
    assert count_effects("cmd-edit") == {call_id: 1}
    entry = ActionLog.objects.get(run_id="cmd-edit", action="approve")
    assert entry.payload["edited"] == {"order_id": "7", "cents": 300}


def test_cancel_needs_the_operate_permission():
    _waiting("cmd-cancel")
    _user("approver", "approve_toolcall")
    with pytest.raises(CommandError, match=r"actor\.forbidden.*cancel_run"):
        call_command("durable_agents", "cancel", "cmd-cancel", "--by", "approver")
    _user("ops", "cancel_run")
    call_command("durable_agents", "cancel", "cmd-cancel", "--by", "ops", "--reason", "dup")
    assert Run.objects.get(run_id="cmd-cancel").status == "cancelled"
    entry = ActionLog.objects.get(run_id="cmd-cancel", action="cancel")
    assert (entry.actor, entry.channel) == ("ops", "command")


def test_an_engine_refusal_exits_with_its_code():
    _user("ops", "approve_toolcall")
    with pytest.raises(CommandError, match=r"approval\.not_found"):
        call_command("durable_agents", "approve", "no-such-run", "c1", "--by", "ops")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_global_options_go_anywhere_on_the_line():
    """``--settings`` and ``-v`` after the subcommand, as people type them."""
    _waiting("cmd-anywhere")
    env = subprocess_env()
    env.pop("DJANGO_SETTINGS_MODULE")
    out = subprocess.run(
        [
            *(sys.executable, "-m", "django", "durable_agents", "runs", "--json"),
            *("--settings", "tests.settings", "-v", "2", "--status", "awaiting_approval"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == ["cmd-anywhere"]


def test_the_command_acts_only_as_active_staff_as_the_api_does():
    """One rule for who acts through the admin, the API and the command: an active staff
    user. A non-staff user holding the permission is refused by both, with one code."""
    call_id = _waiting("cmd-staff")
    outsider = make_user("outsider", "approve_toolcall", "view_run", staff=False)
    error(
        with_key(outsider).post(f"/runs/cmd-staff/approvals/{call_id}", {"approved": True}),
        403,
        "auth.not_staff",
    )
    for argv in (
        ("approve", "cmd-staff", call_id),
        ("deny", "cmd-staff", call_id, "--note", "no"),
        ("cancel", "cmd-staff"),
        ("runs",),
    ):
        with pytest.raises(CommandError, match=r"auth\.not_staff: 'outsider' is not a staff"):
            call_command("durable_agents", *argv, "--by", "outsider", stdout=StringIO())
    assert Run.objects.get(run_id="cmd-staff").status == "awaiting_approval"
    assert not ActionLog.objects.filter(run_id="cmd-staff").exists()
    assert count_effects("cmd-staff") == {}
