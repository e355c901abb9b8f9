"""Retention's one rule, for every store (docs/retention.md): which trees of runs ``prune``
may delete, and why it keeps the others.

The unit is a **tree**: a top-level agent run with every sub-run below it. A tree goes only
whole, and only when every run in it is terminal and finished before the cutoff, nothing in
it was imported, none of it belongs to a session, and no run outside it names a run in it as
its source or parent. The database store (``database.retention``) adds the export, the locks
and the tombstones' signatures around this; ``InMemoryStore.prune`` applies it in one write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .ports import KIND_AGENT, NOT_IMPORTED, TERMINAL_STATUSES

# Why a tree is kept, as the report and the dry run say it.
KEPT_UNFINISHED = "a run in its tree is not finished"
KEPT_RECENT = "a run in its tree finished after the cutoff"
KEPT_IMPORTED = "imported (an import is evidence; prune never deletes it)"
KEPT_SESSION = "part of a session"
KEPT_FORKED = "a run outside its tree was forked from it"
KEPT_BUSY = "busy (locked by someone else)"
KEPT_CHANGED = "changed since it was exported"

# The fields of a run the rule reads (a row's values, or a ``RunInfo``'s attributes).
FIELDS = (
    "run_id",
    "status",
    "finished_at",
    "updated_at",
    "kind",
    "imported",
    "session_id",
    "agent",
    "root_run_id",
    "parent_run_id",
)


@dataclass(frozen=True)
class Pruned:
    """What a prune did: every run it deleted (sub-runs included), and each tree it kept
    (by its root) with why."""

    cutoff: datetime
    pruned: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def fields_of(run: Any) -> dict[str, Any]:
    """The rule's fields of a ``RunInfo`` (or anything with those attributes)."""
    return {name: getattr(run, name) for name in FIELDS}


def is_candidate(run: Mapping[str, Any], cutoff: datetime) -> bool:
    """Whether ``run`` roots a tree prune looks at: a top-level agent run, ended before the
    cutoff. A root that is not is no candidate at all: its sub-runs stay with it."""
    return (
        run["parent_run_id"] is None
        and run["kind"] == KIND_AGENT
        and run["status"] in TERMINAL_STATUSES
        and run["finished_at"] is not None
        and run["finished_at"] < cutoff
    )


def why_kept(
    members: Sequence[Mapping[str, Any]], cutoff: datetime, referrers: Mapping[str, str]
) -> str:
    """Why the tree of ``members`` (its root first) must stay, or "" if it may go.
    ``referrers`` maps a run to one run naming it as its source or parent."""
    mine = {m["run_id"] for m in members}
    # Every member is judged, not the root alone: a root ends before a sub-run it did not
    # wait for (a cancel's cascade, a saga's rollback), and a young or unfinished sub-run
    # deleted under its parent would leave the parent's result naming a run that is gone.
    for m in members:
        if m["status"] not in TERMINAL_STATUSES:
            return KEPT_UNFINISHED
        if m["finished_at"] is None or m["finished_at"] >= cutoff:
            return KEPT_RECENT
        if m["imported"] != NOT_IMPORTED:
            return KEPT_IMPORTED
        if m["session_id"] is not None or m["kind"] != KIND_AGENT:
            return KEPT_SESSION
        referrer = referrers.get(m["run_id"])
        if referrer is not None and referrer not in mine:
            return KEPT_FORKED
    return ""


def referrers(runs: Iterable[Any], run_ids: Iterable[str]) -> dict[str, str]:
    """Of ``runs`` (``RunInfo``s), those naming one of ``run_ids`` as their source or parent:
    ``{named: referrer}`` (the first found)."""
    ids = set(run_ids)
    found: dict[str, str] = {}
    rows = list(runs)
    # Forks first: a run named by a fork and by its own sub-run must be found by the fork,
    # which lives outside its tree (the sub-run is inside it).
    for run in rows:
        if run.forked_from in ids:
            found.setdefault(str(run.forked_from), run.run_id)
    for run in rows:
        if run.parent_run_id in ids:
            found.setdefault(str(run.parent_run_id), run.run_id)
    return found
