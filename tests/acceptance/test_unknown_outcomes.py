"""Issue 10, the crash holes: a child process is killed (SIGKILL) or stopped (SIGSTOP) at a
named point and a new process carries on, with another deploy where the hole needs one.
Side effects are counted outside the journal (``test_effects``).

1. a live attempt with no result halts before the schema, the tool's presence or drift
   is looked at — and stays halted whatever is deployed next;
2. a fork of a run whose side effect's outcome is unknown halts on it too;
3. a driver stalled inside a side effect past its lease: the halt cannot be resolved
   before ``HALT_MIN_AGE``, the resolution takes the call's next attempt, and what the
   stalled driver saw is kept as evidence and shown on the admin's halt page;
4. a crash while a session's own journal row is created never makes it a run to drive;
7. a crash between a journal record and its run-row update (SQLite, and PostgreSQL without
   prepared statements) leaves nothing out of step;
13. ``Journal.step`` runs its function at most once across a crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

import durable_agents as da
from durable_agents.celery.recovery import recover
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.models import Halt, Run
from tests.support.agents import count_effects, effects_connection
from tests.support.procs import ROOT, run_json, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]


def drive(run_id: str, agent: str = "hole-charge", **env: str) -> tuple[int, dict | None]:
    return run_json("tests.support.drive", agent, run_id, "go", **env)


def names(run_id: str, using: str = "default") -> list[str]:
    return [r.name for r in Journal(DjangoStore(using=using)).records(run_id)]


# -- 1. a live attempt halts before anything else is looked at ------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "deploys",
    [
        [{"DA_DEPLOY": "v2"}],
        [{"DA_DEPLOY": "removed"}],
        [{}, {"DA_DEPLOY": "v2", "DA_ON_DRIFT": "error"}, {"DA_DEPLOY": "removed"}],
    ],
    ids=["new-required-parameter", "tool-removed", "halted-then-drift-error-then-removed"],
)
def test_a_live_attempt_halts_whatever_was_deployed(deploys):
    run_id = f"hole1-{len(deploys)}-{'-'.join(d.get('DA_DEPLOY', 'v1') for d in deploys)}"
    code, _ = drive(run_id, DA_CRASH_INSIDE="call_1_1")
    assert code == -9
    assert count_effects(run_id) == {"call_1_1": 1}
    for env in deploys:
        _, out = drive(run_id, **env)
        assert out == {"status": "halted", "halts": ["call_1_1"]}, (env, out)
        row = Run.objects.get(run_id=run_id)
        assert (row.status, row.last_error) == ("halted", None), env
    assert "tool:call_1_1" not in names(run_id), "no invented result (invalid arguments)"
    assert count_effects(run_id) == {"call_1_1": 1}
    [halt] = DjangoStore().list_halts(run_id=run_id)
    assert (halt.op_id, halt.tool_name, halt.arguments) == ("call_1_1", "charge", {"order": "7"})


# -- 2. a fork carries the unknown outcome ---------------------------------------------


@pytest.mark.timeout(120)
def test_a_fork_of_a_run_with_an_unknown_outcome_halts_too():
    run_id = "hole2-src"
    assert drive(run_id, DA_CRASH_INSIDE="call_1_1")[0] == -9
    fork_id = da.fork(run_id, 1)
    assert Run.objects.get(run_id=fork_id).status == "halted"
    _, out = drive(fork_id)
    assert out == {"status": "halted", "halts": ["call_1_1"]}, out
    assert count_effects(run_id) == {"call_1_1": 1} and count_effects(fork_id) == {}
    assert [h.op_id for h in DjangoStore().list_halts(run_id=fork_id)] == ["call_1_1"]
    # A fork of the fork halts on it as well.
    assert drive(da.fork(fork_id, 1))[1]["status"] == "halted"


# -- 3. a stalled driver, a young halt, a resolution, late evidence -------------------


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "T"
    except FileNotFoundError:
        return False


def _wait(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_stalled_driver_can_neither_record_nor_claim_after_a_resolution():
    run_id = "hole3-stall"
    store = DjangoStore()
    stalled = subprocess.Popen(
        [sys.executable, "-m", "tests.support.drive", "hole-charge", run_id, "go"],
        cwd=ROOT,
        env=subprocess_env(DA_LEASE_TTL="1", DA_STOP_INSIDE="call_1_1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: _stopped(stalled.pid), what="the driver to stop inside the charge")
        _wait(lambda: not store.get_lease(run_id).live, what="its lease to lapse")
        assert drive(run_id)[1] == {"status": "halted", "halts": ["call_1_1"]}
        attempt = Journal(store).get(run_id, "attempt:call_1_1:1")
        # Two seconds more than the attempt's age now, by the database's clock.
        min_age = (store.now() - attempt.created_at).total_seconds() + 2
        with override_settings(DURABLE_AGENTS={**_settings(), "HALT_MIN_AGE": min_age}):
            with pytest.raises(da.HaltTooYoung) as young:
                da.resolve_halt(run_id, "call_1_1", {"charged": False}, is_error=True, by="ann")
            assert "can be resolved from" in str(young.value)
            assert young.value.details["resolvable_at"]
            _wait(
                lambda: (store.now() - attempt.created_at).total_seconds() > min_age,
                what="the halt to come of age",
            )
            da.resolve_halt(run_id, "call_1_1", {"charged": False}, is_error=True, by="ann")
        assert Run.objects.get(run_id=run_id).status == "finished"
        claim = Journal(store).get(run_id, "attempt:call_1_1:2")
        assert claim is not None and claim.get("resolution") and claim.get("by") == "ann"
        # The stalled driver wakes up: its charge lands, but it records nothing.
        os.kill(stalled.pid, signal.SIGCONT)
        out, err = stalled.communicate(timeout=60)
    finally:
        if stalled.poll() is None:
            stalled.kill()
            stalled.communicate()
    assert json.loads(out.strip().splitlines()[-1])["code"] == "run.lease_lost", err
    assert count_effects(run_id) == {"call_1_1": 1}
    journal = Journal(store)
    result = journal.get(run_id, "tool:call_1_1")
    assert result.get("reconciled") and result.get("result") == {"charged": False}
    late = journal.get(run_id, "@late/call_1_1/1")
    assert late is not None and late.get("result") == {"charged": "7"}, names(run_id)
    assert journal.get(run_id, "attempt:call_1_1:3") is None
    # The halt page shows what the stalled driver saw.
    halt = Halt.objects.get(run_id=run_id, op_id="call_1_1")
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(root)
    page = client.get(reverse("admin:durable_agents_halt_change", args=[halt.pk]))
    text = page.content.decode()
    assert "after the call was taken from it" in text and "&quot;charged&quot;: &quot;7&quot;" in (
        text
    )


def _settings() -> dict:
    from django.conf import settings

    return dict(settings.DURABLE_AGENTS)


# -- 4. a session journal is never a run to drive --------------------------------------


@pytest.mark.timeout(60)
def test_a_crash_while_a_session_journal_is_created_never_drives_it():
    code, _ = run_json(
        "tests.support.holes_child",
        "send_once",
        "hole-charge",
        "hole4",
        "d-1",
        "charge order 7",
        DURABLE_AGENTS_CRASH_AT="after-session-journal",
    )
    assert code == -9
    row = Run.objects.get(run_id="hole4>session")
    assert (row.status, row.kind) == ("finished", "session")
    assert recover() == []
    assert count_effects("hole4>session") == {}
    with pytest.raises(da.ConfigError) as info:
        da.resume("hole4>session")
    assert info.value.code == "run.not_an_agent_run"
    # A row left by an older version (queued, not yet marked) is not driven either.
    DjangoStore().create_run(
        RunInfo(run_id="old>session", agent="hole-charge", kind="session", input={"session": "o"})
    )
    Run.objects.filter(run_id="old>session").update(status="queued", finished_at=None)
    assert recover() == [] and count_effects("old>session") == {}


# -- 7. a journal record and its run row never disagree --------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "alias,prepared", [("sqlite", "1"), ("default", "0")], ids=["sqlite", "postgres-unprepared"]
)
def test_a_crash_between_a_record_and_its_run_row_leaves_them_in_step(alias, prepared):
    run_id = f"hole7-{alias}"
    code, _ = run_json(
        "tests.support.drive",
        "echo",
        run_id,
        "where is order 7?",
        DA_DATABASE=alias,
        DA_PREPARED=prepared,
        DURABLE_AGENTS_CRASH_AT="store:after-insert:run:complete",
    )
    store = DjangoStore(using=alias)
    row, done = store.get_run(run_id), Journal(store).get(run_id, "run:complete")
    assert (done is None) or row.status == "finished", "record and row committed apart"
    assert code in (0, -9)
    deadline = time.monotonic() + 20
    while True:  # the killed driver's lease lapses after a second
        try:
            result = da.resume(run_id, store=store)
            break
        except da.RunBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    row = store.get_run(run_id)
    assert row.status == "finished" and row.answer == result.answer == "order 7 shipped"
    assert names(run_id, alias).count("run:complete") == 1


# -- 13. Journal.step: at most once across a crash -------------------------------------


@pytest.mark.timeout(60)
def test_a_journal_step_that_crashed_mid_effect_is_not_run_again():
    args = ("tests.support.holes_child", "step", "default", "hole13", "charge")
    assert run_json(*args, DA_CRASH_INSIDE="step:charge")[0] == -9
    _, out = run_json(*args)
    assert out == {"status": "halted", "op": "step:charge"}, out
    assert count_effects("hole13") == {"step:charge": 1}
    # A person records what happened; the step returns it from then on.
    da.resolve_halt("hole13", "step:charge", {"charged": True}, by="ann")
    assert run_json(*args)[1] == {"status": "ok", "value": {"charged": True}}
    assert count_effects("hole13") == {"step:charge": 1}
    assert Run.objects.get(run_id="hole13").kind == "journal"


@pytest.fixture(autouse=True)
def _people():
    """``ann`` resolves halts here: a user of the site (every ``by=`` names one)."""
    User.objects.create_superuser("ann", "ann@example.com", "pw")


@pytest.fixture(autouse=True)
def _effects_table():
    effects_connection().close()  # created before any child counts an effect
