"""A call whose work is held elsewhere (``engine.handles``): the handle record's body and
decoding, a resume that waits on the journaled handle instead of halting, and everything
that still halts — a tool that does not resume, a tool that said the outcome is unknown.
Also the MCP pieces that are plain functions: task capabilities, poll spacing, progress
throttling."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.errors import ToolOutcomeUnknown
from durable_agents.engine.handles import handle_body, handle_of, progress_body
from durable_agents.engine.journal import Journal
from durable_agents.engine.records import Record, encode
from durable_agents.engine.transcript import RunState
from durable_agents.mcp import tasks
from durable_agents.mcp.progress import ProgressNotes, progress_note
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


def rec(name, body, seq=1):
    return Record("r", name, seq, encode(body))


def test_a_handle_record_holds_the_tools_own_value_and_decodes_back():
    body = handle_body("call_1_1", "ledger__transfer", {"kind": "mcp-task", "task_id": "t-9"})
    assert body == {
        "kind": "handle",
        "call_id": "call_1_1",
        "tool": "ledger__transfer",
        "handle": {"kind": "mcp-task", "task_id": "t-9"},
    }
    assert handle_of(rec(names.handle("call_1_1"), body)) == body["handle"]
    assert handle_of(None) is None
    assert handle_of(rec("x", {"kind": "tool", "handle": {"a": 1}})) is None
    assert handle_of(rec("x", {"kind": "handle", "handle": "not a dict"})) is None
    note = progress_body("call_1_1", "t", {"progress": 3, "total": 10})
    assert note == {
        "kind": "progress",
        "call_id": "call_1_1",
        "tool": "t",
        "progress": 3,
        "total": 10,
    }


def test_names_and_run_state():
    assert names.handle("call_1_1") == "handle:call_1_1"
    assert names.progress("call_1_1", "ab12", 3) == "@progress/call_1_1/ab12/3"
    h = rec(names.handle("c1"), handle_body("c1", "t", {"x": 1}))
    p = rec(names.progress("c1", "n", 1), progress_body("c1", "t", {"progress": 1}), seq=2)
    state = RunState.of([h, p])
    assert state.handles == {"c1": h}
    # A progress note is evidence: nothing of the run's state reads it.
    assert RunState.of([h]).results == state.results and state.turns == []
    later = RunState()
    later.add(h)
    assert later.handles == {"c1": h}


def handing_off_agent(sent, waited, *, resumes=True, crash_after_keep=True, say_unknown=False):
    """``book(slot)``: a side effect that hands its work to a remote queue, keeps the ticket
    as its handle, then waits on it (the first wait dies, as a worker SIGKILLed)."""

    @da.tool
    def book(slot: str, ctx: da.ToolContext) -> dict:
        ticket = ctx.handle()
        if ticket is None:
            sent.append(slot)  # the remote work starts: once, ever
            ticket = ctx.keep_handle({"ticket": f"T-{slot}"})
            if crash_after_keep and len(sent) == 1:
                raise Crash()
        waited.append(ticket["ticket"])
        if say_unknown:
            raise ToolOutcomeUnknown("the queue forgot the ticket")
        return {"booked": slot, "ticket": ticket["ticket"]}

    book.resumes = resumes
    script = [scripted.calls(scripted.call("book", {"slot": "9am"})), scripted.text("booked")]
    return da.Agent("handoff", ScriptedModel(script), "Book.", [book])


def test_a_resume_waits_on_the_journaled_handle_and_never_starts_the_work_again(store, clock):
    sent: list = []
    waited: list = []
    a = handing_off_agent(sent, waited)
    with pytest.raises(Crash):
        a.run("h-run", "book", store=store)
    journal = Journal(store)
    assert journal.get("h-run", names.attempt("call_1_1", 1)) is not None
    assert handle_of(journal.get("h-run", names.handle("call_1_1"))) == {"ticket": "T-9am"}
    clock.advance(60)  # the dead driver's lease expires
    assert da.resume("h-run", store=store).answer == "booked"
    assert sent == ["9am"] and waited == ["T-9am"]
    assert journal.get("h-run", names.tool("call_1_1")).get("result") == {
        "booked": "9am",
        "ticket": "T-9am",
    }
    # No second claim: the resumed call ran under the attempt its handle was kept under.
    assert journal.get("h-run", names.attempt("call_1_1", 2)) is None
    assert store.list_halts(run_id="h-run") == []


def test_a_tool_that_does_not_resume_from_a_handle_still_halts(store, clock):
    sent: list = []
    waited: list = []
    a = handing_off_agent(sent, waited, resumes=False)
    with pytest.raises(Crash):
        a.run("n-run", "book", store=store)
    clock.advance(60)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("n-run", store=store)
    assert sent == ["9am"] and waited == []


def test_a_handle_whose_tool_said_the_outcome_is_unknown_stays_halted(store, clock):
    sent: list = []
    waited: list = []
    a = handing_off_agent(sent, waited, crash_after_keep=False, say_unknown=True)
    with pytest.raises(da.OutcomeUnknown):
        a.run("u-run", "book", store=store)
    clock.advance(60)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("u-run", store=store)
    assert sent == ["9am"] and waited == ["T-9am"]  # halted for a person: never waited again


def test_outside_a_run_nothing_is_kept():
    ctx = da.ToolContext(run_id="r", call_id="c", tool_name="t", idempotency_key="k")
    assert ctx.handle() is None
    assert ctx.keep_handle({"a": 1}) == {"a": 1}
    assert ctx.note_progress({"progress": 1}) is False


# -- MCP tasks and progress, as plain functions -------------------------------------------


def test_task_support_is_read_from_the_capabilities_and_the_tool():
    caps = SimpleNamespace(
        tasks=SimpleNamespace(requests=SimpleNamespace(tools=SimpleNamespace(call=object())))
    )
    assert tasks.server_runs_tasks(caps)
    assert not tasks.server_runs_tasks(SimpleNamespace(tasks=None))
    assert not tasks.server_runs_tasks(None)
    tool = SimpleNamespace(execution=SimpleNamespace(task_support="required"))
    assert tasks.task_support(tool) == "required"
    assert tasks.task_support(SimpleNamespace(execution=None)) is None
    forbidden = SimpleNamespace(execution=SimpleNamespace(task_support="forbidden"))
    assert tasks.task_support(forbidden) is None


def test_a_task_handle_names_its_task():
    handle = tasks.handle_for("ledger", "transfer", {"taskId": "t1", "pollInterval": 500})
    assert handle["kind"] == tasks.KIND and handle["task_id"] == "t1"
    assert handle["poll_interval_ms"] == 500 and isinstance(handle["started_at"], float)
    assert tasks.task_of(handle) == "t1"
    assert tasks.task_of({"ticket": "x"}) is None and tasks.task_of(None) is None


@pytest.mark.parametrize(
    "interval,left,expected",
    [
        (500, 10.0, 0.5),
        (None, 10.0, 1.0),
        (1, 10.0, 0.1),
        (600_000, 100.0, 30.0),
        (5000, 2.0, 2.0),
        (True, 10.0, 1.0),
        (500, -1.0, 0.0),
    ],
)
def test_polls_follow_the_servers_interval_within_bounds_and_the_time_left(
    interval, left, expected
):
    assert tasks.poll_delay({"pollInterval": interval}, left) == pytest.approx(expected)


class FakeCtx:
    def __init__(self, fail=False):
        self.notes: list = []
        self.fail = fail

    def note_progress(self, note):
        if self.fail:
            return False
        self.notes.append(note)
        return True


def test_progress_is_written_at_most_once_an_interval_the_latest_winning():
    now = [0.0]
    ctx = FakeCtx()
    notes = ProgressNotes(ctx, interval=1.0, clock=lambda: now[0])
    notes.flush()
    assert ctx.notes == []  # nothing reported yet
    for i in range(5):
        notes.offer(progress_note(i, 5, f"step {i}"))
    notes.flush()
    assert ctx.notes == [{"progress": 4, "total": 5, "message": "step 4"}]
    notes.offer(progress_note(5, 5, None))
    now[0] = 0.5
    notes.flush()  # too soon: kept for later
    assert len(ctx.notes) == 1
    now[0] = 1.2
    notes.flush()
    assert ctx.notes[-1] == {"progress": 5, "total": 5}
    now[0] = 3.0
    notes.offer(progress_note(5, 5, None))  # the same again: not a new note
    notes.flush()
    assert len(ctx.notes) == 2 and notes.written == 2
    failing = ProgressNotes(FakeCtx(fail=True), clock=lambda: 0.0)
    failing.offer({"progress": 1})
    failing.flush()  # a note that cannot be written is dropped; the call goes on
    assert failing.written == 0


def test_the_task_timeout_is_a_checked_setting_and_a_servers_own():
    from durable_agents.conf import parse

    settings, problems = parse({"MCP_TIMEOUTS": {"TASK": 7200}})
    assert not problems and settings.mcp_timeouts.task == 7200.0
    assert parse({})[0].mcp_timeouts.task == 3600.0
    _, problems = parse({"MCP_TIMEOUTS": {"TASK": 0}})
    assert any("MCP_TIMEOUTS.TASK" in p for p in problems)
    server = da.mcp.Server("ledger", url="http://127.0.0.1:9/mcp", task_timeout=90)
    assert server.timeouts().task == 90.0
    with pytest.raises(da.ConfigError, match="task_timeout"):
        da.mcp.Server("ledger", url="http://127.0.0.1:9/mcp", task_timeout=-1)
