"""Long MCP calls: tools a real server runs as tasks (``tests/support/mcp_task_server.py``,
streamable HTTP), and a slow plain call that reports progress. The task id is journaled
before any wait; a driver that dies while polling is resumed by polling the same task, and
the server counts one call. Effects are counted by the server, in a file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable_agents as da
from durable_agents.admin.readable import origin_of
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.mcp import tasks
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash, crash_points
from tests.support.mcp_servers import effects
from tests.support.mcp_task_servers import TaskServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def task_effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-tasks") / "effects.jsonl"


@pytest.fixture(scope="module")
def flaky_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-flaky") / "flaky"


@pytest.fixture(scope="module")
def task_server(task_effects: Path, flaky_file: Path) -> Iterator[TaskServer]:
    server = TaskServer(
        task_effects,
        DA_MCP_TASK_SECONDS="1",
        DA_MCP_POLL_MS="100",
        DA_MCP_FLAKY=str(flaky_file),
    )
    server.start()
    yield server
    server.kill()


def agent(name, tools, *turns):
    return da.Agent(name, ScriptedModel([*turns, scripted.text("done")]), "Use the tools.", tools)


def records(store, run_id, prefix):
    return [r for r in Journal(store).records(run_id) if r.name.startswith(prefix)]


def test_a_task_tool_runs_as_a_task_its_id_journaled_before_its_result(
    store, task_server, task_effects
):
    ledger = task_server.server("ledger")
    try:
        a = agent(
            "mcp-task",
            [ledger],
            scripted.calls(scripted.call("ledger__transfer", {"account": "t1", "cents": 7})),
        )
        tool = a.tools["ledger__transfer"]
        assert tool.as_task and tool.origin["task_support"] == "required"
        assert not tool.safety.retry_safe  # untrusted: a side effect
        assert not a.tools["ledger__crunch"].as_task
        assert origin_of(tool).endswith(
            "; the server runs it as a task (its id is journaled; a resume polls it)"
        )
        assert "as a task" not in origin_of(a.tools["ledger__crunch"])
        assert a.run("t-run", "move", store=store).answer == "done"
        journal = Journal(store)
        handle = journal.get("t-run", names.handle("call_1_1"))
        result = journal.get("t-run", names.tool("call_1_1"))
        attempt = journal.get("t-run", names.attempt("call_1_1", 1))
        assert attempt.seq < handle.seq < result.seq  # claimed, then the id, then the result
        task_id = handle.get("handle")["task_id"]
        assert handle.get("handle")["kind"] == tasks.KIND
        assert not result.get("is_error")
        assert result.get("result")["structuredContent"]["task"] == task_id
        fired = [e for e in effects(task_effects, "transfer") if e["account"] == "t1"]
        assert [e["task_id"] for e in fired] == [task_id]
        # The task's status as it was polled is noted for people following the run.
        notes = records(store, "t-run", names.PROGRESS)
        assert notes and all(n.get("task") == task_id for n in notes)
    finally:
        ledger.close()


def test_a_driver_that_dies_while_polling_is_resumed_by_polling_the_same_task(
    store, task_server, task_effects, monkeypatch
):
    crash_at = crash_points(monkeypatch)
    ledger = task_server.server("ledger-crash")
    try:
        a = agent(
            "mcp-task-crash",
            [ledger],
            scripted.calls(scripted.call("ledger-crash__transfer", {"account": "k1", "cents": 3})),
        )
        crash_at("mcp-task-polled:call_1_1")
        with pytest.raises(Crash):
            a.run("k-run", "move", store=store)
        journal = Journal(store)
        handle = journal.get("k-run", names.handle("call_1_1"))
        assert handle is not None and journal.get("k-run", names.tool("call_1_1")) is None
        store._clock.advance(60)  # the dead driver's lease runs out
        assert da.resume("k-run", store=store).answer == "done"
        result = journal.get("k-run", names.tool("call_1_1")).get("result")
        task_id = handle.get("handle")["task_id"]
        assert result["structuredContent"]["task"] == task_id
        fired = [e for e in effects(task_effects, "transfer") if e["account"] == "k1"]
        assert len(fired) == 1  # tools/call was sent once; the resume only polled
        assert store.list_halts(run_id="k-run") == []
    finally:
        ledger.close()


def test_a_read_only_task_is_polled_again_too_never_called_twice(
    store, task_server, task_effects, monkeypatch
):
    crash_at = crash_points(monkeypatch)
    ledger = task_server.server(
        "ledger-ro", tools={"audit": da.mcp.ToolOptions(safety="read_only")}
    )
    try:
        a = agent(
            "mcp-task-ro",
            [ledger],
            scripted.calls(scripted.call("ledger-ro__audit", {"account": "r1"})),
        )
        crash_at("mcp-task-kept:call_1_1")
        with pytest.raises(Crash):
            a.run("ro-run", "audit", store=store)
        store._clock.advance(60)
        assert da.resume("ro-run", store=store).answer == "done"
        assert len([e for e in effects(task_effects, "audit") if e["account"] == "r1"]) == 1
    finally:
        ledger.close()


def test_a_failed_task_is_an_error_result_the_model_reads(store, task_server):
    ledger = task_server.server("ledger-doomed")
    try:
        a = agent(
            "mcp-task-doomed",
            [ledger],
            scripted.calls(scripted.call("ledger-doomed__doomed", {"account": "f1"})),
        )
        assert a.run("f-run", "try", store=store).answer == "done"
        record = Journal(store).get("f-run", names.tool("call_1_1"))
        assert record.get("is_error")
        assert "ledger refused" in json.dumps(record.get("result"))
    finally:
        ledger.close()


def test_a_task_the_server_forgot_halts_a_side_effect_and_is_an_error_for_a_read(
    store, task_server
):
    ledger = task_server.server(
        "ledger-forgot", tools={"audit": da.mcp.ToolOptions(safety="read_only")}
    )
    try:
        a = agent(
            "mcp-task-forgot",
            [ledger],
            scripted.calls(scripted.call("ledger-forgot__forgetful", {"account": "g1"})),
        )
        with pytest.raises(da.OutcomeUnknown):
            a.run("g-run", "try", store=store)
        [halt] = store.list_halts(run_id="g-run")
        assert halt.op_id == "call_1_1" and "no longer knows task" in json.dumps(halt.reason)
        # It stays halted: the tool said the outcome is unknown, so nothing polls again.
        with pytest.raises(da.OutcomeUnknown):
            da.resume("g-run", store=store)
        # A read-only call of a forgotten task reads it as an error instead.
        forgetful_read = task_server.server(
            "ledger-forgot-ro", tools={"forgetful": da.mcp.ToolOptions(safety="read_only")}
        )
        try:
            b = agent(
                "mcp-task-forgot-ro",
                [forgetful_read],
                scripted.calls(scripted.call("ledger-forgot-ro__forgetful", {"account": "g2"})),
            )
            assert b.run("g2-run", "try", store=store).answer == "done"
            record = Journal(store).get("g2-run", names.tool("call_1_1"))
            assert record.get("is_error") and "no longer knows" in json.dumps(record.get("result"))
        finally:
            forgetful_read.close()
    finally:
        ledger.close()


def test_polls_that_fail_are_tried_again_within_the_task_timeout(
    store, task_server, task_effects, flaky_file
):
    ledger = task_server.server("ledger-flaky")
    flaky_file.touch()
    healed = threading.Timer(2.0, flaky_file.unlink)
    healed.start()
    try:
        a = agent(
            "mcp-task-flaky",
            [ledger],
            scripted.calls(scripted.call("ledger-flaky__transfer", {"account": "p1", "cents": 1})),
        )
        started = time.monotonic()
        assert a.run("p-run", "move", store=store).answer == "done"
        assert time.monotonic() - started >= 2.0  # it waited the failures out
        assert not Journal(store).get("p-run", names.tool("call_1_1")).get("is_error")
        assert len([e for e in effects(task_effects, "transfer") if e["account"] == "p1"]) == 1
    finally:
        healed.cancel()
        flaky_file.unlink(missing_ok=True)
        ledger.close()


def test_polls_go_on_through_a_server_that_went_away_and_came_back(
    store, task_server, task_effects
):
    ledger = task_server.server("ledger-restart")

    def restart():
        task_server.kill()  # the connection drops, polls are refused...
        time.sleep(1.0)
        task_server.start()  # ...until it is back, knowing its tasks

    try:
        a = agent(
            "mcp-task-restart",
            [ledger],
            scripted.calls(
                scripted.call("ledger-restart__transfer", {"account": "x1", "cents": 2})
            ),
        )
        _ = a.tools
        first_pid = task_server.proc.pid
        bounce = threading.Timer(0.3, restart)
        bounce.start()
        assert a.run("x-run", "move", store=store).answer == "done"
        bounce.join()
        assert task_server.proc.pid != first_pid
        result = Journal(store).get("x-run", names.tool("call_1_1"))
        assert not result.get("is_error"), result.get("result")
        assert len([e for e in effects(task_effects, "transfer") if e["account"] == "x1"]) == 1
    finally:
        ledger.close()


def test_a_task_past_its_timeout_halts_a_side_effect(store, task_server, flaky_file):
    ledger = task_server.server("ledger-late", task_timeout=1.5)
    flaky_file.touch()  # every poll fails: the task never looks finished
    try:
        a = agent(
            "mcp-task-late",
            [ledger],
            scripted.calls(scripted.call("ledger-late__transfer", {"account": "l1", "cents": 1})),
        )
        started = time.monotonic()
        with pytest.raises(da.OutcomeUnknown):
            a.run("l-run", "move", store=store)
        assert time.monotonic() - started < 6
        [halt] = store.list_halts(run_id="l-run")
        assert "did not finish in 1.5s" in json.dumps(halt.reason)
    finally:
        flaky_file.unlink(missing_ok=True)
        ledger.close()


def test_a_slow_call_reports_progress_as_notes_never_replayed(store, task_server, task_effects):
    ledger = task_server.server("ledger-slow")
    try:
        a = agent(
            "mcp-progress",
            [ledger],
            scripted.calls(scripted.call("ledger-slow__crunch", {"steps": 10})),
        )
        _ = a.tools
        started = time.monotonic()
        assert a.run("c-run", "crunch", store=store).answer == "done"
        took = time.monotonic() - started
        notes = records(store, "c-run", names.PROGRESS)
        # At most one note a second, each with what the server said.
        assert 1 <= len(notes) <= took + 1
        assert all(n.get("total") == 10 and "of 10" in n.get("message") for n in notes)
        assert [n.get("progress") for n in notes] == sorted(n.get("progress") for n in notes)
        # Followers see them: they are journal records like any other.
        seen = [r.name for r in a.events("c-run", store=store)]
        assert {n.name for n in notes} <= set(seen)
        # Replay never reads them: the run's steps are the same without them.
        assert da.replay("c-run", a, store=store).diverged_at is None
    finally:
        ledger.close()


def test_a_task_tool_called_outside_a_run_is_polled_to_its_end(task_server, task_effects):
    ledger = task_server.server("ledger-direct")
    try:
        [audit] = [t for t in ledger.load_tools() if t.remote == "audit"]
        result = audit(account="d1")
        assert result["structuredContent"]["account"] == "d1"
        assert len([e for e in effects(task_effects, "audit") if e["account"] == "d1"]) == 1
    finally:
        ledger.close()
