"""``prune`` killed with SIGKILL at each named point, then run again in a new process: no
run is lost without an export file and a tombstone, none is half deleted, every chain
verifies, and a third run changes nothing. Then the races: two prunes at once, a fork made
while a prune deletes its source, a run decided while its tree is pruned."""

from __future__ import annotations

import signal
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connections
from django.utils import timezone

import durable_agents as da
from durable_agents.database.audit import verify
from durable_agents.database.retention import KEPT_FORKED, prune
from durable_agents.engine.errors import DurableAgentsError
from durable_agents.models import ActionLog, ApprovalRequest, Run, Tombstone
from tests.support.agents import echo, gated
from tests.support.doubles import hooks_at_points
from tests.support.people import make_user
from tests.support.pruning import (
    PRUNER,
    age,
    assert_whole_or_tombstoned,
    cutoff,
    old_trees,
    prune_in_child,
    start_prune_in_child,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def _pruner(db):
    make_user(PRUNER, "delete_run")


def _all_verified() -> None:
    reports = verify(None, actions=True)
    assert all(r.ok for r in reports), [r.message() for r in reports if not r.ok]


def _args(export: object, batch: int) -> tuple[str, ...]:
    """A prune of what finished before the cutoff, exported to ``export``, ``batch`` trees
    at a time."""
    return ("--finished-before", cutoff(), "--export", str(export), "--by", PRUNER,
            "--batch", str(batch))  # fmt: skip


@pytest.mark.parametrize(
    "point",
    ["prune-after-export", "prune-after-tombstones", "prune-before-commit", "prune-after-batch"],
)
def test_a_prune_killed_at_each_point_is_finished_by_the_next(tmp_path, point):
    records = old_trees(3, "crash")
    echo.start("hi", run_id="recent")
    args = _args(tmp_path, batch=1)

    killed = prune_in_child(*args, crash_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    gone = assert_whole_or_tombstoned(records, tmp_path)
    # Killed after its first batch committed: that tree is gone; before: nothing is.
    assert len(gone) == (3 if point == "prune-after-batch" else 0)
    assert len(list(tmp_path.glob("*.jsonl"))) == 1
    assert not list(tmp_path.glob("*.part"))
    _all_verified()

    again = prune_in_child(*args)
    assert again.returncode == 0, again.stderr
    assert assert_whole_or_tombstoned(records, tmp_path) == set(records)
    assert Run.objects.filter(pk="recent").exists()
    _all_verified()
    assert {r.chain for r in verify([*records])} == set(records)
    # A batch row per tree actually deleted: none for the killed batch unless committed.
    assert ActionLog.objects.filter(action="prune").count() == 3

    stones, rows = Tombstone.objects.count(), ActionLog.objects.count()
    files = sorted(tmp_path.iterdir())
    third = prune_in_child(*args)
    assert third.returncode == 0 and "pruned 0 run(s)" in third.stdout
    assert (Tombstone.objects.count(), ActionLog.objects.count()) == (stones, rows)
    assert sorted(tmp_path.iterdir()) == files


def test_two_prunes_at_once_prune_each_run_once(tmp_path):
    records = old_trees(12, "both")
    args = _args(tmp_path, batch=2)
    procs = [start_prune_in_child(*args) for _ in range(2)]
    for p in procs:
        _out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert assert_whole_or_tombstoned(records, tmp_path) == set(records)
    pruned = [r for row in ActionLog.objects.filter(action="prune") for r in row.payload["runs"]]
    assert sorted(pruned) == sorted(records)  # each run in exactly one committed batch
    _all_verified()


def _wait_for_lock_wait(text: str) -> None:
    """Until another backend waits on a lock in a statement holding ``text``."""
    deadline = time.monotonic() + 30
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            # Called inside the prune's transaction, which would see one snapshot of the
            # activity view for its whole length.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s AND datname = current_database()",
                [f"%{text}%"],
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the fork never waited on the pruned row")


def test_a_fork_made_while_its_source_is_deleted_is_refused_and_leaves_nothing(monkeypatch):
    """The fork reads the source before the prune commits, creates its row after the prune
    checked for forks, and asks for its source under a share lock: it waits for the prune,
    finds the source gone, and takes its row back."""
    echo.start("hi", run_id="src")
    age(["src"])
    at_point = hooks_at_points(monkeypatch)
    outcome: dict[str, object] = {}

    def fork_now() -> None:
        try:
            outcome["fork"] = da.fork("src", 1, new_run_id="src-copy")
        except DurableAgentsError as exc:
            outcome["error"] = exc.code
        finally:
            connections.close_all()

    def race() -> None:
        worker = threading.Thread(target=fork_now)
        worker.start()
        outcome["thread"] = worker
        _wait_for_lock_wait("FOR SHARE")

    at_point("prune-before-commit", race)
    report = prune(finished_before=_cutoff(), by=PRUNER, export_dir=None)
    worker = outcome["thread"]
    assert isinstance(worker, threading.Thread)
    worker.join(timeout=60)

    assert report.pruned == ["src"]
    assert outcome.get("error") == "run.not_found", outcome
    assert not Run.objects.filter(pk__in=["src", "src-copy"]).exists()
    assert Tombstone.objects.filter(run_id="src").count() == 1
    _all_verified()


def test_a_fork_committed_before_the_delete_keeps_its_source(monkeypatch):
    """The fork's row commits while the prune holds the source; the fork then waits on the
    source row. The prune, checking for forks after its delete, sees it and rolls back."""
    echo.start("hi", run_id="kept-src")
    age(["kept-src"])
    at_point = hooks_at_points(monkeypatch)
    made: list[str] = []
    threads: list[threading.Thread] = []

    def body() -> None:
        try:
            made.append(da.fork("kept-src", 1, new_run_id="kept-copy"))
        finally:
            connections.close_all()

    def fork_in_thread() -> None:
        threads.append(threading.Thread(target=body))
        threads[0].start()
        _wait_for_lock_wait("FOR SHARE")

    at_point("prune-after-tombstones", fork_in_thread)
    report = prune(finished_before=_cutoff(), by=PRUNER, export_dir=None)
    threads[0].join(timeout=60)

    assert report.pruned == [] and report.kept == {"kept-src": KEPT_FORKED}
    assert made == ["kept-copy"]
    assert Run.objects.filter(pk="kept-src").exists() and not Tombstone.objects.exists()
    assert Run.objects.get(pk="kept-copy").forked_from == "kept-src"
    assert not ActionLog.objects.filter(action="prune").exists()
    _all_verified()


def test_a_decision_racing_a_prune_is_refused_and_nothing_is_half_written(monkeypatch):
    """A cancelled run whose call was waiting, decided while the prune holds it."""
    gated.start("refund order 7", run_id="late-vote")
    da.cancel("late-vote", by=make_user("op", "cancel_run"))
    age(["late-vote"])
    call_id = ApprovalRequest.objects.get(run_id="late-vote").call_id
    voter = make_user("voter", "approve_toolcall")
    at_point = hooks_at_points(monkeypatch)
    said: list[str] = []
    threads: list[threading.Thread] = []

    def body() -> None:
        try:
            da.approve("late-vote", call_id, approved=True, by=voter)
            said.append("decided")
        except DurableAgentsError as exc:
            said.append(exc.code)
        finally:
            connections.close_all()

    def decide() -> None:
        threads.append(threading.Thread(target=body))
        threads[0].start()
        threads[0].join(timeout=5)

    at_point("prune-after-tombstones", decide)
    report = prune(finished_before=_cutoff(), by=PRUNER, export_dir=None)
    threads[0].join(timeout=60)

    assert said and said[0] != "decided", said
    assert report.pruned == ["late-vote"]
    assert_whole_or_tombstoned({"late-vote": Tombstone.objects.get().records}, None)
    _all_verified()


def _cutoff() -> datetime:
    return timezone.now() - timedelta(days=7)
