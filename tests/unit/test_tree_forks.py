"""Forks of runs in a tree of sub-agents (in-memory store, runs handed over inline): a fork
before a child's call runs its own child; a child that had ended is referenced, never run
again; an unfinished child is forked under the fork's derived id, so nothing the source's
child did is done again and the source's tree is never driven by the fork's. Side effects
are counted in ``fired``, outside the journal."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import names, tree
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from tests.support.trees import LEAF_CALL, MIDDLE_CALL, fork_tree, leaf_of, middle_of
from tests.support.wiring import wired

SEND_CALL = "call_2_1"  # the leaf's gated receipt


def statuses(store, *run_ids: str) -> list[str]:
    return [store.get_run(r).status for r in run_ids]


def journal_names(store, run_id: str) -> list[str]:
    return [r.name for r in Journal(store).records(run_id)]


def paused_tree(store, fired, prefix: str, run_id: str):
    """The tree paused at the bottom: the leaf charged, its receipt awaits approval."""
    agents = fork_tree(prefix, fired)
    with pytest.raises(da.ApprovalPending):
        agents[0].run(run_id, "go", store=store)
    assert fired == [("charge", leaf_of(run_id))]
    return agents


def test_a_fork_before_the_child_call_runs_a_child_of_its_own(store, fired):
    root, _, _ = fork_tree("tf-before", fired, gated=False)
    assert root.run("s1", "go", store=store).answer == "root done"
    before = {r: journal_names(store, r) for r in ("s1", middle_of("s1"), leaf_of("s1"))}
    fork = da.fork("s1", 1, store=store)  # after the lookup, before the call
    assert not [n for n in journal_names(store, fork) if n.startswith(names.CHILD)]
    assert da.resume(fork, store=store).answer == "root done"
    # The fork's call started its own child, which ran its leaf: one charge per tree.
    assert tree.children_of(store, fork) == [middle_of(fork)]
    assert store.get_run(middle_of(fork)).parent_run_id == fork
    assert store.get_run(leaf_of(fork)).root_run_id == fork
    assert sorted(fired) == sorted(
        [
            ("charge", leaf_of("s1")),
            ("send", leaf_of("s1")),
            ("charge", leaf_of(fork)),
            ("send", leaf_of(fork)),
        ]
    )
    # The source's tree is untouched.
    assert {r: journal_names(store, r) for r in before} == before
    comparison = da.compare("s1", fork, store=store)
    assert len(comparison.a) == len(comparison.b) == 3


def test_a_child_finished_before_the_fork_point_is_referenced_not_run_again(store, fired):
    root, _, _ = fork_tree("tf-done", fired, gated=False)
    source = root.run("s2", "go", store=store)
    fork = da.fork("s2", 2, da.Patch(append_user="say it again"), store=store)
    record = Journal(store).get(fork, names.child(MIDDLE_CALL))
    assert record.get("run_id") == middle_of("s2")
    assert tree.children_of(store, fork) == [middle_of("s2")]
    assert store.get_run(middle_of(fork)) is None
    fired.clear()
    result = da.resume(fork, store=store)
    assert result.answer == "root done" and fired == []
    # The fork's spend counts the referenced child's (75 tokens: middle 2 turns, leaf 3), as
    # it counts its two copied turns (30), with its own new turn (15): the source's 120.
    assert result.spend.total_tokens == 120 == source.spend.total_tokens
    assert da.compare("s2", fork, store=store).a


def test_a_child_that_ended_without_its_parent_knowing_is_referenced_for_its_error(store, fired):
    paused_tree(store, fired, "tf-ended", "s3")
    with wired(dispatcher=lambda run_id: None):  # the parent's hand-over is lost
        da.cancel(middle_of("s3"), by="ann", store=store)
    assert Journal(store).get("s3", names.tool(MIDDLE_CALL)) is None
    fork = da.fork("s3", 2, store=store)
    assert tree.children_of(store, fork) == [middle_of("s3")]
    # The fork's call runs again and reads the referenced child's end; nothing is driven.
    assert da.resume(fork, store=store).answer == "root done"
    result = Journal(store).get(fork, names.tool(MIDDLE_CALL))
    assert result.get("is_error") and "subagent.cancelled" in str(result.get("result"))
    assert store.get_run(middle_of(fork)) is None
    assert store.get_run(middle_of("s3")).status == "cancelled"
    assert fired == [("charge", leaf_of("s3"))]


def test_an_unfinished_child_is_forked_under_the_forks_id(store, fired):
    paused_tree(store, fired, "tf-open", "s4")
    source_names = {r: journal_names(store, r) for r in ("s4", middle_of("s4"), leaf_of("s4"))}
    fork = da.fork("s4", 2, store=store)  # exactly the child's call step
    mid, leaf = middle_of(fork), leaf_of(fork)
    assert Journal(store).get(fork, names.child(MIDDLE_CALL)).get("run_id") == mid
    assert store.get_run(mid).forked_from == middle_of("s4")
    assert store.get_run(leaf).forked_from == leaf_of("s4")
    assert (store.get_run(mid).parent_run_id, store.get_run(mid).root_run_id) == (fork, fork)
    assert (store.get_run(leaf).parent_run_id, store.get_run(leaf).root_run_id) == (mid, fork)
    start = Journal(store).get(leaf, names.RUN_START)
    assert (start.get("parent"), start.get("root")) == (mid, fork)
    # The fork's sub-runs wait for their parent to drive them; recovery leaves them alone.
    assert statuses(store, fork, mid, leaf) == ["queued", "awaiting_input", "awaiting_input"]
    why = {p.run_id: p.why for p in da.pending(store=store)}
    assert why[leaf].startswith("a fork's own sub-run") and repr(mid) in why[leaf]
    with pytest.raises(da.ApprovalPending) as paused:
        da.resume(fork, store=store)
    assert paused.value.details["paused_run_id"] == leaf
    # The fork's leaf did not charge again: its charge's result was copied.
    assert fired == [("charge", leaf_of("s4"))]
    assert {r.run_id for r in store.list_approval_requests(status="pending")} == {
        leaf_of("s4"),
        leaf,
    }
    da.approve(leaf, SEND_CALL, approved=True, by="ann", store=store)
    assert statuses(store, fork, mid, leaf) == ["finished"] * 3
    assert fired == [("charge", leaf_of("s4")), ("send", leaf)]
    # The source's tree was never driven by the fork's: it still waits, as it was.
    assert {r: journal_names(store, r) for r in source_names} == source_names
    assert statuses(store, "s4", middle_of("s4"), leaf_of("s4")) == ["awaiting_approval"] * 3
    da.approve(leaf_of("s4"), SEND_CALL, approved=True, by="ann", store=store)
    assert store.get_run("s4").status == "finished"
    assert fired.count(("charge", leaf_of("s4"))) == 1 and len(fired) == 3


def test_a_fork_of_a_fork_forks_the_forked_children(store, fired):
    paused_tree(store, fired, "tf-twice", "s5")
    first = da.fork("s5", 2, store=store)
    second = da.fork(first, 2, store=store)
    assert store.get_run(middle_of(second)).forked_from == middle_of(first)
    assert store.get_run(leaf_of(second)).forked_from == leaf_of(first)
    with pytest.raises(da.ApprovalPending):
        da.resume(second, store=store)
    da.approve(leaf_of(second), SEND_CALL, approved=True, by="ann", store=store)
    assert store.get_run(second).status == "finished"
    assert store.get_run(first).status == "queued"  # never driven
    assert statuses(store, middle_of(first), leaf_of(first)) == ["awaiting_input"] * 2
    assert fired == [("charge", leaf_of("s5")), ("send", leaf_of(second))]


def test_a_fork_taken_while_the_child_is_being_driven_halts_on_its_effect_in_flight(store, fired):
    forks: list[str] = []

    def fork_now(ctx: da.ToolContext) -> None:
        # The leaf is claimed and charging; its parents wait on it.
        forks.append(da.fork("s6", 2, store=store))

    root, _, _ = fork_tree("tf-busy", fired, gated=False, during_charge=fork_now)
    assert root.run("s6", "go", store=store).answer == "root done"
    (fork,) = forks
    leaf = leaf_of(fork)
    # The snapshot had the charge claimed and no outcome: unknown in the fork, never guessed.
    assert store.get_run(leaf).status == "halted"
    assert [h.op_id for h in store.list_halts(run_id=leaf)] == [LEAF_CALL]
    with pytest.raises(da.OutcomeUnknown):
        da.resume(fork, store=store)
    assert fired.count(("charge", leaf)) == 0
    da.resolve_halt(
        leaf, LEAF_CALL, result="charged", evidence={"seen": "card"}, by="ann", store=store
    )
    assert store.get_run(fork).status == "finished"
    assert [f for f in fired if f[0] == "charge"] == [("charge", leaf_of("s6"))]


def test_a_fork_of_a_sub_run_is_top_level_and_never_hands_the_source_parent_over(store, fired):
    paused_tree(store, fired, "tf-sub", "s7")
    fork = da.fork(middle_of("s7"), 1, store=store)
    assert store.get_run(fork).parent_run_id is None
    start = Journal(store).get(fork, names.RUN_START)
    assert start.get("parent") is None and start.get("root") is None
    assert store.get_run(f"{fork}/{LEAF_CALL}").root_run_id == fork
    with pytest.raises(da.ApprovalPending):
        da.resume(fork, store=store)
    da.approve(f"{fork}/{LEAF_CALL}", SEND_CALL, approved=True, by="ann", store=store)
    assert store.get_run(fork).status == "finished"
    assert statuses(store, "s7", middle_of("s7")) == ["awaiting_approval"] * 2


def test_a_referenced_child_survives_its_source_being_cancelled(store, fired):
    @da.tool(requires_approval=True)
    def later(note: str) -> str:
        fired.append(("later", note))
        return "ok"

    root, middle, _ = fork_tree("tf-cancel", fired, gated=False)
    # A root whose call after the child's awaits approval: unfinished, with a finished child.
    root2 = da.Agent(
        "tf-cancel-root2",
        scripted.ScriptedModel(
            [
                scripted.calls(scripted.call("lookup", {"city": "x"})),
                scripted.calls(scripted.call(middle.name, {"input": "plan"})),
                scripted.calls(scripted.call("later", {"note": "n"})),
                scripted.text("root done"),
            ]
        ),
        "",
        [root.tools["lookup"], middle.as_tool(), later],
    )
    with pytest.raises(da.ApprovalPending):
        root2.run("s8", "go", store=store)
    fork = da.fork("s8", 2, store=store)
    assert tree.children_of(store, fork) == [middle_of("s8")]
    da.cancel("s8", by="ann", store=store)
    assert store.get_run(middle_of("s8")).status == "finished"  # ended: not cancelled
    with pytest.raises(da.ApprovalPending):
        da.resume(fork, store=store)
    da.cancel(fork, by="ann", store=store)  # the fork's cancel leaves its source's child be
    assert store.get_run(middle_of("s8")).status == "finished"
    assert fired.count(("charge", leaf_of("s8"))) == 1 and ("later", "n") not in fired


def test_a_fork_patching_the_result_of_an_unfinished_childs_call_leaves_the_child_alone(
    store, fired
):
    paused_tree(store, fired, "tf-patch", "s9")
    fork = da.fork("s9", 2, da.Patch(tool_results={MIDDLE_CALL: "planned by hand"}), store=store)
    assert tree.children_of(store, fork) == []
    assert da.resume(fork, store=store).answer == "root done"
    assert store.get_run(middle_of(fork)) is None
    assert fired == [("charge", leaf_of("s9"))]
    assert statuses(store, "s9", middle_of("s9"), leaf_of("s9")) == ["awaiting_approval"] * 3


def test_cancelling_a_fork_cancels_its_own_sub_runs_and_none_of_its_sources(store, fired):
    paused_tree(store, fired, "tf-cancel-fork", "s10")
    fork = da.fork("s10", 2, store=store)
    da.cancel(fork, by="ann", store=store)
    assert statuses(store, fork, middle_of(fork), leaf_of(fork)) == ["cancelled"] * 3
    assert statuses(store, "s10", middle_of("s10"), leaf_of("s10")) == ["awaiting_approval"] * 3
    da.approve(leaf_of("s10"), SEND_CALL, approved=True, by="ann", store=store)
    assert store.get_run("s10").status == "finished"
    assert fired == [("charge", leaf_of("s10")), ("send", leaf_of("s10"))]
