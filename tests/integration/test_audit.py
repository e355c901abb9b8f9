"""The audit chains on the site's database: ``manage.py durable_agents verify`` (exit status,
the first broken record of each run, the action log) and the opt-in system check."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.records import encode
from durable_agents.models import ApprovalRequest, JournalEntry, Run
from tests.support import tamper
from tests.support.agents import gated
from tests.support.people import make_user
from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _approved_run(run_id: str) -> None:
    gated.start("refund order 7", run_id=run_id)
    call_id = ApprovalRequest.objects.get(run_id=run_id).call_id
    da.approve(run_id, call_id, approved=True, by=make_user(f"ops-{run_id}", "approve_toolcall"))
    assert Run.objects.get(run_id=run_id).status == "finished"


def _verify(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("durable_agents", "verify", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_verify_passes_real_runs_and_the_action_log():
    _approved_run("au-1")
    _approved_run("au-2")
    assert JournalEntry.objects.filter(hash__isnull=True).count() == 0
    code, out = _verify("--all", "--json")
    reports = json.loads(out)
    assert code == 0 and [r["chain"] for r in reports] == ["au-1", "au-2", "action log"]
    assert all(r["ok"] for r in reports) and reports[-1]["records"] >= 2
    last = JournalEntry.objects.filter(run_id="au-1").order_by("-seq").first()
    assert reports[0]["head"] == last.hash


def test_verify_reports_the_first_broken_record_and_exits_non_zero():
    _approved_run("au-3")
    _approved_run("au-4")
    names = [e.name for e in JournalEntry.objects.filter(run_id="au-3").order_by("seq")]
    tamper.edit_record(site_store(), "au-3", names[3], encode({"kind": "value", "forged": True}))
    code, out = _verify("au-3", "au-4")
    assert code == 1
    assert f"au-3: broken at {names[3]!r}" in out
    assert "au-4: ok" in out and "1 of 2 chain(s) broken" in out


def test_verify_all_reports_an_edited_action_row():
    _approved_run("au-5")
    position = tamper.edit_action(site_store(), 0, {"note": "never said"})
    code, out = _verify("--all")
    assert code == 1 and f"action log: broken at 'action' ({position})" in out


def test_verify_refuses_an_unknown_run_and_no_arguments():
    with pytest.raises(CommandError, match=r"run\.not_found"):
        call_command("durable_agents", "verify", "au-none", stdout=StringIO())
    with pytest.raises(CommandError, match="--all"):
        call_command("durable_agents", "verify", stdout=StringIO())


def test_the_command_exits_non_zero_in_a_process():
    _approved_run("au-6")
    tamper.delete_record(site_store(), "au-6", "run:start")
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "django", "durable_agents", "verify", "au-6", "--settings", "tests.settings"),
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "au-6: broken at" in done.stdout and "deleted" in done.stdout


def test_the_system_check_verifies_a_sample_when_asked():
    _approved_run("au-7")

    def ours(sample: int) -> list:
        config = {**django_settings.DURABLE_AGENTS, "AUDIT_CHECK_SAMPLE": sample}
        with override_settings(DURABLE_AGENTS=config):
            found = run_checks(databases=["default"], include_deployment_checks=False)
        return [m for m in found if m.id == "durable_agents.E004"]

    assert ours(5) == []
    tamper.edit_record(site_store(), "au-7", "@journal", encode({"kind": "header"}))
    assert ours(0) == []  # off unless asked
    [error] = ours(5)
    assert "au-7" in error.msg and "verify --all" in error.hint


def test_bad_audit_settings_are_errors():
    from durable_agents.conf import parse

    base = dict(django_settings.DURABLE_AGENTS)
    _, problems = parse({**base, "AUDIT_CHECK_SAMPLE": -1, "AUDIT_SIGNING_KEY": "secret"})
    assert any("AUDIT_CHECK_SAMPLE" in p for p in problems)
    assert any("AUDIT_SIGNING_KEY" in p and "Ed25519" in p for p in problems)
