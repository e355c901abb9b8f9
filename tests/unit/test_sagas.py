"""Sagas on the in-memory store (issue 16): a saga that fails for good journals its abort,
then undoes its completed compensable calls, latest first, each at most once; a crash in an
undo halts for a person; an unknown outcome is never undone on a guess; a crash anywhere in
the rollback resumes the rollback."""

from __future__ import annotations

import dataclasses

import pytest

import durable_agents as da
from durable_agents.engine import sagas
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.doubles import Crash


class Trip:
    """Books a flight and a hotel, then charges a card; effects and undos counted here,
    outside the journal."""

    def __init__(self, *, charge="abort", hotel="ok", undo_hotel="ok", saga=True, **agent):
        self.effects: list[str] = []
        self.undos: list[tuple[str, dict, object]] = []
        trip = self

        def undo_flight(args, result, ctx):
            trip.undos.append(("flight", args, result))
            return {"cancelled": result["booking"]}

        def undo_hotel_fn(args, result, ctx):
            trip.undos.append(("hotel", args, result))
            if undo_hotel == "crash" and len(trip.undos) == 1:
                raise Crash()
            if undo_hotel == "raise":
                raise RuntimeError("hotel API down")
            if undo_hotel == "unknown":
                raise da.ToolOutcomeUnknown("timed out")
            return {"cancelled": result["booking"]}

        @da.tool(compensate=undo_flight)
        def book_flight(to: str) -> dict:
            trip.effects.append("flight")
            return {"booking": f"F-{to}"}

        @da.tool(compensate=undo_hotel_fn)
        def book_hotel(city: str) -> dict:
            trip.effects.append("hotel")
            if hotel == "unknown":
                raise da.ToolOutcomeUnknown("the hotel API timed out")
            return {"booking": f"H-{city}"}

        @da.tool
        def charge_card(amount: int) -> dict:
            trip.effects.append("charge")
            if charge == "abort":
                raise da.SagaAborted("card declined")
            return {"charged": amount}

        @da.tool(read_only=True)
        def quote(city: str) -> int:
            return 100

        script = [
            scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
            scripted.calls(
                scripted.call("book_hotel", {"city": "LIS"}), scripted.call("quote", {"city": "x"})
            ),
            scripted.calls(scripted.call("charge_card", {"amount": 500})),
            scripted.text("booked"),
        ]
        self.model = model = ScriptedModel(script)
        self.agent = da.Agent(
            "trip",
            model,
            "Book a trip.",
            [book_flight, book_hotel, charge_card, quote],
            saga=saga,
            **agent,
        )


def journal_names(store, run_id):
    return [r.name for r in Journal(store).records(run_id)]


def test_compensate_is_checked_when_the_tool_is_defined():
    with pytest.raises(da.ConfigError) as info:

        @da.tool(read_only=True, compensate=lambda a, r, c: None)
        def peek() -> str:
            return ""

    assert info.value.code == "config.tool_safety"
    with pytest.raises(da.ConfigError):
        da.tool(compensate="undo")(lambda: None)
    with pytest.raises(da.ConfigError):
        da.Agent("bad-saga", ScriptedModel([]), saga="yes")


def test_the_third_step_failing_undoes_the_two_before_in_reverse_order_once(store):
    trip = Trip()
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run("t1", "go", store=store)
    assert info.value.code == "saga.aborted"
    assert info.value.details["cause"]["code"] == "saga.aborted"
    assert "card declined" in info.value.details["cause"]["message"]
    assert trip.effects == ["flight", "hotel", "charge"]
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    # the undo gets the call's arguments and its journaled result
    assert trip.undos[0][1:] == ({"city": "LIS"}, {"booking": "H-LIS"})
    names = journal_names(store, "t1")
    abort = names.index("saga:abort")
    assert abort < names.index("attempt:compensate:call_2_1:1") < names.index("compensate:call_2_1")
    assert names.index("compensate:call_2_1") < names.index("compensate:call_1_1")
    assert names[-1] == "run:compensated"
    assert "compensate:call_3_1" not in names  # the failed call has nothing to undo
    assert not any(n.startswith("compensate:call_2_2") for n in names)  # read-only quote
    run = store.get_run("t1")
    assert run.status == "compensated" and run.last_error["code"] == "saga.aborted"
    # over is over: a resume re-raises, calls no model, undoes nothing again
    calls = trip.model.requests
    for _ in range(2):
        with pytest.raises(da.SagaAborted):
            trip.agent.run("t1", None, store=store)
    assert (trip.model.requests, len(trip.undos)) == (calls, 2)
    assert store.get_run("t1").status == "compensated"


def test_a_budget_failure_aborts_the_saga(store):
    trip = Trip(charge="ok", max_turns=2)
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run("t2", "go", store=store)
    assert info.value.details["cause"]["code"] == "budget.max_turns"
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    assert store.get_run("t2").status == "compensated"


def test_a_run_that_is_not_a_saga_or_has_nothing_to_undo_fails_as_before(store):
    trip = Trip(charge="ok", max_turns=2, saga=False)
    with pytest.raises(da.BudgetError):
        trip.agent.run("t3", "go", store=store)
    assert trip.undos == [] and store.get_run("t3").status == "failed"
    trip = Trip(charge="ok", max_turns=1)
    trip.model.turns[0] = scripted.calls(scripted.call("quote", {"city": "LIS"}))
    with pytest.raises(da.BudgetError):  # a saga with nothing done to undo
        trip.agent.run("t4", "go", store=store)
    assert trip.undos == [] and store.get_run("t4").status == "failed"
    assert "saga:abort" not in journal_names(store, "t4")


def test_a_crash_in_the_middle_of_an_undo_halts_and_never_undoes_twice(store):
    trip = Trip(undo_hotel="crash")
    with pytest.raises(Crash):
        trip.agent.run("t5", "go", store=store)
    assert store.get_run("t5").status == "compensating"
    for _ in range(2):
        with pytest.raises(da.OutcomeUnknown) as info:
            trip.agent.run("t5", None, store=store)
        assert info.value.details["halts"] == ["compensate:call_2_1"]
    assert [u[0] for u in trip.undos] == ["hotel"]  # not again
    [halt] = store.list_halts(run_id="t5")
    assert (halt.op_id, halt.tool_name) == ("compensate:call_2_1", "book_hotel")
    calls = trip.model.requests
    # the person says the hotel was cancelled: the rollback goes on (to the flight)
    da.resolve_halt(  # the run is queued and driven (the test's inline dispatch)
        "t5",
        "compensate:call_2_1",
        {"cancelled": "H-LIS"},
        evidence="hotel site",
        by="ann",
        store=store,
    )
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    assert store.get_run("t5").status == "compensated"
    assert trip.model.requests == calls  # never the forward path again


def test_a_crash_between_undos_resumes_the_rollback(store, monkeypatch):
    trip = Trip()
    real = sagas.failpoints.hit

    def hit(name):
        if name == "after-compensate:call_2_1":
            raise Crash()
        real(name)

    monkeypatch.setattr(sagas.failpoints, "hit", hit)
    with pytest.raises(Crash):
        trip.agent.run("t6", "go", store=store)
    monkeypatch.setattr(sagas.failpoints, "hit", real)
    calls = trip.model.requests
    with pytest.raises(da.SagaAborted):
        trip.agent.run("t6", None, store=store)
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    assert trip.model.requests == calls
    names = journal_names(store, "t6")
    assert names.count("saga:abort") == 1 and names.count("compensate:call_2_1") == 1


def test_a_crash_right_after_the_abort_resumes_the_rollback(store, monkeypatch):
    trip = Trip()
    real = sagas.failpoints.hit

    def hit(name):
        if name == "after-saga-abort":
            raise Crash()
        real(name)

    monkeypatch.setattr(sagas.failpoints, "hit", hit)
    with pytest.raises(Crash):
        trip.agent.run("t7", "go", store=store)
    monkeypatch.setattr(sagas.failpoints, "hit", real)
    assert store.get_run("t7").status == "compensating" and trip.undos == []
    with pytest.raises(da.SagaAborted):
        trip.agent.run("t7", None, store=store)
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]


@pytest.mark.parametrize("resolved_as_error", [False, True])
def test_an_unknown_outcome_is_never_undone_on_a_guess(store, resolved_as_error):
    trip2 = Trip(hotel="unknown")
    agent = trip2.agent
    # the hotel's outcome is unknown and, in the same turn, the card is declined
    trip2.model.turns[1] = scripted.calls(
        scripted.call("book_hotel", {"city": "LIS"}), scripted.call("charge_card", {"amount": 1})
    )
    with pytest.raises(da.OutcomeUnknown) as info:
        agent.run("t8", "go", store=store)
    assert info.value.details["halts"] == ["call_2_1"]
    assert trip2.undos == []  # halted before any undo: the hotel's effect is a person's call
    names = journal_names(store, "t8")
    assert "saga:abort" in names and "compensate:call_1_1" not in names
    assert store.get_run("t8").status == "halted"
    result = {"error": "no booking"} if resolved_as_error else {"booking": "H-LIS"}
    da.resolve_halt(
        "t8", "call_2_1", result, is_error=resolved_as_error, evidence="x", by="ann", store=store
    )
    undone = [u[0] for u in trip2.undos]
    assert undone == (["flight"] if resolved_as_error else ["hotel", "flight"])
    assert store.get_run("t8").status == "compensated"


def test_an_undo_that_raises_is_recorded_once_and_the_run_needs_a_person(store):
    trip = Trip(undo_hotel="raise")
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run("t9", "go", store=store)
    assert info.value.code == "saga.compensation_failed"
    assert info.value.details["failed"] == ["call_2_1"]
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]  # the rest is still undone
    run = store.get_run("t9")
    assert run.status == "failed" and run.last_error["code"] == "saga.compensation_failed"
    with pytest.raises(da.SagaAborted):
        trip.agent.run("t9", None, store=store)
    assert len(trip.undos) == 2


def test_an_undo_whose_outcome_is_unknown_halts(store):
    trip = Trip(undo_hotel="unknown")
    with pytest.raises(da.OutcomeUnknown) as info:
        trip.agent.run("t10", "go", store=store)
    assert info.value.details["halts"] == ["compensate:call_2_1"]
    assert [u[0] for u in trip.undos] == ["hotel"]
    assert store.get_run("t10").status == "halted"


def test_a_retryable_failure_with_attempts_left_does_not_abort(store):
    trip = Trip(charge="ok")
    trip.model.turns[2] = scripted.error(
        da.ModelError("overloaded", code="model.overloaded", retryable=True)
    )
    trip.agent.model_retry = da.ModelRetry(max_attempts=1)
    with pytest.raises(da.ModelError):
        trip.agent.run("t11", "go", store=store)
    assert trip.undos == [] and store.get_run("t11").status == "failed"
    assert "saga:abort" not in journal_names(store, "t11")


def test_the_simulator_invariant_holds_on_real_rollbacks_and_catches_broken_ones(store):
    from durable_agents.engine.records import Record
    from tests.simulation.invariants import saga_violations

    trip = Trip()
    with pytest.raises(da.SagaAborted):
        trip.agent.run("s1", "go", store=store)
    records = Journal(store).records("s1")
    assert saga_violations(records) == []
    # the same undos, in call order instead of reverse: caught
    by_name = {r.name: r for r in records}
    first, second = by_name["compensate:call_2_1"], by_name["compensate:call_1_1"]
    swapped = [
        Record(r.run_id, r.name, {first.seq: second.seq, second.seq: first.seq}[r.seq], r.data)
        if r in (first, second)
        else r
        for r in records
    ]
    swapped.sort(key=lambda r: r.seq)
    assert "undos not in reverse order of the calls' completion" in saga_violations(swapped)
    # an undo of a call that failed, and one before any abort: caught
    charge = by_name["tool:call_3_1"]
    bogus = Record("s1", "compensate:call_3_1", charge.seq + 1, '{"kind": "tool"}')
    assert any("no successful result" in p for p in saga_violations([*records, bogus]))
    no_abort = [r for r in records if r.name != "saga:abort"]
    assert saga_violations(no_abort) == ["undone without a journaled abort"]


# -- cancel and compensate ----------------------------------------------------------------


def _gated_trip():
    """The flight and hotel booked, then the charge waits for a staff decision."""
    trip = Trip(charge="ok")
    charge = trip.agent.tools["charge_card"]
    charge.safety = dataclasses.replace(charge.safety, requires_approval=True)
    return trip


def test_cancel_and_compensate_undoes_a_paused_run(store):
    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c1", "go", store=store)
    da.cancel("c1", compensate=True, reason="customer changed their mind", by="ann", store=store)
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    run = store.get_run("c1")
    assert run.status == "compensated" and run.last_error["code"] == "saga.cancelled"
    assert "customer changed their mind" in run.last_error["message"]
    [request] = store.list_approval_requests(run_id="c1", status=None)
    assert request.status == "withdrawn"
    assert "charge" not in trip.effects
    [action] = [a for a in store.list_actions(run_id="c1") if a.action == "cancel"]
    assert action.payload == {"reason": "customer changed their mind", "compensate": True}
    # over: cancelling again is refused, as is a plain cancel of it
    for compensate in (True, False):
        with pytest.raises(da.ConfigError) as info:
            da.cancel("c1", compensate=compensate, by="ann", store=store)
        assert info.value.code == "run.compensated"


@pytest.mark.parametrize("first", ["plain", "compensate"])
def test_two_people_cancelling_at_once_one_plainly_one_compensating_get_one_stop(
    store, monkeypatch, first
):
    """Each cancel checks the run, then takes its lease to write its stop: the other's stop
    may land in between. The second is refused under the lease: a plain cancel is never
    rolled back after all (its effects stay), a rollback never cut short (found by the
    simulator, issue 32: the run moved from cancelled to compensating)."""
    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c9", "go", store=store)
    real = store.acquire_lease
    landed: list[bool] = []

    def acquire(run_id, *args, **kwargs):
        if run_id == "c9" and not landed:  # the other person's cancel, in the gap
            landed.append(True)
            da.cancel("c9", compensate=first == "compensate", by="bob", store=store)
        return real(run_id, *args, **kwargs)

    monkeypatch.setattr(store, "acquire_lease", acquire)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("c9", compensate=first == "plain", by="ann", store=store)
    assert info.value.code == ("run.cancelled" if first == "plain" else "run.compensating")
    names = [r.name for r in Journal(store).records("c9")]
    if first == "plain":
        assert "saga:abort" not in names and trip.undos == []
        assert store.get_run("c9").status == "cancelled"
    else:
        assert "run:cancelled" not in names and [u[0] for u in trip.undos] == ["hotel", "flight"]
        assert store.get_run("c9").status == "compensated"


def test_a_saga_rolling_back_cannot_be_cancelled_half_way(store):
    trip = Trip(undo_hotel="crash")
    with pytest.raises(Crash):
        trip.agent.run("c2", "go", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("c2", by="ann", store=store)
    assert info.value.code == "run.compensating"
    assert store.get_run("c2").status == "compensating"
    [listed] = [p for p in da.pending(store=store) if p.run_id == "c2"]
    assert listed.status == "compensating"
    assert listed.why == "a saga aborted: its completed calls are being undone: card declined"


def test_cancel_and_compensate_of_a_halted_run_waits_for_the_person(store):
    trip = Trip(hotel="unknown", charge="ok")
    with pytest.raises(da.OutcomeUnknown):
        trip.agent.run("c3", "go", store=store)
    da.cancel("c3", compensate=True, by="ann", store=store)
    assert trip.undos == [] and store.get_run("c3").status == "halted"
    da.resolve_halt("c3", "call_2_1", {"booking": "H-LIS"}, evidence="e", by="ann", store=store)
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    assert store.get_run("c3").status == "compensated"


@pytest.mark.parametrize("again", [False, True])
def test_cancel_and_compensate_never_hands_over_a_run_halted_meanwhile(store, again):
    """A person's cancel-and-compensate journals the abort, then hands the run to a driver
    for the rollback; in between, a driver (recovery's, taking the abort over) met a live
    claim and halted the run on it. Handed over anyway, its drive would only halt again: a
    halted run is a person's (issue 43, the simulator's on-call cast, fresh seed 50000173:
    ``halted_never_driven``). Asked to compensate again while halted, the same."""
    from tests.support.wiring import wired

    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c5", "go", store=store)
    sent: list[str] = []
    withdraw = store.list_approval_requests

    def halted_meanwhile(*args, **kwargs):
        store.update_run("c5", {"status": "halted"})  # what the other driver wrote
        return withdraw(*args, **kwargs)

    with wired(dispatcher=sent.append):
        if again:
            da.cancel("c5", compensate=True, by="ann", store=store)
            sent.clear()
            store.update_run("c5", {"status": "halted"})
        else:
            store.list_approval_requests = halted_meanwhile
        da.cancel("c5", compensate=True, by="ann", store=store)
    assert sent == [], "a halted run was handed to a driver"
    assert store.get_run("c5").status == "halted"


def test_a_cancelled_run_cannot_then_be_compensated(store):
    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c4", "go", store=store)
    da.cancel("c4", by="ann", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("c4", compensate=True, by="ann", store=store)
    assert info.value.code == "run.cancelled" and trip.undos == []


def test_an_abort_with_only_an_unknown_outcome_halts_rather_than_failing(store):
    trip = Trip(hotel="unknown")
    trip.model.turns[:3] = [
        scripted.calls(
            scripted.call("book_hotel", {"city": "LIS"}),
            scripted.call("charge_card", {"amount": 1}),
        )
    ]
    with pytest.raises(da.OutcomeUnknown) as info:
        trip.agent.run("u1", "go", store=store)
    assert info.value.details["halts"] == ["call_1_1"]
    assert "saga:abort" in journal_names(store, "u1") and trip.undos == []
    da.resolve_halt("u1", "call_1_1", {"booking": "H-LIS"}, evidence="e", by="ann", store=store)
    assert [u[0] for u in trip.undos] == ["hotel"]
    assert store.get_run("u1").status == "compensated"


def test_cancel_and_compensate_of_an_agent_without_undos_is_refused(store):
    @da.tool(requires_approval=True)
    def pay(amount: int) -> dict:
        return {"paid": amount}

    agent = da.Agent(
        "no-undos", ScriptedModel([scripted.calls(scripted.call("pay", {"amount": 1}))]), "", [pay]
    )
    with pytest.raises(da.ApprovalPending):
        agent.run("n1", "go", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.cancel("n1", compensate=True, by="ann", store=store)
    assert info.value.code == "run.not_compensable"
    assert store.get_run("n1").status == "awaiting_approval"
    assert "saga:abort" not in journal_names(store, "n1")


# -- a rollback withdraws the requests of the calls it will never run -----------------------


def _drifted_gated_trip():
    """The gated trip deployed again with other instructions under ``on_drift="error"``:
    driving a run it started before fails for good, so the saga aborts on its own."""
    trip = _gated_trip()
    trip.agent.on_drift = "error"
    trip.agent.instructions = "Book a cheaper trip."
    return trip


def _awaiting_charge(store, run_id):
    first = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        first.agent.run(run_id, "go", store=store)
    assert store.get_approval_request(run_id, "call_3_1").status == "pending"
    return first


def test_a_saga_that_aborts_on_its_own_withdraws_its_pending_requests(store):
    first = _awaiting_charge(store, "w1")
    trip = _drifted_gated_trip()
    with pytest.raises(da.SagaAborted):
        trip.agent.run("w1", None, store=store)
    assert store.get_run("w1").status == "compensated"
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]
    assert store.get_approval_request("w1", "call_3_1").status == "withdrawn"
    assert store.list_approval_requests() == []  # nothing left for staff to decide
    with pytest.raises(da.ApprovalOrphaned, match="withdrawn"):
        da.approve("w1", "call_3_1", True, by="ann", store=store)
    assert "approval:call_3_1" not in journal_names(store, "w1")
    assert "charge" not in first.effects + trip.effects


def test_a_decision_after_the_abort_is_refused_before_the_rollback_ran(store, monkeypatch):
    """The abort is journaled, then the driver dies before anything is undone or withdrawn
    (``after-saga-abort``): a decision arriving now is refused as orphaned (the journal
    says the run is rolling back), and the resumed rollback finishes without the call."""
    _awaiting_charge(store, "w2")
    trip = _drifted_gated_trip()
    real = sagas.failpoints.hit

    def hit(name):
        if name == "after-saga-abort":
            raise Crash()
        real(name)

    monkeypatch.setattr(sagas.failpoints, "hit", hit)
    with pytest.raises(Crash):
        trip.agent.run("w2", None, store=store)
    monkeypatch.setattr(sagas.failpoints, "hit", real)
    assert store.get_run("w2").status == "compensating"
    with pytest.raises(da.ApprovalOrphaned, match="saga aborted"):
        da.approve("w2", "call_3_1", True, by="ann", store=store)
    assert store.get_approval_request("w2", "call_3_1").status == "withdrawn"
    assert store.get_run("w2").status == "compensating"  # not queued by the refused decision
    with pytest.raises(da.SagaAborted):
        trip.agent.run("w2", None, store=store)
    assert store.get_run("w2").status == "compensated"
    assert [u[0] for u in trip.undos] == ["hotel", "flight"] and "charge" not in trip.effects


@pytest.mark.parametrize("lands", ["rolled-back", "rolling-back"])
def test_an_abort_landing_while_a_decision_is_recorded_refuses_it(store, monkeypatch, lands):
    """The decision is checked while the run still waits; the saga aborts before it is
    journaled. It is refused as orphaned, the request withdrawn, the run left to its
    rollback (never queued forward), and the call never runs."""
    from durable_agents.engine.commands import approvals as approvals_module

    _awaiting_charge(store, f"w3-{lands}")
    trip = _drifted_gated_trip()
    original = approvals_module._refuse_orphans
    real = sagas.failpoints.hit

    def hit(name):
        if name == "after-saga-abort" and lands == "rolling-back":
            raise Crash()
        real(name)

    def check_then_abort(*args, **kwargs):
        original(*args, **kwargs)
        monkeypatch.setattr(sagas.failpoints, "hit", hit)
        with pytest.raises((da.SagaAborted, Crash)):
            trip.agent.run(f"w3-{lands}", None, store=store)
        monkeypatch.setattr(sagas.failpoints, "hit", real)

    monkeypatch.setattr(approvals_module, "_refuse_orphans", check_then_abort)
    with pytest.raises(da.ApprovalOrphaned):
        da.approve(f"w3-{lands}", "call_3_1", True, by="ann", store=store)
    monkeypatch.setattr(approvals_module, "_refuse_orphans", original)
    run_id = f"w3-{lands}"
    assert store.get_approval_request(run_id, "call_3_1").status == "withdrawn"
    expected = "compensated" if lands == "rolled-back" else "compensating"
    assert store.get_run(run_id).status == expected
    if lands == "rolling-back":
        with pytest.raises(da.SagaAborted):
            trip.agent.run(run_id, None, store=store)
        assert store.get_run(run_id).status == "compensated"
    assert [u[0] for u in trip.undos] == ["hotel", "flight"] and "charge" not in trip.effects


@pytest.mark.parametrize("how", ["cancel-and-compensate", "cancel"])
def test_a_decision_journaled_before_the_run_ended_is_refused_once_its_request_was_withdrawn(
    store, monkeypatch, how
):
    """ann's approval is journaled, then her process dies before it moves the run on
    (``after-decision``); the run is cancelled (and compensated) before anyone else decides.
    Her request was withdrawn: a later decision on it — bob's, or ann's again — is refused
    as orphaned, not reported as the standing approval of a call that never runs."""
    from durable_agents.engine.commands import approvals as approvals_module

    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("w4", "go", store=store)
    real = approvals_module.failpoints.hit

    def hit(name):
        if name == "after-decision:call_3_1":
            raise Crash()
        real(name)

    monkeypatch.setattr(approvals_module.failpoints, "hit", hit)
    with pytest.raises(Crash):
        da.approve("w4", "call_3_1", True, by="ann", store=store)
    monkeypatch.setattr(approvals_module.failpoints, "hit", real)
    da.cancel("w4", compensate=how == "cancel-and-compensate", by="carl", store=store)
    assert store.get_approval_request("w4", "call_3_1").status == "withdrawn"
    for who in ("bob", "ann"):
        with pytest.raises(da.ApprovalOrphaned, match="withdrawn"):
            da.approve("w4", "call_3_1", True, by=who, store=store)
    assert store.get_approval_request("w4", "call_3_1").status == "withdrawn"
    assert "charge" not in trip.effects


def test_a_forks_rollback_never_undoes_what_its_source_did(store):
    """A fork copies its source's completed calls; their effects happened once, in the
    source, which undoes them itself. The fork's rollback undoes only the calls it made
    (each booking undone once, however many forks roll back) and names the rest ``kept``."""
    trip = Trip()
    with pytest.raises(da.SagaAborted):
        trip.agent.run("fk1", "go", store=store)
    assert [u[0] for u in trip.undos] == ["hotel", "flight"]  # the source's own rollback
    # a fork after the flight goes on: books a hotel of its own, the card is declined again
    fork = da.fork("fk1", 1, store=store)
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run(fork, None, store=store)
    assert trip.effects == ["flight", "hotel", "charge", "hotel", "charge"]
    assert [u[0] for u in trip.undos] == ["hotel", "flight", "hotel"], "the fork's hotel only"
    details = info.value.details
    assert (details["undone"], details["kept"]) == (["call_2_1"], ["call_1_1"])
    assert "call_1_1" in str(info.value) and "source" in str(info.value)
    done = Journal(store).get(fork, "run:compensated")
    assert done.get("kept") == ["call_1_1"]
    assert store.get_run(fork).status == "compensated"
    # two more forks, rolled back by staff before going on: nothing of theirs to undo
    for step in (1, 2):
        other = da.fork("fk1", step, store=store)
        da.cancel(other, compensate=True, by="ann", store=store)
        assert store.get_run(other).status == "compensated"
        assert Journal(store).get(other, "run:compensated").get("undone") == []
    assert len(trip.undos) == 3


def test_a_fork_leaves_a_result_a_person_recorded_for_its_sources_attempt_to_the_source(store):
    """A call whose outcome was unknown in the source is unknown in the fork: the attempt,
    and so its effect, is the source's even when a person records the fork's outcome."""
    trip = Trip(hotel="unknown")
    with pytest.raises(da.OutcomeUnknown):
        trip.agent.run("fk2", "go", store=store)
    fork = da.fork("fk2", 2, store=store)
    with pytest.raises(da.OutcomeUnknown):
        trip.agent.run(fork, None, store=store)
    da.resolve_halt(fork, "call_2_1", result={"booking": "H-LIS"}, by="ann", store=store)
    # handed over inline: the fork goes on and the card is declined; with nothing of its own
    # to undo it fails as a run that is not a saga would
    assert trip.effects == ["flight", "hotel", "charge"], "the fork's one charge"
    assert store.get_run(fork).status == "failed"
    assert Journal(store).get(fork, "saga:abort") is None
    assert trip.undos == []


def test_a_drive_of_a_cancelled_run_whose_store_fails_leaves_it_cancelled(store, monkeypatch):
    """A drive repairing a cancelled run (closing its requests and halts) whose store fails
    fails for a retry, but never moves the run out of ``cancelled`` (found by the simulator's
    failing store, issue 32: the row went from cancelled to failed)."""
    trip = _gated_trip()
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c10", "go", store=store)
    da.cancel("c10", by="ann", store=store)

    def down(*args, **kwargs):
        raise da.StorageError("the database went away", code="storage.unavailable")

    monkeypatch.setattr(store, "orphan_halts", down)
    with pytest.raises(da.StorageError):
        trip.agent.run("c10", None, store=store)
    assert store.get_run("c10").status == "cancelled"


def test_the_sweep_closes_the_halts_a_cancel_left_open(store, monkeypatch):
    """A cancel journaled its record, then its process died (or its store failed) before it
    orphaned the run's halts: nobody drives a cancelled run, so the sweep closes them (found
    by the simulator's failing store, fresh seed 13001033)."""
    from durable_agents.engine.commands.timers import wake_timers

    trip = Trip(hotel="unknown", saga=False)
    with pytest.raises(da.OutcomeUnknown):
        trip.agent.run("c11", "go", store=store)
    assert [h.status for h in store.list_halts(run_id="c11")] == ["open"]
    real = store.orphan_halts

    def dies(run_id):
        monkeypatch.setattr(store, "orphan_halts", real)
        raise Crash()

    monkeypatch.setattr(store, "orphan_halts", dies)
    with pytest.raises(Crash):
        da.cancel("c11", by="ann", store=store)
    assert store.get_run("c11").status == "cancelled"
    assert [h.status for h in store.list_halts(run_id="c11")] == ["open"]
    wake_timers(store=store)
    assert [h.status for h in store.list_halts(run_id="c11", status=None)] == ["orphaned"]
