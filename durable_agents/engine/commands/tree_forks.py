"""Forks in a tree of sub-agents: what becomes of the sub-runs a fork's copied calls started.

For each call up to the fork point that started a sub-run (a ``child:<call>`` record of the
source):

* **the child had ended** (finished, cancelled, compensated, or failed for good): the fork
  *references* it. Its copied ``child:<call>`` names the source's child, which the fork
  never drives: the fork's call, if it runs again, gets that child's answer (or the error
  the source's call got), and the fork's spend counts it, as it counts its copied turns.
* **the call has a result in the fork** (copied or patched) and its child is unfinished:
  nothing; the fork does not need that child, and the child stays its source's.
* **the child is unfinished** and its call has no result (the parent waits on it at the fork
  point): the fork gets a child of its own under its derived id ``<fork>/<call>``, itself a
  fork of the source's child at that child's latest step (recursively, for its own
  sub-runs). Nothing the source's child recorded is done again; an attempt it had in flight
  is an unknown outcome the fork's child halts on, as in any fork. The source's child is
  never driven by the fork.
* a ``child:<call>`` with no run behind it (its parent stopped before starting it): nothing;
  the fork's call starts its own child.
* a run imported at the child's id (the source journaled the child, then died before the
  child's row; ``imported.foreign_sub_run``): referenced, never forked, finished or not. The
  fork's call, if it runs again, refuses it (``subagent.imported``) as its source's does.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .. import names
from ..imported import foreign_sub_run
from ..journal import Journal
from ..ports import CANCELLED, COMPENSATED, FAILED, NOT_IMPORTED, RunInfo, Store
from ..records import Record
from ..tree import child_run_id


@dataclass(frozen=True)
class SubRun:
    """A sub-run of the source that the fork references (``fork`` False) or forks."""

    call_id: str
    record: Record  # the source's ``child:<call>``
    fork: bool

    @property
    def source(self) -> str:
        return str(self.record.get("run_id"))


def ended(store: Store, journal: Journal, run_id: str, run: RunInfo | None = None) -> bool:
    """Whether the run ended for good: it has an answer, or never will have one (``run``:
    its row, if read)."""
    if journal.get(run_id, names.RUN_COMPLETE) is not None:
        return True
    run = run or store.get_run(run_id)
    if run is None:
        return False
    if run.status in (CANCELLED, COMPENSATED):
        return True
    return run.status == FAILED and not (run.last_error or {}).get("retryable", False)


def plan(
    store: Store,
    records: list[Record],
    kept_calls: Collection[str],
    settled: Collection[str],
    imported: str = NOT_IMPORTED,
) -> list[SubRun]:
    """The sub-runs of the source's calls up to the fork point (``kept_calls``) that the fork
    references or forks; ``settled``: the calls that have a result in the fork;
    ``imported``: the source's ``RunInfo.imported``."""
    journal = Journal(store)
    out = []
    for rec in records:
        if not rec.name.startswith(names.CHILD):
            continue
        call_id = rec.name[len(names.CHILD) :]
        if call_id not in kept_calls:
            continue
        source = str(rec.get("run_id"))
        row = store.get_run(source)
        if foreign_sub_run(row, imported) or ended(store, journal, source, row):
            out.append(SubRun(call_id, rec, fork=False))
        elif call_id not in settled and journal.get(source, names.RUN_START) is not None:
            out.append(SubRun(call_id, rec, fork=True))
    return out


def child_record(sub: SubRun, fork_id: str) -> dict[str, Any]:
    """The fork's ``child:<call>``: the source's (a reference), or naming the fork's own."""
    body = dict(sub.record.body)
    if sub.fork:
        body["run_id"] = child_run_id(fork_id, sub.call_id)
        body["forked_from"] = sub.source
    return body
