"""Retention (``manage.py durable_agents prune``, ``durable_agents.database.retention``): what goes,
what stays and why, the export and the tombstones it leaves, verify and the system check
over pruned runs, bad input, the setting, its beat entry and task."""

from __future__ import annotations

import base64
import hashlib
import json
from io import StringIO
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings

import durable_agents as da
from durable_agents import tasks
from durable_agents.celery.schedule import PRUNE_TASK, beat_schedule
from durable_agents.database.audit import verify
from durable_agents.database.store import site_store
from durable_agents.engine.errors import RunPruned
from durable_agents.engine.export import parse
from durable_agents.engine.registry import get_agent
from durable_agents.models import (
    ActionLog,
    ApprovalRequest,
    Decision,
    JournalEntry,
    Run,
    RunImport,
    Tombstone,
)
from durable_agents.transfer import export_lines, import_bytes
from tests.support.agents import count_effects, echo, gated
from tests.support.people import make_user
from tests.support.pruning import (
    PRUNER,
    age,
    assert_whole_or_tombstoned,
    cutoff,
    export_runs_in,
    old_trees,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _pruner(db):
    make_user(PRUNER, "delete_run")


def _prune(*args: str) -> str:
    out = StringIO()
    call_command("durable_agents", "prune", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _verify(*run_ids: str) -> list[dict]:
    out = StringIO()
    call_command("durable_agents", "verify", *run_ids, "--json", stdout=out)
    return json.loads(out.getvalue())


def _approved(run_id: str) -> None:
    gated.start("refund order 7", run_id=run_id)
    call_id = ApprovalRequest.objects.get(run_id=run_id).call_id
    da.approve(run_id, call_id, approved=True, by=make_user(f"ops-{run_id}", "approve_toolcall"))


def _site_key() -> tuple[str, str]:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return pem, base64.b64encode(public).decode()


def test_prune_exports_deletes_every_row_and_leaves_a_tombstone_verify_accepts(tmp_path):
    _approved("old-1")
    echo.start("hi", run_id="old-2")
    echo.start("hi", run_id="new-1")
    age(["old-1", "old-2"])
    records = {r: JournalEntry.objects.filter(run_id=r).count() for r in ("old-1", "old-2")}
    heads = {r: verify([r])[0].head for r in records}
    before = verify(None, actions=True)[-1]
    assert before.ok

    out = _prune("--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER)

    assert "pruned 2 run(s)" in out
    assert assert_whole_or_tombstoned(records, tmp_path) == {"old-1", "old-2"}
    assert not Decision.objects.exists() and not ApprovalRequest.objects.exists()
    assert Run.objects.filter(pk="new-1").exists()
    for rid, stone in ((s.run_id, s) for s in Tombstone.objects.all()):
        assert stone.head == heads[rid] and stone.pruned_by == PRUNER
        assert stone.status == "finished" and stone.signature is None
    # verify names a pruned run as verified by its tombstone; the action log still holds.
    reports = _verify("old-1", "new-1")
    assert reports[0]["ok"] and "pruned" in reports[0]["pruned"]
    assert reports[0]["head"] == heads["old-1"] and reports[1]["pruned"] is None
    every = verify(None, actions=True)
    assert all(r.ok for r in every) and {"old-1", "old-2", "new-1"} <= {r.chain for r in every}
    # One attributed action-log row for the batch, naming the cutoff, the runs, the file.
    [row] = ActionLog.objects.filter(action="prune")
    [stone] = Tombstone.objects.filter(run_id="old-1")
    assert row.actor == PRUNER and row.channel == "command"
    assert sorted(row.payload["runs"]) == ["old-1", "old-2"]
    assert row.payload["export"] == {"file": stone.export_file, "sha256": stone.export_sha256}
    assert row.payload["records"] == sum(records.values())
    # The file is what `export` writes: its heads are the tombstones'. It does not import
    # back here, inert or live: a pruned run's id is spent (another site may read it).
    data = (tmp_path / stone.export_file).read_bytes()
    assert hashlib.sha256(data).hexdigest() == stone.export_sha256
    exported = parse(data.decode().splitlines())
    assert {rid: run.head for rid, run in exported.runs.items()} == {
        rid: heads[rid] for rid in ("old-1", "old-2")
    }
    make_user("importer", "import_runs")
    for live in (False, True):
        with pytest.raises(RunPruned):
            import_bytes(data, by="importer", live=live)
    assert not RunImport.objects.exists() and not Run.objects.filter(pk="old-1").exists()


def test_a_pruned_run_id_is_spent_a_start_under_it_fires_nothing_again():
    """A client that retries with the run id it chose (an idempotency key: "refund-7") after
    the run was pruned must not refund again: the id is spent, every start refuses it."""
    _approved("refund-7")
    assert Run.objects.get(pk="refund-7").status == "finished"
    fired = count_effects("refund-7")
    assert sum(fired.values()) == 1
    age(["refund-7"])
    _prune("--finished-before", cutoff(), "--by", PRUNER)
    assert not Run.objects.filter(pk="refund-7").exists()

    with pytest.raises(RunPruned) as refused:
        gated.run("refund-7", "refund order 7")  # a redelivered request, run inline
    assert refused.value.code == "run.pruned" and refused.value.http_status == 409
    with pytest.raises(RunPruned):
        gated.start("refund order 7", run_id="refund-7")  # handed to a worker
    assert count_effects("refund-7") == fired
    assert not Run.objects.filter(pk="refund-7").exists()
    assert not JournalEntry.objects.filter(run_id="refund-7").exists()


def test_a_second_prune_finds_nothing_and_writes_nothing(tmp_path):
    echo.start("hi", run_id="again-1")
    age(["again-1"])
    _prune("--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER)
    files, actions = sorted(tmp_path.iterdir()), ActionLog.objects.count()
    assert "pruned 0 run(s)" in _prune(
        "--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER
    )
    assert sorted(tmp_path.iterdir()) == files and ActionLog.objects.count() == actions
    assert Tombstone.objects.count() == 1


def test_what_stays_and_why():
    trees = old_trees(1, "whole")  # a whole old tree goes
    get_agent("stree-root").start("go", run_id="young")  # root recent, sub-runs old: stays
    age(["young/call_1_1", "young/call_1_1/call_1_1"])
    gated.start("refund order 7", run_id="waiting")  # unfinished
    echo.start("hi", run_id="forked")  # old, but a kept run was forked from it
    da.fork("forked", 1, new_run_id="forked-copy")
    chat = echo.session("chat-old")  # a session's turns and journal stay
    chat.send("hi")
    echo.start("hi", run_id="evidence")  # an inert import stays
    exported = "\n".join(export_lines("evidence")) + "\n"
    Run.objects.filter(pk="evidence").delete()  # as if exported by another site
    make_user("importer", "import_runs")
    import_bytes(exported.encode(), by="importer")
    age([r.pk for r in Run.objects.exclude(pk__in=["young", "forked-copy"])])

    out = _prune("--finished-before", cutoff(), "--by", PRUNER, "--dry-run")
    assert "would prune 3 run(s)" in out
    assert not Tombstone.objects.exists()
    out = _prune("--finished-before", cutoff(), "--by", PRUNER)

    assert {t.run_id for t in Tombstone.objects.all()} == set(trees)
    assert "chat-old>turn/1: part of a session" in out
    assert "forked: a run outside its tree was forked from it" in out
    assert "evidence: imported" in out
    kept = {"young", "young/call_1_1", "young/call_1_1/call_1_1", "waiting", "forked"}
    assert kept | {"evidence", "forked-copy"} <= set(Run.objects.values_list("pk", flat=True))
    assert Run.objects.filter(session_id="chat-old").count() == 2  # the journal and the turn
    # A root that is unfinished or finished after the cutoff is no candidate at all: its
    # old sub-runs stay with it.
    assert "waiting" not in out and "young" not in out
    # Once the fork is gone, its source goes too.
    da.cancel("waiting", by=make_user("op", "cancel_run"))
    Run.objects.filter(pk="forked-copy").delete()
    age(["waiting"])
    _prune("--finished-before", cutoff(), "--by", PRUNER)
    assert {"forked", "waiting"} <= set(Tombstone.objects.values_list("run_id", flat=True))


def test_a_signed_tombstone_verifies_and_a_changed_one_is_caught_by_verify_and_the_check():
    pem, public = _site_key()
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": pem, "AUDIT_CHECK_SAMPLE": 5}
    with override_settings(DURABLE_AGENTS=config):
        echo.start("hi", run_id="signed-1")
        age(["signed-1"])
        _prune("--finished-before", cutoff(), "--by", PRUNER)
        [stone] = Tombstone.objects.all()
        assert stone.public_key == public and stone.signature
        [report] = verify(["signed-1"])
        assert report.ok and "signed tombstone" in report.pruned and "no export" in report.pruned
        assert not [m for m in run_checks(databases=["default"]) if m.id == "durable_agents.E004"]

        Tombstone.objects.filter(pk=stone.pk).update(records=stone.records - 1)
        [report] = verify(["signed-1"])
        assert not report.intact and report.broken_name == "tombstone"
        with pytest.raises(CommandError, match="1 of 1 chain"):
            call_command("durable_agents", "verify", "signed-1", stdout=StringIO())
        errors = [m for m in run_checks(databases=["default"]) if m.id == "durable_agents.E004"]
        assert len(errors) == 1 and "signed-1" in errors[0].msg
    # Signed under a key the site no longer trusts: unverified, not broken.
    Tombstone.objects.filter(pk=stone.pk).update(records=stone.records)
    [report] = verify(["signed-1"])
    assert report.intact and not report.ok and "does not trust" in report.unverified


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--finished-before", "2999-01-01"], "in the future"),
        (["--finished-before", "last tuesday"], "is not a date"),
        (["--finished-before", "2020-01-01", "--export", "/proc/nowhere"], "not a directory"),
        (["--finished-before", "2020-01-01", "--export", "/proc"], "not writable"),
        (["--finished-before", "2020-01-01", "--by", "nobody-here"], "names no user"),
        (["--finished-before", "2020-01-01", "--by", "clerk"], "needs the 'durable_agents"),
    ],
)
def test_bad_input_is_a_clear_error_and_deletes_nothing(args, said):
    make_user("clerk")
    echo.start("hi", run_id="safe-1")
    age(["safe-1"], days=10_000)
    if "--by" not in args:
        args = [*args, "--by", PRUNER]
    with pytest.raises(CommandError, match=said):
        _prune(*args)
    assert Run.objects.filter(pk="safe-1").exists() and not Tombstone.objects.exists()


def test_prune_without_by_is_refused():
    with pytest.raises(CommandError, match="--by"):
        _prune("--finished-before", "2020-01-01")


def test_the_setting_is_checked_and_builds_a_beat_entry_and_the_task_prunes(tmp_path):
    base = {"AGENTS": [], "DISPATCH": "inline"}
    good = {"FINISHED_FOR": 30, "BY": PRUNER, "EXPORT_DIR": str(tmp_path), "EVERY": 600}
    assert "durable-agents-prune" not in beat_schedule(base)
    entry = beat_schedule({**base, "RETENTION": good})["durable-agents-prune"]
    assert entry["task"] == PRUNE_TASK and entry["schedule"] == 600.0
    for bad, said in (
        ({"FINISHED_FOR": 30, "BY": PRUNER}, "needs 'EXPORT_DIR'"),
        ({**good, "FINISHED_FOR": -1}, "FINISHED_FOR'] must be a number of days"),
        ({**good, "EXPORT_DIR": "archive"}, "must be an absolute path"),
        ({**good, "BY": ""}, "must be the username"),
        ({**good, "KEEP": 1}, "unknown key"),
        ("30 days", "must be a dict"),
    ):
        with override_settings(DURABLE_AGENTS={**base, "RETENTION": bad}):
            errors = [m for m in run_checks() if m.id == "durable_agents.E001"]
        assert errors and said in errors[0].msg, (bad, errors)

    echo.start("hi", run_id="beat-1")
    age(["beat-1"], days=40)
    assert tasks.prune.apply().get() == 0  # off: RETENTION unset
    config = {**django_settings.DURABLE_AGENTS, "RETENTION": good}
    with override_settings(DURABLE_AGENTS=config):
        assert tasks.prune.apply().get() == 1
    [stone] = Tombstone.objects.all()
    assert stone.run_id == "beat-1" and export_runs_in(tmp_path / stone.export_file) == ["beat-1"]


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_prune_on_sqlite(tmp_path):
    config = {**django_settings.DURABLE_AGENTS, "DATABASE": "sqlite"}
    with override_settings(DURABLE_AGENTS=config):
        store = site_store()
        echo.start("hi", run_id="lite-1", store=store)
        echo.start("hi", run_id="lite-2", store=store)
        Run.objects.using("sqlite").filter(pk="lite-1").update(
            finished_at=Run.objects.using("sqlite").get(pk="lite-1").finished_at.replace(year=2020)
        )
        _prune("--finished-before", "2021-01-01", "--export", str(tmp_path), "--by", PRUNER)
        assert not Run.objects.using("sqlite").filter(pk="lite-1").exists()
        assert not JournalEntry.objects.using("sqlite").filter(run_id="lite-1").exists()
        assert Run.objects.using("sqlite").filter(pk="lite-2").exists()
        [report] = verify(["lite-1"])
        assert report.ok and report.pruned
        with pytest.raises(RunPruned):
            echo.run("lite-1", "hi", store=store)
        assert not Run.objects.using("sqlite").filter(pk="lite-1").exists()
        assert verify(None, actions=True)[-1].ok


def test_the_export_file_is_written_before_the_delete(tmp_path, monkeypatch):
    """The failpoint after the export sees the file complete and every row still there."""
    from durable_agents.engine import failpoints

    echo.start("hi", run_id="order-1")
    age(["order-1"])
    seen = {}
    real = failpoints.hit

    def hit(name: str) -> None:
        if name == "prune-after-export":
            [path] = list(Path(tmp_path).iterdir())
            seen["runs"] = export_runs_in(path)
            seen["end"] = json.loads(path.read_text().splitlines()[-1])["type"]
            seen["row"] = Run.objects.filter(pk="order-1").exists()
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    _prune("--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER)
    assert seen == {"runs": ["order-1"], "end": "end", "row": True}


def test_a_run_changed_after_its_export_is_kept_and_exported_again_next_time(tmp_path, monkeypatch):
    """A record written (a late journal write) or a row touched (a resume, a decision)
    between the export and the delete: the export no longer holds all of it, so it stays."""
    from django.db.models.functions import Now

    from durable_agents.engine import failpoints
    from durable_agents.engine.journal import Journal

    echo.start("hi", run_id="moved-1")
    echo.start("hi", run_id="moved-2")
    age(["moved-1", "moved-2"])
    real = failpoints.hit

    def hit(name: str) -> None:
        if name == "prune-after-export":
            Journal(site_store()).write("moved-1", "note:late", {"kind": "note", "said": "late"})
            Run.objects.filter(pk="moved-2").update(updated_at=Now())
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    out = _prune("--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER)
    assert "moved-1: changed since it was exported" in out
    assert "moved-2: changed since it was exported" in out
    assert Run.objects.filter(pk__in=["moved-1", "moved-2"]).count() == 2
    assert not Tombstone.objects.exists() and not ActionLog.objects.filter(action="prune")

    monkeypatch.setattr(failpoints, "hit", real)
    _prune("--finished-before", cutoff(), "--export", str(tmp_path), "--by", PRUNER)
    [stone] = Tombstone.objects.filter(run_id="moved-1")
    assert export_runs_in(tmp_path / stone.export_file) == ["moved-1", "moved-2"]
    assert (
        verify(["moved-1"])[0].head == stone.head and stone.records == verify(["moved-1"])[0].links
    )


def test_a_run_someone_holds_is_skipped_not_waited_on(tmp_path):
    import threading

    from django.db import connections, transaction

    echo.start("hi", run_id="held-1")
    echo.start("hi", run_id="free-1")
    age(["held-1", "free-1"])
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk="held-1")
                locked.set()
                release.wait(timeout=60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        out = _prune("--finished-before", cutoff(), "--by", PRUNER)
    finally:
        release.set()
        holder.join(timeout=30)
    assert "held-1: busy" in out
    assert set(Tombstone.objects.values_list("run_id", flat=True)) == {"free-1"}
    assert Run.objects.filter(pk="held-1").exists()
