"""Trees of sub-agents on every store (InMemoryStore, PostgreSQL, SQLite): a fork of a parent
paused on its unfinished child forks the child under its own id and never drives the
source's; a fork references a child that had finished; the admin's and the tree helpers'
view of both; and a root's token budget stopping a leaf three levels down. Effects are
counted outside the journal (``fired``)."""

from __future__ import annotations

import uuid

import pytest

import durable_agents as da
from durable_agents.engine import names, tree
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.journal import Journal
from tests.support import wiring
from tests.support.trees import MIDDLE_CALL, fork_tree, leaf_of, middle_of

SEND_CALL = "call_2_1"  # the leaf's gated receipt


@pytest.fixture
def wired(store):
    """Hand runs over inline, to this store (not the settings' default database)."""
    with wiring.wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        halt_min_age=lambda: 0.0,
    ):
        yield store


def new_id(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def test_a_fork_of_a_parent_waiting_on_its_child_gets_a_child_of_its_own(wired):
    store, fired = wired, []
    root, _, _ = fork_tree("ctf-open", fired)
    source = new_id("ctf")
    with pytest.raises(da.ApprovalPending):
        root.run(source, "go", store=store)
    before = {r: len(Journal(store).records(r)) for r in (source, leaf_of(source))}
    fork = da.fork(source, 2, store=store)
    assert tree.children_of(store, fork) == [middle_of(fork)]
    assert store.get_run(leaf_of(fork)).forked_from == leaf_of(source)
    with pytest.raises(da.ApprovalPending):
        da.resume(fork, store=store)
    da.approve(leaf_of(fork), SEND_CALL, approved=True, by="ann", store=store)
    assert store.get_run(fork).status == "finished"
    assert {r: len(Journal(store).records(r)) for r in before} == before
    assert store.get_run(source).status == "awaiting_approval"
    assert fired == [("charge", leaf_of(source)), ("send", leaf_of(fork))]
    comparison = da.compare(source, fork, store=store)
    assert comparison.diverged_at is None or comparison.diverged_at >= 2


def test_a_fork_references_a_finished_child_and_never_runs_it(wired):
    store, fired = wired, []
    root, _, _ = fork_tree("ctf-done", fired, gated=False)
    source = new_id("ctf")
    root.run(source, "go", store=store)
    fork = da.fork(source, 2, da.Patch(append_user="again"), store=store)
    assert Journal(store).get(fork, names.child(MIDDLE_CALL)).get("run_id") == middle_of(source)
    fired.clear()
    assert da.resume(fork, store=store).answer == "root done"
    assert fired == [] and store.get_run(middle_of(fork)) is None


def test_a_roots_budget_stops_the_leaf_of_a_three_level_tree(wired):
    store, fired = wired, []
    root, _, _ = fork_tree("ctf-budget", fired, gated=False, token_budget=55)
    run = new_id("ctf")
    with pytest.raises(da.BudgetError):
        root.run(run, "go", store=store)
    assert fired == [("charge", leaf_of(run))]
    for run_id in (run, middle_of(run), leaf_of(run)):
        row = store.get_run(run_id)
        assert row.status == "failed" and row.last_error["code"] == "budget.tokens"


def test_a_fork_taken_while_the_leaf_charges_halts_its_copy_on_the_charge(wired):
    store, fired, forks = wired, [], []
    source = new_id("ctf")

    def fork_now(ctx: da.ToolContext) -> None:
        forks.append(da.fork(source, 2, store=store))  # the leaf is claimed and charging

    root, _, _ = fork_tree("ctf-busy", fired, gated=False, during_charge=fork_now)
    assert root.run(source, "go", store=store).answer == "root done"
    (fork,) = forks
    leaf = leaf_of(fork)
    assert store.get_run(leaf).status == "halted"
    with pytest.raises(da.OutcomeUnknown):
        da.resume(fork, store=store)
    da.resolve_halt(leaf, "call_1_1", result="charged", evidence={"seen": 1}, by="ann", store=store)
    assert store.get_run(fork).status == "finished"
    assert [f for f in fired if f[0] == "charge"] == [("charge", leaf_of(source))]
