"""Helpers of the retention tests (``durable_agents.database.retention``): aging runs, running
``prune`` in a child process (killed at a failpoint if asked), and the invariant every
crash must keep: each run is whole, or gone with a tombstone and an export holding it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from durable_agents.engine.registry import get_agent
from durable_agents.models import (
    ApprovalRequest,
    Decision,
    Halt,
    JournalEntry,
    Lease,
    Run,
    Tombstone,
)
from tests.support.procs import ROOT, subprocess_env

PRUNER = "pruner"


def age(run_ids: list[str], days: float = 30) -> None:
    """Make runs look finished ``days`` ago (their journal and ``updated_at`` untouched)."""
    Run.objects.filter(pk__in=run_ids).update(finished_at=timezone.now() - timedelta(days=days))


def cutoff(days: float = 7) -> str:
    return (timezone.now() - timedelta(days=days)).isoformat()


def old_trees(n: int, prefix: str) -> dict[str, int]:
    """``n`` finished three-run trees (root, middle, leaf), aged; each run's record count."""
    for i in range(n):
        get_agent("stree-root").start("go", run_id=f"{prefix}-{i}")
    ids = [
        r for r in Run.objects.filter(run_id__startswith=f"{prefix}-").values_list("pk", flat=True)
    ]
    age(ids)
    return {rid: JournalEntry.objects.filter(run_id=rid).count() for rid in ids}


def prune_in_child(*args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``manage.py durable_agents prune <args>`` in a new process on the test databases;
    killed (SIGKILL) at the failpoint ``crash_at`` when given."""
    env = {"DURABLE_AGENTS_CRASH_AT": crash_at} if crash_at else {}
    return subprocess.run(
        [sys.executable, "manage.py", "durable_agents", "prune", *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_prune_in_child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "durable_agents", "prune", *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def export_runs_in(path: Path) -> list[str]:
    header = json.loads(path.read_text().splitlines()[0])
    return list(header["runs"])


def assert_whole_or_tombstoned(records: dict[str, int], export_dir: Path | None) -> set[str]:
    """Every run of ``records`` (run id -> its record count) is whole (row, every record, no
    tombstone) or gone with everything it had, with one tombstone naming its final count and
    (with ``export_dir``) an export file whose sha256 it states and which holds it. The ids
    pruned."""
    gone = set()
    for rid, count in records.items():
        row = Run.objects.filter(pk=rid).exists()
        entries = JournalEntry.objects.filter(run_id=rid).count()
        stones = list(Tombstone.objects.filter(run_id=rid))
        if row:
            assert entries == count, f"{rid}: {entries} of {count} records left with its row"
            assert not stones, f"{rid} is here and tombstoned"
            continue
        gone.add(rid)
        assert entries == 0, f"{rid}: row gone, {entries} records left"
        for model in (ApprovalRequest, Halt, Lease):
            assert not model.objects.filter(run_id=rid).exists(), (rid, model)
        assert not Decision.objects.filter(request__run_id=rid).exists()
        assert len(stones) == 1, f"{rid}: {len(stones)} tombstones"
        [stone] = stones
        assert stone.records == count
        if export_dir is not None:
            path = export_dir / stone.export_file
            assert path.is_file(), f"{rid} gone without its export file"
            assert hashlib.sha256(path.read_bytes()).hexdigest() == stone.export_sha256
            assert rid in export_runs_in(path)
    return gone
