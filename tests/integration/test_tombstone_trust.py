"""What vouches for a tombstone (docs/retention.md, "Verify"): with a signing key set, only
its signature; always, the action-log row of the prune that wrote it. A tombstone stripped of
its signature, one no prune wrote, one changed since, and a prune row whose tombstone was
deleted are all reported, and ``verify`` exits 1."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings
from django.utils import timezone

from durable_agents.database.audit import verify
from durable_agents.database.store import DjangoStore, site_store
from durable_agents.engine import identity
from durable_agents.models import ActionLog, Run, Tombstone
from durable_agents.people import actor_for
from tests.support.agents import echo
from tests.support.people import make_user
from tests.support.pruning import PRUNER, age, cutoff

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

FORGED_HEAD = "f" * 64


@pytest.fixture(autouse=True)
def _pruner(db):
    make_user(PRUNER, "delete_run")


def _pruned(*run_ids: str, export_dir=None) -> None:
    for run_id in run_ids:
        echo.start("hi", run_id=run_id)
    age(list(run_ids))
    args = ["--finished-before", cutoff(), "--by", PRUNER]
    if export_dir is not None:
        args += ["--export", str(export_dir)]
    call_command("durable_agents", "prune", *args, stdout=StringIO(), stderr=StringIO())


def _signing() -> dict:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    return {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": pem, "AUDIT_CHECK_SAMPLE": 5}


def _cli_verify(*args: str) -> tuple[list[dict], str]:
    """``verify --json`` (its reports) and the refusal it exits 1 with ("" for exit 0)."""
    out = StringIO()
    try:
        call_command("durable_agents", "verify", *args, "--json", stdout=out)
    except CommandError as exc:
        assert exc.returncode == 1
        return json.loads(out.getvalue()), str(exc)
    return json.loads(out.getvalue()), ""


def _e004() -> list[str]:
    return [m.msg for m in run_checks(databases=["default"]) if m.id == "durable_agents.E004"]


def test_with_a_signing_key_a_tombstone_stripped_of_its_signature_is_unverified():
    with override_settings(DURABLE_AGENTS=_signing()):
        _pruned("strip-1", "strip-2")
        assert all(r.ok for r in verify(["strip-1", "strip-2"]))
        # The forgery: no signature, no key, another head. Its prune row still
        # names the real head, so it is broken; stripped alone, it is unverified.
        Tombstone.objects.filter(run_id="strip-1").update(
            signature=None, public_key=None, head=FORGED_HEAD
        )
        Tombstone.objects.filter(run_id="strip-2").update(signature=None, public_key=None)
        forged, stripped = verify(["strip-1", "strip-2"])
        assert not forged.intact and forged.broken_name == "tombstone"
        assert "head" in forged.reason
        assert stripped.intact and not stripped.ok
        assert "AUDIT_SIGNING_KEY" in stripped.unverified
        reports, refusal = _cli_verify("strip-2")
        assert reports[0]["ok"] is False and "unsigned" in reports[0]["unverified"]
        assert "1 of 1 chain(s) unverified" in refusal


def test_a_tombstone_pruned_before_the_key_was_set_is_unverified_once_it_is():
    _pruned("before-key")
    [report] = verify(["before-key"])
    assert report.ok and "unsigned tombstone" in report.pruned
    with override_settings(DURABLE_AGENTS=_signing()):
        [report] = verify(["before-key"])
    assert report.intact and not report.ok and "unsigned" in report.unverified


def test_a_tombstone_for_a_run_that_never_existed_is_broken():
    _pruned("real-1")
    Tombstone.objects.create(
        run_id="never-was",
        status="finished",
        head=FORGED_HEAD,
        records=3,
        pruned_at=timezone.now() - timedelta(days=1),
        pruned_by=PRUNER,
    )
    [report] = verify(["never-was"])
    assert not report.intact and report.broken_name == "tombstone"
    assert "no prune row" in report.reason
    every = {r.chain: r for r in verify(None, actions=True)}
    assert every["real-1"].ok and not every["never-was"].intact and every["action log"].ok
    reports, refusal = _cli_verify("--all")
    assert [r["chain"] for r in reports if not r["ok"]] == ["never-was"]
    assert "1 of" in refusal and "broken" in refusal
    with override_settings(
        DURABLE_AGENTS={**django_settings.DURABLE_AGENTS, "AUDIT_CHECK_SAMPLE": 5}
    ):
        assert [m for m in _e004() if "never-was" in m]


def test_without_a_key_a_changed_tombstone_is_caught_by_its_prune_row(tmp_path):
    _pruned("changed-1", "changed-2", "changed-3", export_dir=tmp_path)
    assert all(r.ok for r in verify(["changed-1", "changed-2", "changed-3"]))
    Tombstone.objects.filter(run_id="changed-1").update(head=FORGED_HEAD)
    Tombstone.objects.filter(run_id="changed-2").update(export_sha256="0" * 64)
    Tombstone.objects.filter(run_id="changed-3").update(pruned_by="someone-else")
    reports = verify(["changed-1", "changed-2", "changed-3"])
    assert [r.broken_name for r in reports] == ["tombstone"] * 3
    [row] = ActionLog.objects.filter(action="prune")
    assert all(f"prune row {row.pk}" in r.reason for r in reports), [r.reason for r in reports]
    assert "head" in reports[0].reason and "export" in reports[1].reason
    assert "pruned_by" in reports[2].reason


def test_a_prune_row_whose_tombstone_was_deleted_is_reported():
    _pruned("deleted-1", "kept-1")
    [row] = ActionLog.objects.filter(action="prune")
    Tombstone.objects.filter(run_id="deleted-1").delete()
    # Named alone, it is not "no run": the action log says it was pruned.
    [report] = verify(["deleted-1"])
    assert not report.intact and report.broken_name == "tombstone"
    assert report.broken_at == row.pk and "deleted" in report.reason
    every = {r.chain: r for r in verify(None, actions=True)}
    assert every["kept-1"].ok and not every["deleted-1"].intact and every["action log"].ok
    _, refusal = _cli_verify("--all")
    assert "broken" in refusal


def test_a_prune_row_names_each_tombstone_it_wrote():
    _pruned("named-1")
    [row] = ActionLog.objects.filter(action="prune")
    [stone] = Tombstone.objects.all()
    assert row.payload["pruned_at"] == stone.pruned_at.isoformat()
    assert row.payload["tombstones"] == {
        "named-1": {"head": stone.head, "records": stone.records, "unchained": stone.unchained}
    }
    [report] = verify(["named-1"])
    assert report.ok and f"prune row {row.pk}" in report.pruned


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_the_cross_check_on_sqlite_with_a_numeric_run_id():
    config = {**django_settings.DURABLE_AGENTS, "DATABASE": "sqlite"}
    with override_settings(DURABLE_AGENTS=config):
        store = site_store()
        for run_id in ("7001", "7002"):
            echo.start("hi", run_id=run_id, store=store)
        old = timezone.now() - timedelta(days=30)
        Run.objects.using("sqlite").filter(pk__in=["7001", "7002"]).update(finished_at=old)
        call_command(
            "durable_agents", "prune", "--finished-before", cutoff(), "--by", PRUNER,
            stdout=StringIO(), stderr=StringIO(),
        )  # fmt: skip
        assert all(r.ok for r in verify(["7001", "7002"]))
        Tombstone.objects.using("sqlite").filter(run_id="7001").delete()
        Tombstone.objects.using("sqlite").filter(run_id="7002").update(records=1)
        gone, changed = verify(["7001", "7002"])
        assert not gone.intact and "deleted" in gone.reason
        assert not changed.intact and "records" in changed.reason
        assert {r.chain for r in verify(None) if not r.intact} == {"7001", "7002"}


def test_an_id_pruned_twice_needs_both_tombstones():
    """The window docs/retention.md admits (a start racing the prune of its id) can prune
    one id twice: two prune rows, two tombstones. Each row needs its own."""
    _pruned("twice-1")
    [first] = Tombstone.objects.all()
    later = first.pruned_at + timedelta(days=1)
    second = Tombstone.objects.create(
        run_id="twice-1", status="finished", head=FORGED_HEAD, records=4, pruned_at=later,
        pruned_by=PRUNER, pruned_by_id=first.pruned_by_id,
    )  # fmt: skip
    DjangoStore().log_action(
        identity.logged(
            actor_for(PRUNER, identity.PYTHON),
            "prune",
            "",
            "",
            {
                "runs": ["twice-1"],
                "pruned_at": later.isoformat(),
                "tombstones": {"twice-1": {"head": FORGED_HEAD, "records": 4, "unchained": 0}},
                "export": None,
            },
        )
    )
    assert all(r.ok for r in verify(None, actions=True))
    second.delete()
    [report] = [r for r in verify(None) if not r.intact]
    assert report.chain == "twice-1" and "deleted" in report.reason
    assert report.broken_at == ActionLog.objects.filter(action="prune").latest("id").pk
