"""The agent loop on the in-memory store: what runs, what is recorded, what a resume does."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.errors import ModelError
from durable_agents.engine.journal import Journal
from durable_agents.engine.model import FINISH_LENGTH, Usage
from durable_agents.engine.ports import RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Crash
from tests.support.wiring import wired


def history(store, run_id):
    return [r.name for r in Journal(store).records(run_id)]


def make_tools(fired, crash_on=None):
    crash_on = crash_on if crash_on is not None else set()

    def fire(name, arg):
        fired.append((name, arg))
        if (name, arg) in crash_on:
            crash_on.discard((name, arg))
            raise Crash()

    @da.tool(read_only=True)
    def lookup(order_id: str) -> dict:
        """Look up an order."""
        fire("lookup", order_id)
        return {"order": order_id, "total": 42}

    @da.tool(idempotent=True)
    def receipt(order_id: str, ctx: da.ToolContext) -> str:
        fire("receipt", order_id)
        return f"sent {ctx.idempotency_key}"

    @da.tool
    def refund(order_id: str, cents: int) -> dict:
        """Refund an order."""
        fire("refund", order_id)
        return {"refunded": cents}

    return [lookup, receipt, refund]


SCRIPT = [
    scripted.calls(scripted.call("lookup", {"order_id": "7"})),
    scripted.calls(
        scripted.call("refund", {"order_id": "7", "cents": 42}),
        scripted.call("receipt", {"order_id": "7"}),
    ),
    scripted.text("Refunded order 7."),
]


def agent(fired, script=SCRIPT, crash_on=None, **kw):
    return da.Agent(
        "support-test",
        ScriptedModel(script),
        "You help.",
        make_tools(fired, crash_on),
        **kw,
    )


def test_a_run_records_every_step_in_order(store, fired):
    result = agent(fired).run("r1", "Refund order 7", store=store)
    assert result.answer == "Refunded order 7."
    assert result.turns == 3 and result.usage == Usage(30, 15) == result.spend
    assert fired == [("lookup", "7"), ("refund", "7"), ("receipt", "7")]
    assert history(store, "r1") == [
        "@journal",
        "run:start",
        "model:1",
        "tool:call_1_1",
        "model:2",
        "attempt:call_2_1:1",
        "tool:call_2_1",
        "tool:call_2_2",
        "model:3",
        "run:complete",
    ]
    run = store.get_run("r1")
    assert (run.status, run.answer, run.turns) == ("finished", "Refunded order 7.", 3)


def test_the_model_sees_results_in_call_order(store, fired):
    seen = []
    model = ScriptedModel(SCRIPT, on_request=lambda req: seen.append(req.messages))
    da.Agent("order-test", model, "", make_tools(fired)).run("r1", "go", store=store)
    last = seen[-1]
    assert [m.role for m in last] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    assert [m.tool_call_id for m in last if m.role == "tool"] == [
        "call_1_1",
        "call_2_1",
        "call_2_2",
    ]


def test_a_finished_run_is_returned_without_calling_the_model(store, fired):
    a = agent(fired)
    first = a.run("r1", "Refund order 7", store=store)
    requests = a.model.requests
    again = a.run("r1", "Refund order 7", store=store)
    assert again == first and a.model.requests == requests and len(fired) == 3


def test_resuming_with_another_input_is_refused_and_writes_nothing(store, fired):
    a = agent(fired)
    a.run("r1", "Refund order 7", store=store)
    before = history(store, "r1")
    with pytest.raises(da.ConfigError, match="different input"):
        a.run("r1", "Refund order 8", store=store)
    assert history(store, "r1") == before


def test_crash_inside_a_side_effect_halts_instead_of_repeating(store, fired):
    a = agent(fired, crash_on={("refund", "7")})
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    with pytest.raises(da.OutcomeUnknown) as info:
        da.resume("r1", store=store)
    assert info.value.details["halts"] == ["call_2_1"]
    assert [f for f in fired if f[0] == "refund"] == [("refund", "7")]
    halt = store.list_halts(run_id="r1")[0]
    assert (halt.op_id, halt.tool_name, halt.cause) == ("call_2_1", "refund", "crashed")
    assert halt.arguments == {"order_id": "7", "cents": 42}
    assert store.get_run("r1").status == "halted"
    # Nothing else of the run moves while an outcome is unknown: the other call of the turn
    # runs once a person has recorded what happened.
    assert "tool:call_2_2" not in history(store, "r1") and ("receipt", "7") not in fired
    with wired(dispatcher=lambda run_id: None):  # the resume below drives it, not the hand-over
        da.resolve_halt("r1", "call_2_1", {"refunded": 42}, by="ann", store=store)
        da.resume("r1", store=store)
    assert fired.count(("receipt", "7")) == 1 and store.get_run("r1").status == "finished"


def test_crash_inside_a_retry_safe_tool_reruns_it(store, fired):
    a = agent(fired, crash_on={("lookup", "7")})
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    result = da.resume("r1", store=store)
    assert result.answer == "Refunded order 7."
    assert fired.count(("lookup", "7")) == 2 and fired.count(("refund", "7")) == 1


def test_usage_and_budget_survive_a_crash(store, fired):
    a = agent(fired, crash_on={("receipt", "7")})
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    resumed = da.resume("r1", store=store)
    clean = agent([]).run("r2", "Refund order 7", store=store)
    assert resumed.usage == clean.usage and resumed.spend == clean.spend
    tight = agent([], token_budget=30)
    with pytest.raises(da.BudgetError, match="budget"):
        tight.run("r3", "Refund order 7", store=store)
    assert store.get_run("r3").status == "failed"


def test_max_turns(store, fired):
    with pytest.raises(da.BudgetError, match="2 turns"):
        agent(fired, max_turns=2).run("r1", "Refund order 7", store=store)
    assert store.get_run("r1").last_error["code"] == "budget.max_turns"


def test_unknown_tools_and_bad_arguments_go_back_to_the_model(store, fired):
    script = [
        scripted.calls(
            scripted.call("teleport", {}),
            scripted.call("refund", {"order_id": "7", "cents": "42"}),
            scripted.call("lookup", "{not json"),
        ),
        scripted.text("sorry"),
    ]
    seen = []
    model = ScriptedModel(script, on_request=lambda r: seen.append(r.messages))
    da.Agent("bad-args", model, "", make_tools(fired)).run("r1", "go", store=store)
    tool_msgs = [m for m in seen[-1] if m.role == "tool"]
    assert all(m.is_error for m in tool_msgs)
    assert "unknown tool 'teleport'" in tool_msgs[0].content
    assert "cents" in tool_msgs[1].content and "valid integer" in tool_msgs[1].content
    assert "invalid arguments for lookup" in tool_msgs[2].content
    assert fired == []


def test_a_failing_tool_is_an_error_result_with_urls_redacted(store):
    @da.tool(read_only=True)
    def fetch(url: str) -> str:
        raise ConnectionError(f"could not reach {url}")

    script = [scripted.calls(scripted.call("fetch", {"url": "x"})), scripted.text("ok")]
    seen = []
    model = ScriptedModel(script, on_request=lambda r: seen.append(r.messages))
    model.turns[0] = scripted.calls(
        scripted.call("fetch", {"url": "https://bob:secret@api.example/v1?token=abc&x=1"})
    )
    da.Agent("failing", model, "", [fetch]).run("r1", "go", store=store)
    text = seen[-1][-1].content
    assert "ConnectionError" in text and "api.example/v1" in text
    assert "secret" not in text and "abc" not in text and "token=REDACTED" in text


def test_outcome_unknown_halts_a_side_effect_but_not_a_read(store):
    @da.tool
    def send(to: str) -> str:
        raise da.ToolOutcomeUnknown("timed out after sending")

    @da.tool(read_only=True)
    def peek(to: str) -> str:
        raise da.ToolOutcomeUnknown("timed out")

    script = [
        scripted.calls(scripted.call("peek", {"to": "a"}), scripted.call("send", {"to": "a"})),
        scripted.text("done"),
    ]
    with pytest.raises(da.OutcomeUnknown):
        da.Agent("unknowns", ScriptedModel(script), "", [send, peek]).run("r1", "go", store=store)
    names = history(store, "r1")
    assert "tool:call_1_1" in names and "tool:call_1_2" not in names
    assert "attempt:call_1_2:1" in names


def test_approval_gate_pauses_then_runs_once(store, fired):
    @da.tool(requires_approval=True)
    def wire(cents: int) -> str:
        fired.append(("wire", cents))
        return "wired"

    script = [scripted.calls(scripted.call("wire", {"cents": 5})), scripted.text("done")]
    a = da.Agent("unit-gated", ScriptedModel(script), "", [wire])
    with pytest.raises(da.ApprovalPending) as info:
        a.run("r1", "pay", store=store)
    assert info.value.details["calls"] == ["call_1_1"]
    assert store.get_run("r1").status == "awaiting_approval" and fired == []
    Journal(store).write("r1", "approval:call_1_1", {"kind": "approval", "approved": True})
    assert da.resume("r1", store=store).answer == "done"
    assert fired == [("wire", 5)]


def test_new_input_to_a_run_awaiting_approval_names_the_decision(store, fired):
    @da.tool(requires_approval=True)
    def wire(cents: int) -> str:
        return "wired"

    script = [scripted.calls(scripted.call("wire", {"cents": 5})), scripted.text("done")]
    a = da.Agent("unit-await-input", ScriptedModel(script), "", [wire])
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay", store=store)
    with pytest.raises(da.ApprovalPending, match="awaits approval of 'call_1_1' \\(wire\\)"):
        a.run("r1", "pay something else", store=store)


def test_denied_call_gets_a_rejection_result(store, fired):
    @da.tool(requires_approval=True)
    def wire(cents: int) -> str:
        fired.append("wire")
        return "wired"

    seen = []
    script = [scripted.calls(scripted.call("wire", {"cents": 5})), scripted.text("ok")]
    model = ScriptedModel(script, on_request=lambda r: seen.append(r.messages))
    a = da.Agent("unit-denied", model, "", [wire])
    with pytest.raises(da.ApprovalPending):
        a.run("r1", "pay", store=store)
    Journal(store).write(
        "r1", "approval:call_1_1", {"kind": "approval", "approved": False, "note": "too much"}
    )
    a.run("r1", "pay", store=store)
    assert fired == [] and "too much" in seen[-1][-1].content and seen[-1][-1].is_error


def test_model_retries_retryable_errors_only(store, fired):
    flaky = ModelError("overloaded", code="model.server_error", retryable=True)
    script = [scripted.error(flaky)]
    a = da.Agent("flaky", ScriptedModel(script), "", [], model_retry=da.ModelRetry(3, 0.001, 0.001))
    with pytest.raises(ModelError):
        a.run("r1", "go", store=store)
    assert a.model.requests == 3
    run = store.get_run("r1")
    assert run.status == "failed" and run.last_error["retryable"] and run.attempts == 1

    auth = ModelError("bad key", code="model.auth")
    b = da.Agent("auth", ScriptedModel([scripted.error(auth)]), "", [])
    with pytest.raises(ModelError):
        b.run("r2", "go", store=store)
    assert b.model.requests == 1


def test_truncated_output_is_not_journaled_but_its_spend_counts(store):
    script = [scripted.Turn(text="half an ans", usage=Usage(100, 50), finish=FINISH_LENGTH)]
    a = da.Agent("trunc", ScriptedModel(script), "", [])
    with pytest.raises(ModelError, match="token limit"):
        a.run("r1", "go", store=store)
    names = history(store, "r1")
    assert not any(n.startswith("model:") for n in names)
    assert any(n.startswith("@spend/1/") for n in names)


def test_reused_tool_call_ids_are_retried_not_journaled(store, fired):
    dup = scripted.calls(
        scripted.call("lookup", {"order_id": "1"}, id="x"),
        scripted.call("lookup", {"order_id": "2"}, id="x"),
    )
    a = da.Agent(
        "dups",
        ScriptedModel([dup]),
        "",
        make_tools(fired),
        model_retry=da.ModelRetry(2, 0.001, 0.001),
    )
    with pytest.raises(ModelError, match="reused"):
        a.run("r1", "go", store=store)
    assert not any(n.startswith("model:") for n in history(store, "r1")) and fired == []


def test_parallel_calls_record_each_result_and_keep_call_order(store):
    import threading

    gate = threading.Barrier(3, timeout=10)

    @da.tool(read_only=True)
    def slow(n: int) -> int:
        gate.wait()  # all three run at once, or this times out
        return n * 10

    script = [
        scripted.calls(*(scripted.call("slow", {"n": i}) for i in (1, 2, 3))),
        scripted.text("done"),
    ]
    seen = []
    model = ScriptedModel(script, on_request=lambda r: seen.append(r.messages))
    da.Agent("par", model, "", [slow], tool_concurrency=3).run("r1", "go", store=store)
    assert [m.content for m in seen[-1] if m.role == "tool"] == ["10", "20", "30"]


def test_a_run_held_by_another_driver_is_busy(store, fired):
    a = agent(fired)
    from durable_agents.engine.ports import RunInfo

    store.create_run(RunInfo("r1", agent=a.name))
    store.acquire_lease("r1", "someone", "tok", 30)
    with pytest.raises(da.RunBusy):
        a.run("r1", "go", store=store)
    assert fired == [] and store.load("r1") == []


def test_idempotency_keys_are_stable_across_reruns(store):
    keys = []

    @da.tool(idempotent=True)
    def post(ctx: da.ToolContext) -> str:
        keys.append((ctx.idempotency_key, ctx.once_key(), ctx.once_key()))
        if len(keys) == 1:
            raise Crash()
        return "ok"

    script = [scripted.calls(scripted.call("post", {})), scripted.text("done")]
    a = da.Agent("keys", ScriptedModel(script), "", [post])
    with pytest.raises(Crash):
        a.run("r1", "go", store=store)
    da.resume("r1", store=store)
    assert keys[0] == keys[1]
    key, first, second = keys[0]
    assert (first, second) == (f"{key}:1", f"{key}:2")


def test_tool_schema_from_hints_and_docstring():
    @da.tool
    def book(table: int, name: str, notes: str = "") -> str:
        """Book a table."""
        return ""

    spec = book.spec()
    assert spec.description == "Book a table."
    assert spec.parameters["required"] == ["table", "name"]
    assert spec.parameters["properties"]["table"]["type"] == "integer"
    assert spec.parameters["additionalProperties"] is False
    with pytest.raises(da.ConfigError):
        da.tool(read_only=True, idempotent=True)(lambda: None)


def test_removed_tool_with_a_pending_call_refuses_to_resume(store, fired):
    a = agent(fired, crash_on={("lookup", "7")})
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    tools = [t for t in make_tools(fired) if t.name != "lookup"]
    b = da.Agent("support-test", ScriptedModel(SCRIPT), "You help.", tools)
    with pytest.raises(da.ResumeToolMissing, match="lookup"):
        b.run("r1", None, store=store)


def test_pending_lists_unfinished_runs_with_why(store, fired):
    a = agent(fired, crash_on={("refund", "7")})
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("r1", store=store)
    [p] = da.pending(store=store)
    assert (p.run_id, p.status) == ("r1", "halted") and "outcome is unknown" in p.why


# -- issue 10: every billed response counts ----------------------------------------------


def spend_names(store, run_id):
    return [n for n in history(store, run_id) if n.startswith("@spend/")]


def test_a_rejected_response_is_still_spend_and_the_budget_counts_it(store, fired):
    dup = scripted.calls(
        scripted.call("lookup", {"order_id": "1"}, id="x"),
        scripted.call("lookup", {"order_id": "2"}, id="x"),
        usage=Usage(10, 5),
    )
    a = da.Agent(
        "spend-dups",
        ScriptedModel([dup]),
        "",
        make_tools(fired),
        model_retry=da.ModelRetry(2, 0.001, 0.001),
        token_budget=20,
    )
    with pytest.raises(ModelError):
        a.run("r1", "go", store=store)
    assert len(spend_names(store, "r1")) == 2
    assert store.get_run("r1").spend["input_tokens"] == 20
    with pytest.raises(da.BudgetError, match="spent 30 tokens"):
        a.run("r1", None, store=store)


def test_a_response_whose_write_lost_the_lease_is_still_spend(fired):
    t = [5_000_000.0]
    store = InMemoryStore(clock=lambda: t[0])

    def stall(request):
        t[0] += 31  # the lease (30 s) lapses while the model thinks; another driver takes it
        store.acquire_lease("r1", "other", "other-token", 30)

    script = [scripted.text("late answer", usage=Usage(7, 3))]
    a = da.Agent("spend-lost", ScriptedModel(script, on_request=stall), "", [])
    with pytest.raises(da.LeaseLost):
        a.run("r1", "go", store=store)
    [name] = spend_names(store, "r1")
    rec = Journal(store).get("r1", name)
    assert rec.get("usage")["input_tokens"] == 7 and rec.get("why") == "lease_lost"


def test_a_response_that_lost_the_race_for_its_turn_is_still_spend(store, fired):
    def someone_else_records_turn_one(request):
        Journal(store).write(
            "r1",
            "model:1",
            {"kind": "model", "message": {"role": "assistant", "content": "theirs"}, "usage": {}},
        )

    script = [scripted.text("mine", usage=Usage(4, 2)), scripted.text("unused")]
    a = da.Agent(
        "spend-race", ScriptedModel(script, on_request=someone_else_records_turn_one), "", []
    )
    assert a.run("r1", "go", store=store).answer == "theirs"
    [name] = spend_names(store, "r1")
    assert Journal(store).get("r1", name).get("why") == "lost_race"
    assert store.get_run("r1").spend["input_tokens"] == 4


class WriteLog(InMemoryStore):
    """Records which writes the driver makes, by method and names."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, list[str]]] = []

    def insert(self, run_id, name, data, **kwargs):
        self.writes.append(("insert", [name]))
        return super().insert(run_id, name, data, **kwargs)

    def finish_run(self, run_id, name, data, **kwargs):
        self.writes.append(("finish_run", [name]))
        return super().finish_run(run_id, name, data, **kwargs)

    def finish_run_with(self, run_id, records, **kwargs):
        self.writes.append(("finish_run_with", [n for n, _ in records]))
        return super().finish_run_with(run_id, records, **kwargs)


def test_a_final_answer_and_the_end_of_the_run_are_one_write(fired):
    """Nothing happens between the final turn and ``run:complete`` that a crash could split:
    they are stored together, with the row and the lease's release."""
    store = WriteLog()
    result = agent(fired).run("r1", "Refund order 7", store=store)
    assert result.answer == "Refunded order 7."
    assert store.writes[-1] == ("finish_run_with", ["model:3", "run:complete"])
    assert not any(method == "finish_run" for method, _ in store.writes)
    assert history(store, "r1")[-2:] == ["model:3", "run:complete"]
    run = store.get_run("r1")
    assert (run.status, run.answer, run.turns) == ("finished", "Refunded order 7.", 3)
    assert store.get_lease("r1") is None


def test_a_crash_before_the_final_write_records_neither_and_the_resume_answers(
    store, clock, fired, crash_at
):
    """A driver that dies with the final answer in hand has recorded neither it nor the end:
    the resume asks the model again (as after a crash during the call) and repeats no tool."""
    crash_at("before-complete:r1")
    asked: list = []
    model = ScriptedModel(SCRIPT, on_request=asked.append)
    a = da.Agent("support-test", model, "You help.", make_tools(fired))
    with pytest.raises(Crash):
        a.run("r1", "Refund order 7", store=store)
    assert "model:3" not in history(store, "r1")
    assert "run:complete" not in history(store, "r1")
    clock.advance(31)  # the dead driver's lease lapses
    assert a.run("r1", None, store=store).answer == "Refunded order 7."
    assert len(asked) == 4  # turn 3 twice
    assert [name for name, _ in fired] == ["lookup", "refund", "receipt"]
    assert history(store, "r1")[-2:] == ["model:3", "run:complete"]


def test_a_worker_resume_of_a_finished_run_behind_a_stale_row_lets_its_lease_go(store, fired):
    """``resume`` leases a run its row shows unfinished before reading the journal; one the
    journal shows finished (its row behind) answers from the journal, puts the row right and
    lets the lease go."""
    from durable_agents.engine.commands.runs import resume

    a = agent(fired)
    a.run("r1", "Refund order 7", store=store)
    store.update_run("r1", {"status": "running"})
    assert resume("r1", store=store).answer == "Refunded order 7."
    assert store.get_run("r1").status == "finished"
    assert store.get_lease("r1") is None
    assert len(fired) == 3  # nothing ran again


def test_a_worker_resume_of_a_run_another_driver_holds_is_busy_and_reads_nothing(store, fired):
    from durable_agents.engine.commands.runs import resume

    agent(fired)  # registers the agent
    store.create_run(RunInfo("r2", agent="support-test", input="go"))
    assert store.acquire_lease("r2", "other", "tok-other", 30)
    loads: list = []
    real_load = store.load
    store.load = lambda *args, **kwargs: loads.append(args) or real_load(*args, **kwargs)
    with pytest.raises(da.RunBusy):
        resume("r2", store=store)
    assert loads == []
    assert store.get_lease("r2").token == "tok-other"


def test_a_driver_whose_lease_went_unrenewed_for_a_ttl_stops_before_its_next_call(
    store, fired, monkeypatch, at_point
):
    """The heartbeat starved or died while the driver went on: no renewal for a whole ttl,
    so the lease may be another driver's, though nothing said so. A retry-safe call writes
    nothing fenced before it runs: the driver must stop at its step boundary instead of
    running it after a cancel or an abort it cannot see (found by the simulator's heartbeat
    deaths, issue 32)."""
    from durable_agents.engine import leases

    monkeypatch.setattr(leases.HeldLease, "renew", lambda self: None)  # the heartbeat is gone

    @da.tool(idempotent=True)
    def notify(to: str) -> str:
        fired.append(("notify", to))
        return "sent"

    def a_ttl_passes() -> None:
        real = leases.time.monotonic
        monkeypatch.setattr(leases.time, "monotonic", lambda: real() + 31.0)

    at_point("after-model:1", a_ttl_passes)
    script = [scripted.calls(scripted.call("notify", {"to": "bob"})), scripted.text("done")]
    agent = da.Agent("lapsed-lease", ScriptedModel(script), "", [notify])
    with pytest.raises(da.LeaseLost):
        agent.run("r1", "go", store=store)
    assert fired == []
