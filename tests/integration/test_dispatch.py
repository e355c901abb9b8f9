"""Starting runs, handing them over after commit, recovery passes and the operator
commands, on PostgreSQL with inline dispatch (Celery workers: test_celery_workers.py)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext, override_settings

import durable_agents as da
from durable_agents.celery.recovery import recover
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.models import JournalEntry, Run
from tests.support.agents import echo, gated

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def test_start_after_commit_drives_the_run_inline():
    run_id = echo.start("where is order 7?", run_id="start-1")
    assert run_id == "start-1"
    run = Run.objects.get(run_id=run_id)
    assert (run.status, run.answer, run.turns) == ("finished", "order 7 shipped", 2)


def test_start_inside_a_rolled_back_transaction_leaves_nothing():
    with pytest.raises(Rollback), transaction.atomic():
        echo.start("where is order 7?", run_id="start-rb")
        assert Run.objects.filter(run_id="start-rb").exists()  # written in the transaction
        raise Rollback
    assert not Run.objects.filter(run_id="start-rb").exists()
    assert not JournalEntry.objects.filter(run_id="start-rb").exists()


def test_start_inside_a_transaction_waits_for_the_commit():
    with transaction.atomic():
        echo.start("where is order 7?", run_id="start-tx")
        assert Run.objects.get(run_id="start-tx").status == "queued"
    assert Run.objects.get(run_id="start-tx").status == "finished"


def test_start_generates_ids_and_refuses_bad_input():
    run_id = echo.start("hello")
    assert run_id.startswith("echo-") and Run.objects.get(run_id=run_id).status == "finished"
    with pytest.raises(da.ConfigError, match="run id"):
        echo.start("hello", run_id="bad id!")
    with pytest.raises(da.ConfigError, match="different input"):
        echo.start("another question", run_id=run_id)
    with pytest.raises(da.ProtocolError):
        echo.start({"when": object()}, run_id="start-bad-input")
    assert not Run.objects.filter(run_id="start-bad-input").exists()


def test_driving_inside_a_transaction_is_refused():
    with pytest.raises(da.ConfigError, match="atomic"), transaction.atomic():
        echo.run("in-tx", "hi")
    assert not Run.objects.filter(run_id="in-tx").exists()


def test_start_of_a_gated_run_pauses_for_approval():
    run_id = gated.start("refund order 7", run_id="gated-1")
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    assert [p.run_id for p in da.pending()] == ["gated-1"]


def _queued(run_id: str, agent: str = "echo", **changes) -> None:
    """A run left an hour ago (recovery waits an interval after a hand-over)."""
    store = DjangoStore()
    store.create_run(RunInfo(run_id=run_id, agent=agent, input="where is order 7?"))
    if changes:
        store.update_run(run_id, changes)
    Run.objects.filter(run_id=run_id).update(updated_at=Now() - timedelta(hours=1))


def test_recovery_drives_runs_nobody_drives_and_skips_the_rest():
    store = DjangoStore()
    _queued("rec-queued")
    _queued("rec-crashed", status="running")
    _queued("rec-leased", status="running")
    store.acquire_lease("rec-leased", "someone", "tok", 30)
    _queued("rec-approval", status="awaiting_approval")
    _queued("rec-halted", status="halted")
    _queued(
        "rec-failed-config",
        status="failed",
        last_error={"code": "config.invalid", "message": "x", "retryable": False},
        attempts=1,
    )
    _queued(
        "rec-failed-blip",
        status="failed",
        last_error={"code": "storage.failed", "message": "x", "retryable": True},
        attempts=1,
    )
    _queued(
        "rec-failed-often",
        status="failed",
        last_error={"code": "storage.failed", "message": "x", "retryable": True},
        attempts=99,
    )
    sent = recover()
    assert sorted(sent) == ["rec-crashed", "rec-failed-blip", "rec-queued"]
    statuses = dict(Run.objects.values_list("run_id", "status"))
    assert statuses["rec-queued"] == statuses["rec-crashed"] == "finished"
    assert statuses["rec-failed-blip"] == "finished"
    assert statuses["rec-leased"] == "running" and statuses["rec-approval"] == "awaiting_approval"


def test_a_recovery_pass_reads_the_same_whatever_the_finished_runs():
    _queued("cost-open")
    store = DjangoStore()
    with CaptureQueriesContext(connection) as before:
        store.list_unfinished(statuses=["queued", "running", "failed"], lease_free=True)
    for i in range(200):
        Run.objects.create(run_id=f"cost-done-{i}", agent="echo", status="finished")
    Run.objects.filter(run_id__startswith="cost-done-").update(finished_at="2026-01-01T00:00Z")
    with CaptureQueriesContext(connection) as after:
        runs = store.list_unfinished(statuses=["queued", "running", "failed"], lease_free=True)
    assert [r.run_id for r in runs] == ["cost-open"]
    assert len(before) == len(after) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + after[0]["sql"])
        plan = " ".join(row[0] for row in cursor.fetchall())
    assert "da_run_unfinished" in plan or "Seq Scan" in plan  # tiny tables may seq-scan


def test_operator_commands():
    _queued("cmd-open", status="awaiting_approval")
    out = StringIO()
    call_command("durable_agents", "runs", stdout=out)
    assert (
        "cmd-open  [echo] awaiting_approval: a tool call awaits a staff decision" in out.getvalue()
    )
    _queued("cmd-queued")
    out = StringIO()
    call_command("durable_agents", "recover", stdout=out)
    assert "re-enqueued 1 run(s)" in out.getvalue() and "cmd-queued" in out.getvalue()
    assert Run.objects.get(run_id="cmd-queued").status == "finished"


def test_resume_of_unknown_run_is_a_clear_error():
    with pytest.raises(da.ConfigError, match="no run 'nope'"):
        da.resume("nope")


def test_journal_of_a_finished_start():
    run_id = echo.start("where is order 7?", run_id="journal-1")
    names = [r.name for r in Journal(DjangoStore()).records(run_id)]
    assert names[:2] == ["@journal", "run:start"] and names[-1] == "run:complete"


@pytest.mark.parametrize(
    "value,problem",
    [
        ({"DISPATCH": "rabbit"}, "DISPATCH"),
        ({"LEASE_TTL": 0}, "LEASE_TTL"),
        ({"LEASE_TTL": "30"}, "LEASE_TTL"),
        ({"ON_DRIFT": "panic"}, "ON_DRIFT"),
        ({"LEASE_TTLS": 3}, "did you mean 'LEASE_TTL'"),
        ({"RETRY": {"MAX_ATTEMPTS": 0}}, "MAX_ATTEMPTS"),
        ({"AGENTS": "not.a.list.of", "PREPARED_STATEMENTS": "yes"}, "PREPARED_STATEMENTS"),
        ({"INSTANT_TAKEOVER": 1}, "INSTANT_TAKEOVER"),
        ({"EVENTS_KEEPALIVE": 0}, "EVENTS_KEEPALIVE"),
        ("not a dict", "must be a dict"),
    ],
)
def test_bad_settings_fail_the_system_check(value, problem):
    from django.core.checks import run_checks

    with override_settings(DURABLE_AGENTS=value):
        errors = [e for e in run_checks() if e.id.startswith("durable_agents.")]
        assert errors and any(problem in e.msg for e in errors), errors
        assert all("docs/settings.md" in e.hint and e.id == "durable_agents.E001" for e in errors)
        with pytest.raises(da.ConfigError, match="invalid DURABLE_AGENTS"):
            echo.start("hi", run_id="bad-settings")
    assert not Run.objects.filter(run_id="bad-settings").exists()


def test_resolve_command_records_the_outcome_and_refuses_bad_input():
    from django.core.management.base import CommandError

    from durable_agents.engine.journal import Journal as _Journal
    from tests.support.agents import crash_agents

    agent = next(a for a in crash_agents if a.name == "crash-side_effect")
    store = DjangoStore()
    # A halt without killing anything: the attempt marker stands with no result.
    agent_run = agent.name
    store.create_run(RunInfo(run_id="cmd-halt", agent=agent_run, input="go"))
    journal = _Journal(store)
    journal.write(
        "cmd-halt",
        "run:start",
        {"kind": "start", "agent": agent_run, "input": "go", "fingerprint": agent.fingerprint()},
    )
    journal.write(
        "cmd-halt",
        "model:1",
        {
            "kind": "model",
            "usage": {},
            "finish": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_1_1", "name": "act", "arguments": '{"item": "x"}'}],
            },
        },
    )
    journal.write(
        "cmd-halt",
        "attempt:call_1_1:1",
        {"kind": "attempt", "claim": "c", "attempted_at": 1, "tool": "act"},
    )
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command(
            "durable_agents", "resolve", "cmd-halt", "call_1_1", "--result", "{oops", "--by", "ops"
        )
    # --by names a user, who must hold resolve_halt (the engine's rule, on every path).
    with pytest.raises(CommandError, match=r"actor\.unknown"):
        call_command(
            "durable_agents", "resolve", "cmd-halt", "call_1_1", "--result", "1", "--by", "ops"
        )
    from django.contrib.auth.models import User

    User.objects.create_user("viewer", is_staff=True)
    with pytest.raises(CommandError, match=r"actor\.forbidden"):
        call_command(
            "durable_agents", "resolve", "cmd-halt", "call_1_1", "--result", "1", "--by", "viewer"
        )
    User.objects.create_superuser("ops")
    with pytest.raises(CommandError, match=r"halt\.no_live_attempt"):
        call_command(
            "durable_agents", "resolve", "cmd-halt", "call_9_9", "--result", "1", "--by", "ops"
        )
    assert journal.get("cmd-halt", "tool:call_1_1") is None
    out = StringIO()
    call_command(
        "durable_agents",
        "resolve",
        "cmd-halt",
        "call_1_1",
        "--result",
        '{"done": "x"}',
        "--evidence",
        '{"log": "seen"}',
        "--by",
        "ops",
        stdout=out,
    )
    assert "recorded the outcome of call_1_1" in out.getvalue()
    assert journal.get("cmd-halt", "tool:call_1_1").get("reconciled") is True


def test_recovery_hands_a_run_over_a_bounded_number_of_times():
    """A run no worker can drive (its agent is gone) fails once with its reason, instead
    of being re-enqueued on every pass forever; pending() says why."""
    _queued("rec-no-agent", agent="gone")
    assert recover() == ["rec-no-agent"]
    assert recover() == []
    row = Run.objects.get(run_id="rec-no-agent")
    assert row.status == "failed" and row.last_error["code"] == "config.agent_missing"
    [p] = da.pending()
    assert "no agent named 'gone'" in p.why


def test_recover_is_exported():
    assert da.recover() == []
