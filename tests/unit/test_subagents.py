"""Sub-agents (``agent.as_tool()``): a call runs a child run ``<parent>/<call>`` of one
durable tree, driven inline; a child's pause is the tree's pause, deciding it resumes the tree,
cancel cascades, cycles and depth are refused (in-memory store, runs handed over inline)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash
from tests.support.trees import fork_tree, leaf_of, middle_of
from tests.support.wiring import wired


def ask(tool: str, text: str) -> scripted.Turn:
    return scripted.calls(scripted.call(tool, {"input": text}))


def tree(fired, prefix, *, gated=False, crash_in_leaf=False):
    """root -> middle -> leaf; the leaf sends (gated if asked) and counts each send."""

    @da.tool(requires_approval=gated, idempotent=not gated)
    def send(to: str) -> str:
        fired.append(("send", to))
        if crash_in_leaf and fired.count(("send", to)) == 1:
            raise Crash()
        return f"sent to {to}"

    leaf = da.Agent(
        f"{prefix}-leaf",
        ScriptedModel(
            [scripted.calls(scripted.call("send", {"to": "bob"})), scripted.text("leaf done")]
        ),
        "",
        [send],
    )
    middle = da.Agent(
        f"{prefix}-middle",
        ScriptedModel([ask(leaf.name, "send it"), scripted.text("middle done")]),
        "",
        [leaf.as_tool()],
    )
    root = da.Agent(
        f"{prefix}-root",
        ScriptedModel([ask(middle.name, "delegate"), scripted.text("root done")]),
        "",
        [middle.as_tool()],
    )
    return root, middle, leaf


def test_a_call_runs_a_child_run_and_returns_its_answer(store, fired):
    root, _middle, leaf = tree(fired, "sa-plain")
    result = root.run("r1", "go", store=store)
    assert result.answer == "root done"
    mid_id, leaf_id = "r1/call_1_1", "r1/call_1_1/call_1_1"
    mid, lf = store.get_run(mid_id), store.get_run(leaf_id)
    assert (mid.parent_run_id, mid.root_run_id, mid.status) == ("r1", "r1", "finished")
    assert (lf.parent_run_id, lf.root_run_id, lf.agent) == (mid_id, "r1", leaf.name)
    journal = Journal(store)
    start = journal.get(leaf_id, names.RUN_START)
    assert (start.get("parent"), start.get("root")) == (mid_id, "r1")
    assert journal.get("r1", names.child("call_1_1")).get("run_id") == mid_id
    tool = journal.get(mid_id, names.tool("call_1_1"))
    assert tool.get("result") == "leaf done"
    assert fired == [("send", "bob")]
    # Running the finished tree again replays it: no child step runs twice.
    assert root.run("r1", "go", store=store).answer == "root done"
    assert fired == [("send", "bob")]


def test_an_approval_at_the_bottom_pauses_the_tree_and_its_decision_resumes_it(store, fired):
    root, _, _ = tree(fired, "sa-gated", gated=True)
    with pytest.raises(da.ApprovalPending):
        root.run("r2", "go", store=store)
    leaf_id = "r2/call_1_1/call_1_1"
    assert store.get_run(leaf_id).status == "awaiting_approval"
    assert store.get_run("r2/call_1_1").status == "awaiting_approval"
    assert store.get_run("r2").status == "awaiting_approval"
    assert [r.run_id for r in store.list_approval_requests()] == [leaf_id]
    assert fired == []
    da.approve(leaf_id, "call_1_1", approved=True, by="ann", store=store)
    # The decision drove the leaf, whose end handed the middle over, whose end the root.
    assert store.get_run(leaf_id).status == "finished"
    assert store.get_run("r2").status == "finished"
    assert store.get_run("r2").answer == "root done"
    assert fired == [("send", "bob")]


def test_a_crash_inside_the_leaf_resumes_each_run_from_its_journal(store, clock, fired):
    root, _, _ = tree(fired, "sa-crash", crash_in_leaf=True)
    with pytest.raises(Crash):
        root.run("r3", "go", store=store)
    clock.advance(60)  # every lease in the tree expires
    assert root.run("r3", None, store=store).answer == "root done"
    # The idempotent send ran again (retry-safe); each model turn was generated once.
    assert fired == [("send", "bob"), ("send", "bob")]
    journal = Journal(store)
    for run_id in ("r3", "r3/call_1_1", "r3/call_1_1/call_1_1"):
        assert [r.name for r in journal.records(run_id)].count(names.model(1)) == 1


def test_a_parent_waits_for_a_child_driven_elsewhere(store, fired):
    root, _middle, _ = tree(fired, "sa-busy", gated=True)
    with pytest.raises(da.ApprovalPending):
        root.run("r4", "go", store=store)
    mid_id = "r4/call_1_1"
    held = store.acquire_lease(mid_id, "elsewhere", "tok", 30)
    assert held
    store.update_run("r4", {"status": "queued"})
    with pytest.raises(da.ChildPending) as paused:
        root.run("r4", None, store=store)
    assert paused.value.details["children"] == [mid_id]
    assert store.get_run("r4").status == "awaiting_input"
    store.release_lease(mid_id, "tok")
    da.approve(mid_id + "/call_1_1", "call_1_1", approved=True, by="ann", store=store)
    assert store.get_run("r4").status == "finished"
    assert fired == [("send", "bob")]


def test_cancel_of_a_parent_cancels_its_unfinished_descendants(store, fired):
    root, _, _ = tree(fired, "sa-cancel", gated=True)
    with pytest.raises(da.ApprovalPending):
        root.run("r5", "go", store=store)
    da.cancel("r5", by="ann", store=store)
    for run_id in ("r5", "r5/call_1_1", "r5/call_1_1/call_1_1"):
        assert store.get_run(run_id).status == "cancelled"
    request = store.get_approval_request("r5/call_1_1/call_1_1", "call_1_1")
    assert request.status == "withdrawn"
    assert fired == []


def test_an_agent_calling_itself_through_the_chain_is_a_coded_error(store):
    @da.tool(read_only=True)
    def noop() -> str:
        return "x"

    ping_model = ScriptedModel([ask("sa-pong", "hi"), scripted.text("ping done")])
    pong_model = ScriptedModel([ask("sa-ping", "hi"), scripted.text("pong done")])
    ping = da.Agent("sa-ping", ping_model, "", [noop])
    pong = da.Agent("sa-pong", pong_model, "", [ping.as_tool()])
    ping.tools[pong.name] = pong.as_tool()  # a cycle only a deploy could make
    assert ping.run("r6", "go", store=store).answer == "ping done"
    inner = Journal(store).get("r6/call_1_1", names.tool("call_1_1"))
    assert inner.get("is_error") and "subagent.cycle" in str(inner.get("result"))
    assert store.get_run("r6/call_1_1/call_1_1") is None


def test_the_depth_limit_is_a_coded_error(store, fired):
    root, _, _ = tree(fired, "sa-depth")
    with wired(subagent_depth=lambda: 1):
        assert root.run("r7", "go", store=store).answer == "root done"
    result = Journal(store).get("r7/call_1_1", names.tool("call_1_1"))
    assert result.get("is_error") and "subagent.depth" in str(result.get("result"))
    assert fired == []


def test_spend_rolls_up_into_the_root(store, fired):
    root, _, _ = tree(fired, "sa-spend")
    result = root.run("r8", "go", store=store)
    # Each scripted turn uses 15 tokens: leaf 2 turns, middle 2 (+ leaf), root 2 (+ middle).
    assert store.get_run("r8/call_1_1/call_1_1").spend["input_tokens"] == 20
    assert Journal(store).get("r8/call_1_1", names.RUN_COMPLETE).get("usage")["input_tokens"] == 40
    assert result.usage.total_tokens == 90 and result.spend.total_tokens == 90
    assert store.get_run("r8").usage["input_tokens"] == 60


def test_the_roots_token_budget_counts_its_descendants(store, fired):
    _, middle, _ = tree(fired, "sa-budget")
    root = da.Agent(
        "sa-budget-root2",
        ScriptedModel([ask(middle.name, "delegate"), scripted.text("root done")]),
        "",
        [middle.as_tool()],
        token_budget=50,  # root's own turn is 15; the tree below it spends 60
    )
    with pytest.raises(da.BudgetError) as failed:
        root.run("r9", "go", store=store)
    # The middle stopped before its second turn (the tree had spent 60 of the root's 50),
    # its call's error is in the root's journal, and the root stops too, counting it.
    assert failed.value.code == "budget.tokens" and "spent 60" in str(failed.value)
    assert store.get_run("r9").status == "failed"
    middle_row = store.get_run("r9/call_1_1")
    assert middle_row.status == "failed" and middle_row.last_error["code"] == "budget.tokens"
    result = Journal(store).get("r9", names.tool("call_1_1"))
    assert result.get("is_error") and "budget.tokens" in str(result.get("result"))
    assert fired == [("send", "bob")]


def test_a_roots_budget_stops_a_leaf_three_levels_down_before_its_next_effect(store):
    """The leaf's model calls check the root's budget, counted over the whole tree: the leaf
    stops before its second turn, its second charge never happens, and each level fails
    with ``budget.tokens`` in turn. (Before, the leaf ran to its end: one child run over.)"""
    fired: list = []
    root, _, _ = fork_tree("sa-budget3", fired, gated=False, token_budget=55)
    with pytest.raises(da.BudgetError) as failed:
        root.run("r9b", "go", store=store)
    # root 2 turns (30) + middle 1 (15) + leaf 1 (15) = 60 >= 55 before the leaf's turn 2.
    assert failed.value.code == "budget.tokens"
    assert fired == [("charge", leaf_of("r9b"))]
    leaf_row = store.get_run(leaf_of("r9b"))
    assert leaf_row.status == "failed" and leaf_row.last_error["code"] == "budget.tokens"
    assert "'r9b'" in leaf_row.last_error["message"]
    assert [store.get_run(r).status for r in ("r9b", middle_of("r9b"))] == ["failed"] * 2
    turns = [
        len([n for n in (r.name for r in Journal(store).records(run)) if n.startswith("model:")])
        for run in ("r9b", middle_of("r9b"), leaf_of("r9b"))
    ]
    assert turns == [2, 1, 1]


def test_the_roots_pause_names_the_run_that_waits(store, fired):
    root, _, _ = tree(fired, "sa-names", gated=True)
    with pytest.raises(da.ApprovalPending) as paused:
        root.run("r10", "go", store=store)
    details = paused.value.details
    assert details["paused_run_id"] == "r10/call_1_1/call_1_1"
    assert details["calls"] == ["call_1_1"] and details["children"] == ["r10/call_1_1"]


def test_a_sub_run_resumed_before_it_started_records_its_place_from_its_row(store, fired):
    # (Found by the simulator: the parent's driver died after the child's row was made and
    # before its run:start; recovery resumed the child on its own.)
    _, _, leaf = tree(fired, "sa-row")
    store.create_run(
        RunInfo(
            run_id="p/c",
            agent=leaf.name,
            input="errand",
            parent_run_id="p",
            root_run_id="p",
        )
    )
    assert da.resume("p/c", store=store).answer == "leaf done"
    start = Journal(store).get("p/c", names.RUN_START)
    assert (start.get("parent"), start.get("root")) == ("p", "p")


def test_pending_names_the_sub_run_a_parent_waits_on(store, fired):
    root, _, _ = tree(fired, "sa-pending", gated=True)
    with pytest.raises(da.ApprovalPending):
        root.run("r11", "go", store=store)
    by_run = {p.run_id: p for p in da.pending(store=store)}
    assert [(w.kind, w.name) for w in by_run["r11"].waits] == [("sub_run", "r11/call_1_1")]
    leaf = by_run["r11/call_1_1/call_1_1"]
    assert [(w.kind, w.call_id) for w in leaf.waits] == [("approval", "call_1_1")]


@pytest.mark.parametrize("status", ["cancelled", "compensated"])
def test_a_parent_paused_on_a_child_goes_on_once_the_child_ended_without_an_answer(store, status):
    """A child that ended cancelled, or compensated (a saga that aborted), has ended: the
    parent that paused on it is woken, not left waiting for an answer that never comes."""
    from durable_agents.engine.tree import children_done

    store.create_run(RunInfo("p/c1", agent="leaf", status="running"))
    assert not children_done(store, ["p/c1"])
    store.update_run("p/c1", {"status": status})
    assert children_done(store, ["p/c1"])


def test_ancestors_budgets_are_read_once_per_drive_of_a_sub_run_and_never_for_a_root(
    store, monkeypatch
):
    from durable_agents.engine import tree as tree_module

    calls: list[str] = []
    real = tree_module.ancestor_budgets

    def counted(store_, run_id, parent):
        calls.append(run_id)
        return real(store_, run_id, parent)

    monkeypatch.setattr(tree_module, "ancestor_budgets", counted)
    fired: list = []
    root, _, _ = fork_tree("sa-budget-reads", fired, gated=False, token_budget=10_000)
    assert root.run("r9c", "go", store=store).answer == "root done"
    # The leaf made 3 model calls and the middle 2: one read of their ancestors each.
    assert calls == [middle_of("r9c"), leaf_of("r9c")]
    alone = da.Agent(
        "sa-budget-alone", ScriptedModel([scripted.text("hi")]), "", [], token_budget=5
    )
    calls.clear()
    alone.run("r9d", "go", store=store)
    assert calls == []


def test_a_child_whose_final_write_falls_back_still_hands_its_parent_over(store, fired):
    """The child queued its paused parent before its one-write finish, which stored nothing
    (here: the store declined once); the turn and the end written one by one still hand
    that parent to a driver, though it is queued already."""
    root, _, _ = tree(fired, "sa-fallback", gated=True)
    with pytest.raises(da.ApprovalPending):
        root.run("r9", "go", store=store)
    leaf_id = "r9/call_1_1/call_1_1"
    real = store.finish_run_with
    declined: list[str] = []

    def decline_once(run_id, records, **kwargs):
        if run_id == leaf_id and not declined:
            declined.append(run_id)
            return None
        return real(run_id, records, **kwargs)

    store.finish_run_with = decline_once
    da.approve(leaf_id, "call_1_1", approved=True, by="ann", store=store)
    assert declined == [leaf_id]
    assert store.get_run(leaf_id).status == "finished"
    assert store.get_run("r9").answer == "root done"
    assert fired == [("send", "bob")]


def test_a_store_failure_starting_a_child_fails_the_parents_drive_for_a_retry(
    store, clock, fired, monkeypatch
):
    """The parent journals ``child:<call>``, then the store fails creating the child's row:
    no child exists to be retried, so the parent must not pause waiting for it (it would
    wait forever); its drive fails for a retry, and the retry starts the child (found by
    the simulator's failing store, issue 32)."""
    root, _, _ = tree(fired, "sa-blip")
    real = store.start_run
    failed: list[str] = []

    def start_run(run, *args, **kwargs):
        if run.run_id == "r9/call_1_1" and not failed:
            failed.append(run.run_id)
            raise da.StorageError("the database went away", code="storage.unavailable")
        return real(run, *args, **kwargs)

    monkeypatch.setattr(store, "start_run", start_run)
    with pytest.raises(da.StorageError):
        root.run("r9", "go", store=store)
    assert failed and store.get_run("r9/call_1_1") is None
    row = store.get_run("r9")
    assert row.status == "failed" and row.last_error["retryable"]
    clock.advance(60)
    assert root.run("r9", None, store=store).answer == "root done"
    assert fired == [("send", "bob")]
