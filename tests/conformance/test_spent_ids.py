"""Spent ids on every store (``engine.spent``, docs/retention.md "Spent ids"): a run id this
site held and deleted is never taken again, whatever would create a row under it — a start,
a fork (named or named automatically), a session's turn or journal, a journal write, a
parent's sub-run. Effects are counted outside the journal (``fired``)."""

from __future__ import annotations

import uuid

import pytest

import durable_agents as da
from durable_agents.engine.commands.runs import delete, drive_quietly
from durable_agents.engine.errors import RunIdSpent
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import RUNNING, HaltInfo, RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.trees import LEAF_CALL, fork_tree, leaf_of, middle_of

RECORDS = [("@journal", '{"kind":"header"}'), ("run:start", '{"kind":"start","input":"hi"}')]


@pytest.fixture
def wired(store):
    with wiring.wired(dispatcher=lambda run_id: drive_quietly(run_id, store=store)):
        yield store


def new_id(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def refund_agent(fired: list, name: str = "spent-refund") -> da.Agent:
    @da.tool
    def refund(order: str, ctx: da.ToolContext) -> str:
        fired.append((order, ctx.run_id))
        return "refunded"

    script = [scripted.calls(scripted.call("refund", {"order": "o-7"})), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [refund])


def test_a_deleted_runs_id_is_refused_by_every_write_that_creates_a_row(store):
    run_id = new_id("spent")
    store.create_run(RunInfo(run_id=run_id, agent="a"))
    store.delete_run(run_id)
    run = RunInfo(run_id=run_id, agent="a", status=RUNNING)
    with pytest.raises(RunIdSpent) as refused:
        store.create_run(run)
    assert refused.value.code == "run.spent"
    with pytest.raises(RunIdSpent):
        store.start_run(run, holder="w", token="t", ttl=30, records=RECORDS)
    with pytest.raises(RunIdSpent):
        store.start_or_load(run, holder="w", token="t", ttl=30, records=RECORDS)
    with pytest.raises(RunIdSpent):
        Journal(store).write(
            run_id, "step:x", {"kind": "step", "v": 1}
        )  # no journal-only row comes back
    assert store.get_run(run_id) is None and list(store.load(run_id)) == []
    assert store.get_lease(run_id) is None
    # An id that was never held is free, and a run that exists is reported as existing.
    other = new_id("free")
    assert store.create_run(RunInfo(run_id=other, agent="a")) is True
    assert store.create_run(RunInfo(run_id=other, agent="a")) is False


def test_a_run_started_again_under_a_deleted_id_fires_nothing(wired):
    store, fired = wired, []
    agent = refund_agent(fired)
    run_id = new_id("refund")
    assert agent.run(run_id, "refund o-7", store=store).answer == "done"
    delete(run_id, by="ann", store=store)
    for again in (
        lambda: agent.run(run_id, "refund o-7", store=store),
        lambda: agent.start("refund o-7", run_id=run_id, store=store),
    ):
        with pytest.raises(RunIdSpent):
            again()
    assert fired == [("o-7", run_id)]
    assert store.get_run(run_id) is None


def test_forks_never_take_a_deleted_runs_id(wired):
    store, fired = wired, []
    source = new_id("src")
    refund_agent(fired).run(source, "refund o-7", store=store)
    spent = new_id("gone")
    store.create_run(RunInfo(run_id=spent, agent="a"))
    store.delete_run(spent)
    with pytest.raises(RunIdSpent):
        da.fork(source, 1, new_run_id=spent, store=store)
    assert store.get_run(spent) is None
    first = da.fork(source, 1, store=store)
    assert first == f"{source}.fork-1"
    delete(first, by="ann", store=store)
    # The automatic name goes on past a deleted fork's: fork-1 is spent.
    assert da.fork(source, 1, store=store) == f"{source}.fork-2"
    assert store.get_run(first) is None


def test_a_deleted_sessions_ids_are_spent(wired):
    store, fired = wired, []
    agent = refund_agent(fired, "spent-chat")
    chat = f"chat-{uuid.uuid4().hex[:8]}"
    session = agent.session(chat, store=store)
    session.send("refund o-7")
    turn = f"{chat}>turn/1"
    delete(f"{chat}>session", by="ann", store=store)
    delete(turn, by="ann", store=store)
    # A new journal would number its turns from 1 again, and take the deleted turn's id.
    for again in (lambda: session.send("refund o-7"), lambda: session.send_once("d-1", "hi")):
        with pytest.raises(RunIdSpent):
            again()
    assert fired == [("o-7", turn)]
    # A fork of a session never takes a deleted fork's name either.
    kept = agent.session(f"chat-{uuid.uuid4().hex[:8]}", store=store)
    kept.send("refund o-7")
    first = kept.fork(1)
    delete(first.journal_id, by="ann", store=store)
    assert kept.fork(1).session_id == f"{kept.session_id}-fork-2"


def test_a_parent_never_starts_a_deleted_sub_run_again(wired):
    """The operator deletes a paused leaf: the parent, resumed, must not start it afresh
    (its charge would fire again); its call fails, naming the spent id, and the model is
    told so."""
    store, fired = wired, []
    root, _, _ = fork_tree(new_id("spent-tree"), fired)
    run = new_id("tree")
    with pytest.raises(da.ApprovalPending):
        root.run(run, "go", store=store)
    assert fired == [("charge", leaf_of(run))]
    delete(leaf_of(run), by="ann", store=store)
    da.resume(middle_of(run), store=store)
    assert fired == [("charge", leaf_of(run))]
    assert store.get_run(leaf_of(run)) is None
    result = Journal(store).get(middle_of(run), f"tool:{LEAF_CALL}")
    assert result.get("is_error") is True and "run.spent" in str(result.get("result"))


def test_a_deleted_run_takes_its_requests_decisions_and_halts_with_it(wired):
    """``delete_run`` on every store: nothing of the run is left to decide or resolve."""
    store, fired = wired, []
    agent = gated_agent(fired)
    run_id = new_id("gone")
    with pytest.raises(da.ApprovalPending):
        agent.run(run_id, "refund o-7", store=store)
    [request] = store.list_approval_requests(run_id=run_id)
    store.save_halt(
        HaltInfo(run_id=run_id, op_id="c9", tool_name="refund", arguments={}, attempt="a1")
    )
    delete(run_id, by="ann", store=store)
    assert store.list_approval_requests(run_id=run_id) == []
    assert store.get_approval_request(run_id, request.call_id) is None
    assert store.list_decisions(run_id, request.call_id) == []
    assert store.list_halts(run_id=run_id, status=None) == []


def gated_agent(fired: list) -> da.Agent:
    @da.tool(requires_approval=True)
    def refund(order: str, ctx: da.ToolContext) -> str:
        fired.append((order, ctx.run_id))
        return "refunded"

    script = [scripted.calls(scripted.call("refund", {"order": "o-7"})), scripted.text("done")]
    return da.Agent("spent-gated", ScriptedModel(script), "", [refund])


def test_a_deleted_run_takes_the_runs_below_it_with_it(wired):
    """Deleting a root deletes its sub-runs and theirs, deepest first, and spends their ids:
    left behind, the leaf would wait for a decision for a parent that is gone, and fire its
    effect for nobody once approved (found by the simulator: a fork's tree deleted while its
    copied leaf waited). The log row names what went with it."""
    store, fired = wired, []
    root, _, _ = fork_tree(new_id("gone-tree"), fired)
    run = new_id("tree")
    with pytest.raises(da.ApprovalPending):
        root.run(run, "go", store=store)
    [request] = store.list_approval_requests(run_id=leaf_of(run))
    assert delete(run, by="ann", store=store) == [middle_of(run), leaf_of(run)]
    for gone in (run, middle_of(run), leaf_of(run)):
        assert store.get_run(gone) is None
        with pytest.raises(RunIdSpent):
            store.create_run(RunInfo(run_id=gone, agent="a"))
    assert store.list_approval_requests(run_id=leaf_of(run)) == []
    with pytest.raises(da.DurableAgentsError):
        da.approve(leaf_of(run), request.call_id, True, by="bob", store=store)
    assert fired == [("charge", leaf_of(run))]
    [logged] = [a for a in store.list_actions(run_id=run) if a.action == "delete"]
    assert logged.payload["sub_runs"] == [middle_of(run), leaf_of(run)]
