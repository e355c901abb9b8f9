"""Retention in the world (issue 43): an operator who prunes, exports and imports, and
everyone who comes back to a pruned id; with the invariants that hold prune to its rule.

The pruner prunes with a cutoff some virtual seconds back (``Store.prune`` on either lane:
``InMemoryStore.prune``, or ``retention.prune`` on PostgreSQL), having exported what it
prunes (the runs' rows and journals, read just before). Half its prunes are aimed: when a
tree's root has ended while a run below it has not, or ended later (a cancel whose cascade
has not reached a sub-run busy in another worker, or died after its own record), the cutoff
falls between the root's end and now, so judging the root alone would take the tree.

Then it comes back to pruned ids: a client retrying under one, staff forking with
``new_run_id=`` it, a live import of its export (trimmed after its first decision, handed to a
driver), an inert import at its own id — each refused as ``run.pruned`` (or ``run.spent``) —
and an inert import of its export under a new id, which is evidence: it stays as imported
(``imports_stay_inert``) and no prune takes it.

Its draws come from streams of their own (``prune:<seed>`` for whether it takes part,
``prune-ops:<seed>`` for its choices), so every other seed keeps its schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from datetime import timedelta
from typing import Any

import durable_agents as da
from durable_agents.engine import failpoints, retention
from durable_agents.engine.agent import get_agent
from durable_agents.engine.errors import DurableAgentsError, RunIdSpent
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import (
    IMPORTED_INERT,
    IMPORTED_LIVE,
    KIND_AGENT,
    NOT_IMPORTED,
    QUEUED,
    TERMINAL_STATUSES,
    RunInfo,
)

from . import world as W
from .actors import Actor, Op, cancel_tree
from .agent import AGENT, is_agent_run

# The share of the tree canceller's casts with the pruner (with the operator, in the
# answerer's casts: errands make trees there, and cancels end a root before its sub-runs).
ODDS = 0.6


def takes_part(seed: int) -> bool:
    """Whether a seed's cast has the pruner (``scenario.build``), wherever it is drawn:
    with the tree canceller (its own stream, ``stops:<seed>``, as the cast draws it)."""
    if random.Random(f"stops:{seed}").random() >= 0.6:
        return False
    return random.Random(f"prune:{seed}").random() < ODDS


Export = tuple[RunInfo, list[tuple[str, str]]]


class Pruner(Actor):
    """An operator who prunes (``durable_agents prune``, here with a virtual-clock age),
    keeps the export, and comes back to what it pruned (above)."""

    kind = "operator"
    TRIES = ("retry", "fork as", "import live", "import inert", "evidence")
    AGES = (0.0, 5.0, 30.0, 120.0)

    def __init__(self, name: str, seed: int, prunes: int, cancels: int, tries: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"prune-ops:{seed}")
        self.prunes_left = prunes
        self.cancels_left = cancels
        self.tries_left = tries
        self.pruned: dict[str, Export] = {}  # every run pruned -> its export
        self.n = 0

    def _roots(self, w: W.World) -> dict[str, RunInfo]:
        """The ended top-level agent runs a prune could take, by id."""
        return {
            r: row
            for r in w.runs
            if (row := w.raw.get_run(r)) is not None
            and not row.parent_run_id
            and row.kind == KIND_AGENT
            and row.session_id is None
            and row.imported == NOT_IMPORTED
            and row.status in TERMINAL_STATUSES
            and row.finished_at is not None
        }

    def _split(self, w: W.World, roots: dict[str, RunInfo]) -> dict[str, float]:
        """Of ``roots``, the trees that only their sub-runs keep — a run below the root has
        not ended, or ended after it, and no run outside the tree names one in it — each
        with when its last run ended (now, if one has not)."""
        rows = [row for r in w.runs if (row := w.raw.get_run(r)) is not None]
        out = {}
        for root, row in roots.items():
            below = [r for r in rows if r.root_run_id == root and r.run_id != root]
            ids = {root, *(r.run_id for r in below)}
            named = retention.referrers(rows, ids)
            if any(ref not in ids for ref in named.values()):
                continue
            ends = [
                w.now if r.status not in TERMINAL_STATUSES or r.finished_at is None
                else r.finished_at.timestamp()
                for r in below
            ]  # fmt: skip
            assert row.finished_at is not None
            if ends and max(ends) > row.finished_at.timestamp():
                out[root] = max(ends)
        return out

    def _stale(self, w: W.World) -> list[str]:
        """Roots nobody drives whose tree has a sub-run paused (awaiting a decision, an
        answer, its rate): what an operator cancels before pruning."""
        out = []
        for r in w.runs:
            row = w.raw.get_run(r)
            if row is None or not row.parent_run_id or row.finished or not row.root_run_id:
                continue
            root = w.raw.get_run(row.root_run_id)
            lease = w.raw.get_lease(row.root_run_id)
            if root is None or root.finished or root.inert or (lease is not None and lease.live):
                continue
            if row.root_run_id not in out:
                out.append(row.root_run_id)
        return out

    def weight(self, w: W.World) -> int:
        if self.prunes_left and (roots := self._roots(w)):
            return 6 if self._split(w, roots) else 1  # the window lasts until the cascade lands
        if self.cancels_left and self._stale(w):
            return 1
        return 2 if self.tries_left and self.pruned else 0

    def choose(self, w: W.World) -> Op | None:
        rng = self.rng
        stale = self._stale(w) if self.cancels_left else []
        if stale and rng.random() < 0.5:
            # Retention's chore before a prune: cancel what has waited too long. The cancel
            # ends the root first and its sub-runs after it, one by one.
            self.cancels_left -= 1
            run_id = rng.choice(stale)
            w.count("stale trees cancelled before a prune")
            return (
                f"cancel stale tree {run_id}",
                lambda: cancel_tree(w, run_id, self.name, "stale", compensate=False),
            )
        roots = self._roots(w) if self.prunes_left else {}
        if roots and (not self.pruned or rng.random() < 0.6):
            self.prunes_left -= 1
            # The cutoff is a date, as the command takes it: after the end of a root and
            # before now, or a round age back. Aimed: after a root's end and before the end
            # of the last run of its tree, so the root alone would let the tree go.
            split = self._split(w, roots)
            if split and rng.random() < 0.8:
                root = rng.choice(sorted(split))
                ended = roots[root].finished_at
                assert ended is not None
                cutoff = rng.uniform(ended.timestamp(), split[root])
                aimed = " (aimed)"
                w.count("prunes aimed at a tree with a run that ended after its root")
            elif rng.random() < 0.7:
                ended = roots[rng.choice(sorted(roots))].finished_at
                assert ended is not None
                cutoff, aimed = rng.uniform(ended.timestamp(), w.now), ""
            else:
                cutoff, aimed = w.now - rng.choice(self.AGES), ""
            return (
                f"prune runs ended before t={cutoff - W.EPOCH:.1f}{aimed}",
                lambda: self._prune(w, cutoff),
            )
        if not self.tries_left or not self.pruned:
            return None
        self.tries_left -= 1
        run_id = rng.choice(sorted(self.pruned))
        what = rng.choice(self.TRIES)
        return f"{what} {run_id} (pruned)", lambda: self._try(w, run_id, what)

    # -- pruning ----------------------------------------------------------------------------

    def _prune(self, w: W.World, before_t: float) -> str:
        w.store.now()  # a point: the operator may die before it prunes
        # What the prune is judged against and what its export holds: read from the raw
        # store with the prune, so no other process moves in between (the prune is one write).
        now = w.raw.now()
        cutoff = min(now, now + timedelta(seconds=before_t - w.now))
        # (Imports are written to the raw store, outside ``w.runs``.)
        ids = dict.fromkeys([*w.runs, *w.imports])
        before = {r: row for r in ids if (row := w.raw.get_run(r)) is not None}
        exports = {r: (row, [(e.name, e.data) for e in w.raw.load(r)]) for r, row in before.items()}
        # The database's prune is one transaction with failpoints inside it (the SIGKILL
        # tests'): here they would hand the baton over with that transaction open, and the
        # next session to touch its rows would wait for it with the whole world. Both lanes
        # interleave at store calls (docs/simulation.md, Limits): the prune is one call.
        hit, failpoints.hit = failpoints.hit, _nowhere
        try:
            report = w.raw.prune(finished_before=cutoff, by=self.name)
        finally:
            failpoints.hit = hit
        pruned = list(report.pruned)
        check_whole_trees(w, before, pruned, cutoff)
        for run_id in pruned:
            self.pruned[run_id] = exports[run_id]
            w.forget(run_id)
        w.count("prunes")
        for why in report.kept.values():
            w.count(f"trees kept by a prune: {why}")
        if pruned:
            w.count("runs pruned")
        if any(before[r].parent_run_id for r in pruned):
            w.count("trees pruned with their sub-runs")
        kept = "; ".join(f"{root}: {why}" for root, why in report.kept.items())
        return f"pruned {len(pruned)}" + (f", kept {kept}" if kept else "")

    # -- coming back ------------------------------------------------------------------------

    def _try(self, w: W.World, run_id: str, what: str) -> str:
        row, records = self.pruned[run_id]
        try:
            if what == "retry":
                if row.parent_run_id or not is_agent_run(run_id) or row.agent != AGENT:
                    return "not a client's run"
                get_agent(AGENT).start(row.input, run_id=run_id, store=w.store)
            elif what == "fork as":
                sources = [r for r in w.runs if w.raw.get(r, "run:start") is not None]
                if not sources:
                    return "nothing to fork"
                source = sources[self.rng.randrange(len(sources))]
                da.fork(source, 1, new_run_id=run_id, by=self.name, store=w.store)
            elif what == "import live":
                kept = []
                for name, data in records:
                    kept.append((name, data))
                    if name.startswith("approval:"):
                        break
                self._write(w, dataclasses.replace(_as_import(row), imported=IMPORTED_LIVE,
                                                   status=QUEUED), kept)  # fmt: skip
                w.dispatch(run_id)
            elif what == "import inert":
                self._write(w, _as_import(row), records)
            else:
                return self._evidence(w, run_id, row, records)
        except RunIdSpent as exc:
            w.count(f"pruned ids refused ({what}, {exc.code})")
            return f"refused ({exc.code})"
        except DurableAgentsError as exc:
            return f"refused ({exc.code})"
        w.violate(
            "pruned_stay_pruned",
            f"{what} of run {run_id}, pruned by {self.name}, was not refused: a run holds its "
            "id again",
            hole="new",
        )
        return "taken"

    def _write(self, w: W.World, row: RunInfo, records: list[tuple[str, str]]) -> None:
        """An import as the real one writes it: one transaction, here one go on the raw store
        (the row's create refuses a spent id before anything is written)."""
        w.store.now()  # a point: the import begins
        w.raw.create_run(row)
        for name, data in records:
            w.raw.insert(row.run_id, name, data)

    def _evidence(
        self, w: W.World, run_id: str, row: RunInfo, records: list[tuple[str, str]]
    ) -> str:
        """The export imported inert under a new id: evidence, which stays as imported."""
        self.n += 1
        new = f"ev{self.n}:{run_id}"
        self._write(w, dataclasses.replace(_as_import(row), run_id=new), records)
        w.imports[new] = W.imported_state(w.raw, new, f"{run_id}'s export")
        w.count("pruned runs imported as evidence")
        return new


def _nowhere(name: str) -> None:
    """A failpoint that is no scheduling point."""


def _as_import(row: RunInfo) -> RunInfo:
    """An export's run as an inert import writes it: no links to this site's runs."""
    return dataclasses.replace(
        row,
        imported=IMPORTED_INERT,
        session_id=None,
        parent_run_id=None,
        root_run_id=None,
        forked_from=None,
        forked_step=None,
    )


def at_rest(w: W.World) -> None:
    """Once the world is at rest and checked: the pruner prunes once more, aimed at a tree
    whose last run ended after its root (a cancel's cascade, a sub-run stopped late), then
    comes back to each id it pruned there, and its invariants are checked again. At rest
    every run has ended, so only the ages tell such a tree from one that may go. (Only now:
    a run pruned earlier is no longer the other invariants' to check.)"""
    for actor in w.actors:
        if not isinstance(actor, Pruner):
            continue
        split = actor._split(w, roots := actor._roots(w))
        if not split:
            continue
        root = actor.rng.choice(sorted(split))
        ended = roots[root].finished_at
        assert ended is not None
        cutoff = actor.rng.uniform(ended.timestamp(), split[root])
        w.count("prunes at rest, aimed")
        had = set(actor.pruned)
        label = f"prune runs ended before t={cutoff - W.EPOCH:.1f} (at rest, aimed)"
        w.run_to_end(w.start(actor, label, functools.partial(actor._prune, w, cutoff)))
        for run_id in sorted(set(actor.pruned) - had):
            what = actor.rng.choice(actor.TRIES[:4])
            label = f"{what} {run_id} (pruned)"
            w.run_to_end(w.start(actor, label, functools.partial(actor._try, w, run_id, what)))
    check_pruned(w)


# -- invariants ------------------------------------------------------------------------------

INVARIANTS = ("pruned_stay_pruned", "prune_whole_trees")


def check_whole_trees(
    w: W.World, before: dict[str, RunInfo], pruned: list[str], cutoff: Any
) -> None:
    """``prune_whole_trees``, as the prune returns: every run it deleted had ended before the
    cutoff, was no import, and went with its whole tree; nothing left names a run it
    deleted (a sub-run's row, a fork's, a parent's ``child:`` record)."""
    gone = set(pruned)

    def root_of(row: RunInfo) -> str:
        return row.root_run_id or row.run_id

    roots = {root_of(before[r]) for r in pruned}
    for run_id in pruned:
        row = before[run_id]
        if row.status not in TERMINAL_STATUSES:
            why = f"it was {row.status}"
        elif row.finished_at is None or row.finished_at >= cutoff:
            why = f"it ended at t={_t(row.finished_at)}, after the cutoff t={_t(cutoff)}"
        elif row.imported != NOT_IMPORTED:
            why = f"it was an import ({row.imported})"
        else:
            continue
        w.violate("prune_whole_trees", f"prune deleted run {run_id} of tree {root_of(row)}: {why}")
    for run_id, row in before.items():
        if run_id not in gone and root_of(row) in roots:
            w.violate(
                "prune_whole_trees",
                f"prune deleted part of tree {root_of(row)} and left run {run_id}",
            )
    for run_id in w.runs:
        if run_id in gone or (row := w.raw.get_run(run_id)) is None:
            continue
        for link in ("parent_run_id", "root_run_id", "forked_from"):
            if getattr(row, link) in gone:
                w.violate(
                    "prune_whole_trees",
                    f"run {run_id} names pruned run {getattr(row, link)} ({link})",
                )
        for rec in Journal(w.raw).records(run_id):
            if rec.name.startswith("child:") and rec.get("run_id") in gone:
                w.violate(
                    "prune_whole_trees",
                    f"run {run_id}'s {rec.name} names pruned sub-run {rec.get('run_id')}",
                )


def check_pruned(w: W.World) -> None:
    """``pruned_stay_pruned`` at the end: no row holds a pruned id again, and each left a
    tombstone (on the stores that keep them where the simulator can read them)."""
    for actor in w.actors:
        if not isinstance(actor, Pruner):
            continue
        # (The database's tombstones are held to their rows by ``verify``, in its tests.)
        tombstone = w.raw.tombstone if w.lane is None else None
        for run_id in actor.pruned:
            if w.raw.get_run(run_id) is not None:
                w.violate(
                    "pruned_stay_pruned",
                    f"run {run_id} was pruned by {actor.name}, and a run holds its id again",
                    hole="new",
                )
            elif tombstone is not None and tombstone(run_id) is None:
                w.violate("pruned_stay_pruned", f"pruned run {run_id} left no tombstone")


def _t(at: Any) -> str:
    return f"{at.timestamp() - W.EPOCH:.1f}" if at is not None else "never"
