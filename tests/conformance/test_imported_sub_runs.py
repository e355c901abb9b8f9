"""An import is nobody's sub-run (issue 41, item 4), on every store.

A run imported as evidence can hold the id a live parent's call gives its sub-run
(``<parent>/<call>``): before the parent journals the sub-run, or after (its driver died
right after the ``child:`` record, before the sub-run's row). Its row may even name the
parent as its own (an edited file says what it likes). Whatever path reaches the call
again — a drive, a resume, a fork, a cancel, a saga's rollback, a budget's count — the
parent never takes the import's answer, never stops, rolls back or forks it, and never
counts its spend; the call fails by name (``subagent.imported``). Effects are counted
outside the journal (``fired``). (A paused sub-run deleted and replaced by an import
cannot happen: a deleted run's id is spent.)"""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.runs import cancel, drive_quietly
from durable_agents.engine.journal import Journal
from durable_agents.engine.loop import drive
from durable_agents.engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from durable_agents.engine.ports import IMPORTED_INERT, IMPORTED_LIVE
from durable_agents.engine.records import decode, encode
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.doubles import Crash, hooks_at_points

CALL = "call_1_1"


@pytest.fixture
def wired(store):
    """Hand runs over inline, to this store."""
    with wiring.wired(dispatcher=lambda run_id: drive_quietly(run_id, store=store)):
        yield store


@pytest.fixture
def at_point(monkeypatch: pytest.MonkeyPatch):
    """``at_point(name, fn)``: run ``fn`` when a driver reaches the named point (once)."""
    return hooks_at_points(monkeypatch)


def new_id(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _say(text: str) -> ModelResponse:
    return ModelResponse(Message("assistant", text), Usage(10, 5), FINISH_STOP, "test", "payer")


def _calls(tool: str, args: dict, call_id: str) -> ModelResponse:
    message = Message("assistant", "", tool_calls=(ToolCall(call_id, tool, json.dumps(args)),))
    return ModelResponse(message, Usage(10, 5), FINISH_TOOL_CALLS, "test", "payer")


def tree(
    prefix: str, fired: list, *, gated: bool = False, saga: bool = False, budget: int | None = None
) -> tuple[da.Agent, da.Agent]:
    """``<prefix>-parent`` asks ``<prefix>-child`` who to pay (its call ``call_1_1``), then
    pays whoever the answer names; an error result: it answers without paying. The child
    books (undoably; gated if ``gated``), then answers ``bob``."""

    def unbook(args, result, ctx):
        fired.append(("unbook", ctx.run_id))
        return "unbooked"

    @da.tool(requires_approval=gated, compensate=unbook)
    def book(ctx: da.ToolContext) -> str:
        fired.append(("book", ctx.run_id))
        return "booked"

    @da.tool
    def pay(to: str, ctx: da.ToolContext) -> str:
        fired.append(("pay", ctx.run_id, to))
        return f"paid {to}"

    class Payer:
        model_id = f"{prefix}:payer"

        def generate(self, request: ModelRequest) -> ModelResponse:
            results = [m for m in request.messages if m.role == "tool"]
            if not results:
                return _calls(f"{prefix}-child", {"input": "who?"}, "call_1_1")
            if len(results) == 1:
                if results[0].is_error:
                    return _say("not paid")
                return _calls("pay", {"to": results[0].content}, "call_2_1")
            return _say("paid")

    child = da.Agent(
        f"{prefix}-child",
        ScriptedModel([scripted.calls(scripted.call("book", {})), scripted.text("bob")]),
        "Book, then say who to pay.",
        [book],
    )
    parent = da.Agent(
        f"{prefix}-parent",
        Payer(),
        "Ask who to pay, then pay them.",
        [child.as_tool(), pay],
        saga=saga,
        token_budget=budget,
    )
    return parent, child


def place_import(
    store, source: str, at: str, parent: str, *, live: bool = False, tokens: int | None = None
) -> None:
    """Write run ``source`` at ``at`` as an import writes it: its row (marked imported), its
    journal and its requests; as an edited file may say it, its row names ``parent`` as its
    parent, its answer is ``mallory``, and (``tokens``) it spent that much."""
    row = store.get_run(source)
    answer = "mallory" if row.answer is not None else None
    store.create_run(
        dataclasses.replace(
            row,
            run_id=at,
            imported=IMPORTED_LIVE if live else IMPORTED_INERT,
            parent_run_id=parent,
            root_run_id=parent,
            answer=answer,
        )
    )
    for e in store.load(source):
        data = e.data
        if e.name == names.RUN_COMPLETE:
            body = decode(data)
            body["answer"] = answer
            if tokens is not None:
                body["usage"] = body["spend"] = {"input_tokens": tokens, "output_tokens": 0}
            data = encode(body)
        store.insert(at, e.name, data)
    for request in store.list_approval_requests(status=None, run_id=source):
        store.save_approval_request(dataclasses.replace(request, run_id=at))


def foreign(parent: da.Agent, store) -> str:
    """A sub-run of ``parent``'s agent run elsewhere, to its end: the source of an import."""
    other = new_id("elsewhere")
    drive(parent, other, "go", store=store)
    return f"{other}/{CALL}"


def killed_after_child(parent: da.Agent, store, crash_at) -> str:
    """A run of ``parent`` whose driver died right after journaling its sub-run."""
    run = new_id("victim")
    crash_at(f"after-child:{run}/{CALL}")
    with pytest.raises(Crash):
        drive(parent, run, "go", store=store)
    assert Journal(store).get(run, names.child(CALL)) is not None
    assert store.get_run(f"{run}/{CALL}") is None
    return run


def untouched(store, at: str) -> tuple:
    row = store.get_run(at)
    records = [(e.name, e.data) for e in store.load(at)]
    requests = [(r.call_id, r.status) for r in store.list_approval_requests(status=None, run_id=at)]
    return row.status, row.answer, records, requests, store.get_lease(at)


def assert_refused(store, run: str, call: str = CALL) -> None:
    rec = Journal(store).get(run, names.tool(call))
    assert rec is not None and rec.get("is_error") is True
    text = json.dumps(rec.get("result"))
    assert "subagent.imported" in text and "mallory" not in text


def test_a_parent_never_takes_an_import_at_its_sub_runs_id_for_its_answer(wired):
    store, fired = wired, []
    parent, _ = tree(new_id("isr1"), fired)
    source = foreign(parent, store)
    fired.clear()
    run = new_id("victim")
    place_import(store, source, f"{run}/{CALL}", run)
    was = untouched(store, f"{run}/{CALL}")
    assert drive(parent, run, "go", store=store).answer == "not paid"
    assert fired == []  # nobody paid; the sub-run's booking never ran here
    assert_refused(store, run)
    assert Journal(store).get(run, names.child(CALL)) is None  # never named in its tree
    assert untouched(store, f"{run}/{CALL}") == was


def test_an_import_landing_between_the_parents_look_and_the_sub_runs_drive_is_refused(
    wired, at_point
):
    """The parent looked at the id (free), journaled the sub-run, and the import landed
    before the sub-run's drive read it: the drive refuses it, on the row it read."""
    store, fired = wired, []
    parent, _ = tree(new_id("isr9"), fired)
    source = foreign(parent, store)
    fired.clear()
    run = new_id("victim")
    at = f"{run}/{CALL}"
    at_point(f"after-child:{at}", lambda: place_import(store, source, at, run))
    assert drive(parent, run, "go", store=store).answer == "not paid"
    assert fired == []
    assert_refused(store, run)


def test_a_parent_made_here_never_takes_a_live_import_at_its_sub_runs_id(wired):
    store, fired = wired, []
    parent, _ = tree(new_id("isr2"), fired)
    source = foreign(parent, store)
    fired.clear()
    run = new_id("victim")
    place_import(store, source, f"{run}/{CALL}", run, live=True)
    assert drive(parent, run, "go", store=store).answer == "not paid"
    assert fired == []
    assert_refused(store, run)


def test_a_call_run_again_after_its_driver_died_never_adopts_an_import_put_there(wired, crash_at):
    store, fired = wired, []
    parent, _ = tree(new_id("isr3"), fired)
    source = foreign(parent, store)
    fired.clear()
    run = killed_after_child(parent, store, crash_at)
    place_import(store, source, f"{run}/{CALL}", run)
    was = untouched(store, f"{run}/{CALL}")
    # A fork made before anyone drives it again references the journaled sub-run.
    fork_id = da.fork(run, from_step=1, store=store)
    assert da.resume(fork_id, store=store).answer == "not paid"
    assert_refused(store, fork_id)
    assert da.resume(run, store=store).answer == "not paid"
    assert_refused(store, run)
    assert fired == []
    assert untouched(store, f"{run}/{CALL}") == was


def test_a_cancel_of_a_parent_leaves_an_import_at_its_sub_runs_id_alone(wired, crash_at):
    store, fired = wired, []
    parent, _ = tree(new_id("isr5"), fired, gated=True)
    other = new_id("elsewhere")
    with pytest.raises(da.ApprovalPending):
        drive(parent, other, "go", store=store)  # its sub-run awaits a decision
    run = killed_after_child(parent, store, crash_at)
    place_import(store, f"{other}/{CALL}", f"{run}/{CALL}", run)
    was = untouched(store, f"{run}/{CALL}")
    cancel(run, by="ann", store=store)
    assert store.get_run(run).status == "cancelled"
    assert untouched(store, f"{run}/{CALL}") == was
    assert fired == []


def test_a_saga_rolling_back_never_rolls_back_an_import_at_its_sub_runs_id(wired, crash_at):
    store, fired = wired, []
    parent, _ = tree(new_id("isr6"), fired, saga=True)
    source = foreign(parent, store)
    fired.clear()
    run = killed_after_child(parent, store, crash_at)
    place_import(store, source, f"{run}/{CALL}", run)
    was = untouched(store, f"{run}/{CALL}")
    cancel(run, by="ann", compensate=True, store=store)
    assert store.get_run(run).status == "compensated"
    assert fired == []  # nothing of the import's is undone here: none of it ran here
    assert untouched(store, f"{run}/{CALL}") == was


def test_a_fork_never_forks_an_unfinished_import_at_its_sources_sub_run_id(wired, crash_at):
    store, fired = wired, []
    parent, _ = tree(new_id("isr7"), fired, gated=True)
    other = new_id("elsewhere")
    with pytest.raises(da.ApprovalPending):
        drive(parent, other, "go", store=store)
    run = killed_after_child(parent, store, crash_at)
    place_import(store, f"{other}/{CALL}", f"{run}/{CALL}", run)
    was = untouched(store, f"{run}/{CALL}")
    fork_id = da.fork(run, from_step=1, store=store)
    assert store.get_run(f"{fork_id}/{CALL}") is None  # the import was not forked
    assert da.resume(fork_id, store=store).answer == "not paid"
    assert_refused(store, fork_id)
    assert untouched(store, f"{run}/{CALL}") == was


def test_a_parent_never_counts_the_spend_of_an_import_at_its_sub_runs_id(wired, crash_at):
    store, fired = wired, []
    parent, _ = tree(new_id("isr8"), fired, budget=1000)
    source = foreign(parent, store)
    fired.clear()
    run = killed_after_child(parent, store, crash_at)
    place_import(store, source, f"{run}/{CALL}", run, tokens=1_000_000)
    result = da.resume(run, store=store)
    assert result.answer == "not paid"
    assert result.spend.total_tokens < 1000
    assert_refused(store, run)
