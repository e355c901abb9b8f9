"""Retention's rule on every store (``engine.retention``): ``InMemoryStore.prune`` and
``DjangoStore.prune`` (the database's ``retention.prune``) delete the same trees and keep
the same ones for the same reasons — a tree goes whole, and only when every run in it ended
before the cutoff — and a pruned id is spent as pruned."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from durable_agents.engine import retention
from durable_agents.engine.errors import RunPruned
from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo
from durable_agents.testing import InMemoryStore

DAY = 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(store_kind: str, clock: Clock):
    if store_kind == "memory":
        return InMemoryStore(clock=clock)
    from durable_agents.database.store import DjangoStore

    return DjangoStore(using="default" if store_kind == "postgres" else "sqlite")


def time_passes(store, clock: Clock, run_ids: list[str]) -> None:
    """``run_ids`` ended 30 days ago: the memory store's clock moves on; the database's
    rows are aged, as ``tests/support/pruning.age`` does."""
    if isinstance(store, InMemoryStore):
        clock.now += 30 * DAY
        return
    from durable_agents.models import Run

    Run.objects.using(store.using).filter(pk__in=run_ids).update(
        finished_at=store.now() - timedelta(days=30)
    )


def prune(store):
    return store.prune(finished_before=store.now() - timedelta(days=7), by="pruner")


def tree(stem: str, *, leaf: str = FINISHED) -> list[RunInfo]:
    """A root, its sub-run and the sub-run's own: three deep."""
    root = f"{stem}-{uuid.uuid4().hex[:8]}"
    middle, bottom = f"{root}/c1", f"{root}/c1/c2"
    return [
        RunInfo(run_id=root, agent="a", status=FINISHED),
        RunInfo(run_id=middle, agent="a", status=FINISHED, root_run_id=root, parent_run_id=root),
        RunInfo(run_id=bottom, agent="a", status=leaf, root_run_id=root, parent_run_id=middle),
    ]


def test_a_tree_goes_whole_only_when_every_run_in_it_ended_before_the_cutoff(store, clock):
    whole = tree("whole")
    unfinished = tree("unfinished", leaf=RUNNING)
    young = tree("young")[:2]
    old = [*whole, *unfinished, *young]
    for run in old:
        store.create_run(run)
    time_passes(store, clock, [r.run_id for r in old])
    # Its deepest run ended only now: the root alone would say the tree may go.
    late = RunInfo(
        run_id=f"{young[0].run_id}/c1/c2",
        agent="a",
        status=FINISHED,
        root_run_id=young[0].run_id,
        parent_run_id=young[1].run_id,
    )
    store.create_run(late)

    report = prune(store)

    assert sorted(report.pruned) == sorted(r.run_id for r in whole)
    assert report.kept == {
        unfinished[0].run_id: retention.KEPT_UNFINISHED,
        young[0].run_id: retention.KEPT_RECENT,
    }
    for run in [*unfinished, *young, late]:
        assert store.get_run(run.run_id) is not None
    for run in whole:
        assert store.get_run(run.run_id) is None and list(store.load(run.run_id)) == []
        with pytest.raises(RunPruned):
            store.create_run(run)
    assert prune(store).pruned == []


def test_a_tree_another_run_was_forked_from_stays_until_the_fork_is_gone(store, clock):
    source = tree("source")
    for run in source:
        store.create_run(run)
    fork = RunInfo(
        run_id=f"fork-{uuid.uuid4().hex[:8]}",
        agent="a",
        status=FINISHED,
        forked_from=source[1].run_id,
    )
    store.create_run(fork)
    time_passes(store, clock, [r.run_id for r in [*source, fork]])

    report = prune(store)

    # The fork goes (nothing names it), its source's tree stays in that pass.
    assert report.pruned == [fork.run_id]
    assert report.kept == {source[0].run_id: retention.KEPT_FORKED}
    assert sorted(prune(store).pruned) == sorted(r.run_id for r in source)
