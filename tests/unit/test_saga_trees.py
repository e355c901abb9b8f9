"""Sagas across sub-agent trees (issue 16), on the in-memory store: an aborted saga rolls its
sub-runs back in their own journals (each undo once, behind its attempt marker), at the place
of the parent's call in completion order, grandchildren too; a crash inside a child's undo
halts the tree for a person and never undoes twice; cancel-and-compensate of a parent stops
and compensates its sub-runs; ``agent.run_saga`` makes any agent's run a saga, for good."""

from __future__ import annotations

import dataclasses

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.simulation.invariants import saga_violations
from tests.support.doubles import Crash


class Tree:
    """``<p>-trip`` (a saga unless told) books a flight, asks ``<p>-hotels`` (which books a
    hotel and a car, or waits for approval of the car), then charges the card (declined).
    With ``middle``, the hotels agent sits one level lower, behind ``<p>-desk``, which only
    delegates. Effects and undos are counted here, outside the journal."""

    def __init__(
        self,
        prefix: str,
        *,
        charge: str = "abort",
        car: str = "ok",
        undo_car: str = "ok",
        middle: bool = False,
        saga: bool = True,
    ) -> None:
        self.effects: list[str] = []
        self.undos: list[str] = []
        me = self

        def undo(what: str):
            def fn(args, result, ctx):
                me.undos.append(what)
                if what == "car" and undo_car == "crash" and me.undos.count("car") == 1:
                    raise Crash()  # the undo happened; the process died before its outcome
                return {"cancelled": result["booking"]}

            return fn

        @da.tool(compensate=undo("flight"))
        def book_flight(to: str) -> dict:
            me.effects.append("flight")
            return {"booking": f"F-{to}"}

        @da.tool(compensate=undo("hotel"))
        def book_hotel(city: str) -> dict:
            me.effects.append("hotel")
            return {"booking": f"H-{city}"}

        @da.tool(compensate=undo("car"), requires_approval=car == "gated")
        def book_car(city: str) -> dict:
            me.effects.append("car")
            if car == "unknown":
                raise da.ToolOutcomeUnknown("the car API timed out")
            return {"booking": f"C-{city}"}

        @da.tool
        def charge_card(cents: int) -> dict:
            me.effects.append("charge")
            if charge == "abort":
                raise da.SagaAborted("the card was declined")
            return {"charged": cents}

        self.hotels = da.Agent(
            f"{prefix}-hotels",
            ScriptedModel(
                [
                    scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
                    scripted.calls(scripted.call("book_car", {"city": "LIS"})),
                    scripted.text("hotel and car booked"),
                ]
            ),
            "Book a hotel and a car.",
            [book_hotel, book_car],
        )
        below = self.hotels
        if middle:
            below = da.Agent(
                f"{prefix}-desk",
                ScriptedModel(
                    [
                        scripted.calls(scripted.call(self.hotels.name, {"input": "LIS"})),
                        scripted.text("desk done"),
                    ]
                ),
                "Delegate.",
                [self.hotels.as_tool()],
            )
        self.model = ScriptedModel(
            [
                scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                scripted.calls(scripted.call(below.name, {"input": "LIS"})),
                scripted.calls(scripted.call("charge_card", {"cents": 500})),
                scripted.text("booked"),
            ]
        )
        self.agent = da.Agent(
            f"{prefix}-trip",
            self.model,
            "Book a trip.",
            [book_flight, below.as_tool(), charge_card],
            saga=saga,
        )


def journal_names(store, run_id):
    return [r.name for r in Journal(store).records(run_id)]


def assert_sagas_sound(store, *run_ids):
    for run_id in run_ids:
        assert saga_violations(Journal(store).records(run_id)) == [], run_id


def test_a_saga_spanning_a_sub_agent_undoes_the_childs_calls_in_its_place(store):
    trip = Tree("st1")
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run("s1", "go", store=store)
    assert info.value.details["undone"] == ["call_2_1", "call_1_1"]
    assert trip.effects == ["flight", "hotel", "car", "charge"]
    # the child's calls count where the parent's call completed: after the flight
    assert trip.undos == ["car", "hotel", "flight"]
    child = "s1/call_2_1"
    assert store.get_run(child).status == "compensated"
    assert store.get_run("s1").status == "compensated"
    undo = Journal(store).get("s1", names.compensate("call_2_1"))
    assert undo.get("result") == {
        "sub_run": child,
        "undone": ["call_2_1", "call_1_1"],
        "failed": [],
    }
    # the child's rollback is its own: the abort after its end, each undo behind a marker
    child_names = journal_names(store, child)
    assert child_names.index("run:complete") < child_names.index("saga:abort")
    assert child_names.index("attempt:compensate:call_2_1:1") < child_names.index(
        "compensate:call_2_1"
    )
    assert child_names[-1] == "run:compensated"
    abort = Journal(store).get(child, names.SAGA_ABORT)
    assert abort.get("cause")["code"] == "saga.parent_aborted"
    assert_sagas_sound(store, "s1", child)
    # over: driving either again undoes nothing more, and a finished child stays compensated
    with pytest.raises(da.SagaAborted):
        trip.agent.run("s1", None, store=store)
    with pytest.raises(da.SagaAborted):
        da.resume(child, store=store)
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run(child).status == "compensated"


def test_grandchildren_are_rolled_back_too(store):
    trip = Tree("st2", middle=True)
    with pytest.raises(da.SagaAborted):
        trip.agent.run("s2", "go", store=store)
    assert trip.undos == ["car", "hotel", "flight"]
    for run_id in ("s2", "s2/call_2_1", "s2/call_2_1/call_1_1"):
        assert store.get_run(run_id).status == "compensated", run_id
    middle = Journal(store).get("s2/call_2_1", names.compensate("call_1_1"))
    assert middle.get("result")["sub_run"] == "s2/call_2_1/call_1_1"
    assert_sagas_sound(store, "s2", "s2/call_2_1", "s2/call_2_1/call_1_1")


def test_a_crash_inside_a_childs_undo_halts_the_tree_and_never_undoes_twice(store):
    trip = Tree("st3", undo_car="crash")
    with pytest.raises(Crash):
        trip.agent.run("s3", "go", store=store)
    child = "s3/call_2_1"
    assert trip.undos == ["car"]
    assert store.get_run("s3").status == "compensating"
    calls = trip.model.requests
    for _ in range(2):  # the parent's rollback reaches the child, which halts: so does the tree
        with pytest.raises(da.OutcomeUnknown) as info:
            trip.agent.run("s3", None, store=store)
        assert info.value.details["paused_run_id"] == child
        assert info.value.details["halts"] == ["compensate:call_2_1"]
    assert trip.undos == ["car"]  # never again on a guess
    assert store.get_run("s3").status == "halted" and store.get_run(child).status == "halted"
    [halt] = store.list_halts(run_id=child)
    assert halt.op_id == "compensate:call_2_1"
    # the person says the car was cancelled: the child's rollback, then the parent's, go on
    da.resolve_halt(
        child,
        "compensate:call_2_1",
        {"cancelled": "C-LIS"},
        evidence="rental desk",
        by="ann",
        store=store,
    )
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run(child).status == "compensated"
    assert store.get_run("s3").status == "compensated"
    assert trip.model.requests == calls  # the forward path never ran again
    assert_sagas_sound(store, "s3", child)


def test_cancel_and_compensate_of_a_parent_compensates_its_paused_sub_run(store):
    trip = Tree("st4", car="gated", charge="ok")
    with pytest.raises(da.ApprovalPending) as info:
        trip.agent.run("s4", "go", store=store)
    child = "s4/call_2_1"
    assert info.value.details["paused_run_id"] == child
    da.cancel("s4", compensate=True, reason="trip called off", by="ann", store=store)
    # the child's hotel (its call had no outcome in the parent: the latest), then the flight
    assert trip.undos == ["hotel", "flight"]
    assert "car" not in trip.effects and "charge" not in trip.effects
    [request] = store.list_approval_requests(run_id=child, status=None)
    assert request.status == "withdrawn"
    assert store.get_run(child).status == "compensated"
    run = store.get_run("s4")
    assert run.status == "compensated" and run.last_error["code"] == "saga.cancelled"
    # a late approval of the withdrawn call is refused and runs nothing
    with pytest.raises(da.DurableAgentsError):
        da.approve(child, "call_2_1", approved=True, by="ann", store=store)
    assert "car" not in trip.effects
    assert_sagas_sound(store, "s4", child)


def test_cancel_and_compensate_of_a_plain_parent_compensates_the_tree(store):
    """The parent is no saga, but a sub-agent has undos: cancel-and-compensate rolls back."""
    trip = Tree("st5", car="gated", charge="ok", saga=False)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("s5", "go", store=store)
    da.cancel("s5", compensate=True, by="ann", store=store)
    assert trip.undos == ["hotel", "flight"]
    assert store.get_run("s5/call_2_1").status == "compensated"


def test_an_unknown_outcome_in_a_child_halts_the_trees_rollback_until_a_person_decides(store):
    trip = Tree("st6", car="unknown", charge="ok")
    with pytest.raises(da.OutcomeUnknown):
        trip.agent.run("s6", "go", store=store)
    child = "s6/call_2_1"
    da.cancel("s6", compensate=True, by="ann", store=store)
    assert trip.undos == []  # nothing undone before the person says what the car call did
    assert store.get_run("s6").status == "halted"
    assert store.get_run(child).status == "halted"
    da.resolve_halt(
        child, "call_2_1", {"booking": "C-LIS"}, evidence="rental desk", by="ann", store=store
    )
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run("s6").status == "compensated"
    assert_sagas_sound(store, "s6", child)


def test_a_failed_child_s_effects_are_undone_when_the_parent_aborts(store):
    """A child that failed for good (not a saga itself) left a hotel booked: the parent's
    rollback undoes it, though the parent's call of it was an error."""
    trip = Tree("st7")
    trip.hotels.model.turns[1] = scripted.calls(scripted.call("no_such_tool", {}))
    trip.hotels.max_turns = 2  # the child ends with a budget error after the hotel
    with pytest.raises(da.SagaAborted):
        trip.agent.run("s7", "go", store=store)
    child = "s7/call_2_1"
    assert Journal(store).get("s7", names.tool("call_2_1")).get("is_error")
    assert trip.undos == ["hotel", "flight"]
    assert store.get_run(child).status == "compensated"
    assert_sagas_sound(store, "s7", child)


# -- agent.run_saga -----------------------------------------------------------------------


def test_run_saga_makes_a_plain_agent_s_run_a_saga_and_a_resume_keeps_it(store):
    plain = Tree("st8", car="gated", saga=False)
    with pytest.raises(da.ApprovalPending):  # control: the same tree, run plainly
        plain.agent.run("p8", "go", store=store)
    da.approve("p8/call_2_1", "call_2_1", approved=True, by="ann", store=store)
    assert store.get_run("p8").status == "finished" and plain.undos == []

    trip = Tree("st9", car="gated", saga=False)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run_saga("s9", "go", store=store)
    assert Journal(store).get("s9", names.RUN_START).get("saga") is True
    # the decision resumes the tree through the plain resume path (a worker's): still a saga
    da.approve("s9/call_2_1", "call_2_1", approved=True, by="ann", store=store)
    assert trip.effects == ["flight", "hotel", "car", "charge"]
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run("s9").status == "compensated"


def test_run_saga_aborts_and_undoes_like_a_saga(store):
    trip = Tree("st10", saga=False)
    with pytest.raises(da.SagaAborted):
        trip.agent.run_saga("s10", "go", store=store)
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run("s10").status == "compensated"
    with pytest.raises(da.SagaAborted):  # resumed plainly: still the saga's end
        trip.agent.run("s10", None, store=store)


def test_run_saga_on_a_run_started_plainly_is_refused_and_changes_nothing(store):
    trip = Tree("st11", car="gated", saga=False)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("s11", "go", store=store)
    before = journal_names(store, "s11")
    with pytest.raises(da.ConfigError) as info:
        trip.agent.run_saga("s11", None, store=store)
    assert info.value.code == "config.saga_mismatch"
    assert journal_names(store, "s11") == before
    assert store.get_run("s11").status == "awaiting_approval"


def test_a_sub_run_cancelled_plainly_keeps_its_effects_and_the_parent_needs_a_person(store):
    trip = Tree("st12", car="gated")
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("s12", "go", store=store)
    child = "s12/call_2_1"
    da.cancel(child, by="ann", store=store)  # the child alone, plainly: its hotel stays
    # the parent's model reads subagent.cancelled and goes on: the card is declined, abort
    assert store.get_run("s12").status == "failed"
    assert trip.undos == ["flight"]
    run = store.get_run("s12")
    assert run.last_error["code"] == "saga.compensation_failed"
    undo = Journal(store).get("s12", names.compensate("call_2_1"))
    assert undo.get("is_error") and undo.get("result")["failed"] == ["call_1_1"]
    assert_sagas_sound(store, "s12", child)


def test_a_failing_undo_in_a_sub_run_fails_the_trees_rollback_after_the_rest(store):
    trip = Tree("st13")
    car = trip.hotels.tools["book_car"]

    def broken(args, result, ctx):
        trip.undos.append("car")
        raise RuntimeError("rental desk closed")

    car.safety = dataclasses.replace(car.safety, compensate=broken)
    with pytest.raises(da.SagaAborted) as info:
        trip.agent.run("s13", "go", store=store)
    assert info.value.code == "saga.compensation_failed"
    assert trip.undos == ["car", "hotel", "flight"]  # the rest still undone, each once
    assert store.get_run("s13/call_2_1").status == "failed"
    assert store.get_run("s13").status == "failed"


def test_a_finished_sub_run_rolling_back_is_refused_a_plain_cancel_as_compensating(store):
    trip = Tree("st14", undo_car="crash")
    with pytest.raises(Crash):
        trip.agent.run("s14", "go", store=store)
    child = "s14/call_2_1"
    assert store.get_run(child).status == "compensating"
    with pytest.raises(da.ConfigError) as info:
        da.cancel(child, by="ann", store=store)
    assert info.value.code == "run.compensating"
    [listed] = [p for p in da.pending(store=store) if p.run_id == child]
    assert listed.status == "compensating"


def test_a_forks_rollback_leaves_the_sub_run_it_references_to_its_source(store):
    """A fork references the source's finished sub-run (``<source>/<call>``, not
    ``<fork>/<call>``): its effects are the source's, so the fork's rollback neither drives
    nor undoes it, nor the source's root-level calls; it names them ``kept``. However many
    forks roll back, nothing the source did is undone by them."""
    trip = Tree("st-fork", charge="ok")
    assert trip.agent.run("sf", "go", store=store).answer == "booked"
    child = "sf/call_2_1"
    source_names = journal_names(store, "sf")
    child_names = journal_names(store, child)
    for _ in range(2):
        fork = da.fork("sf", 2, store=store)
        assert Journal(store).get(fork, names.child("call_2_1")).get("run_id") == child
        da.cancel(
            fork, compensate=True, reason="what if the trip was called off", by="ann", store=store
        )
        assert store.get_run(fork).status == "compensated"
        done = Journal(store).get(fork, names.RUN_COMPENSATED)
        assert (done.get("undone"), done.get("kept")) == ([], ["call_1_1", "call_2_1"])
        assert store.get_run(f"{fork}/call_2_1") is None
        assert_sagas_sound(store, fork)
    assert trip.undos == []
    # the source and its sub-run are not written to
    assert journal_names(store, "sf") == source_names
    assert journal_names(store, child) == child_names
    assert (store.get_run("sf").status, store.get_run(child).status) == ("finished", "finished")


def notifier(name: str, sent: list[str], *, gated: bool) -> da.Agent:
    """An agent with no undos: it sends one SMS (counted in ``sent``), gated or not."""

    @da.tool(requires_approval=gated)
    def send_sms(text: str) -> dict:
        sent.append(text)
        return {"sent": text}

    script = [scripted.calls(scripted.call("send_sms", {"text": "hi"})), scripted.text("sent")]
    return da.Agent(name, ScriptedModel(script), "Notify.", [send_sms])


def test_a_sagas_own_abort_stops_an_unfinished_sub_run_that_has_no_undos(store):
    """A sub-run with nothing to undo, paused on a gated call when its parent's saga aborts
    (a concurrent call declined the card), is rolled back all the same: its request is
    withdrawn and it ends compensated, so nobody can approve an effect of a tree that was
    undone. (Before, it stayed paused, and approving its call sent the SMS.)"""
    effects: list[str] = []
    undos: list[str] = []
    sent: list[str] = []
    child_agent = notifier("sn-notify", sent, gated=True)

    @da.tool(compensate=lambda args, result, ctx: undos.append("flight"))
    def book_flight(to: str) -> dict:
        effects.append("flight")
        return {"booking": f"F-{to}"}

    @da.tool
    def charge_card(cents: int) -> dict:
        effects.append("charge")
        raise da.SagaAborted("the card was declined")

    parent = da.Agent(
        "sn-trip",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                scripted.calls(
                    scripted.call(child_agent.name, {"input": "tell them"}),
                    scripted.call("charge_card", {"cents": 500}),
                ),
                scripted.text("booked"),
            ]
        ),
        "Book a trip.",
        [book_flight, child_agent.as_tool(), charge_card],
        saga=True,
        tool_concurrency=2,
    )
    with pytest.raises(da.SagaAborted):
        parent.run("sn1", "go", store=store)
    child = "sn1/call_2_1"
    assert store.get_run("sn1").status == "compensated" and undos == ["flight"]
    assert store.get_run(child).status == "compensated"
    undo = Journal(store).get("sn1", names.compensate("call_2_1"))
    assert undo.get("result") == {"sub_run": child, "undone": [], "failed": []}
    assert not undo.get("is_error")
    with pytest.raises(da.ApprovalOrphaned):
        da.approve(child, "call_1_1", approved=True, by="ann", store=store)
    assert sent == [] and effects == ["flight", "charge"]
    assert_sagas_sound(store, "sn1", child)


def test_a_finished_sub_run_with_no_undos_is_left_finished_by_its_parents_rollback(store):
    """Its parent's call had no outcome yet (the child ended, the parent had not recorded
    it): the rollback, which reaches it only to stop it, finds it ended and leaves it so."""
    from durable_agents.engine import saga_tree

    sent: list[str] = []
    child_agent = notifier("snf-notify", sent, gated=False)
    parent = da.Agent(
        "snf-parent",
        ScriptedModel(
            [scripted.calls(scripted.call(child_agent.name, {"input": "x"})), scripted.text("ok")]
        ),
        "Delegate.",
        [child_agent.as_tool()],
    )
    parent.run("snf1", "go", store=store)
    child = "snf1/call_1_1"
    outcome, is_error = saga_tree.rollback_child(
        child_agent, store, "snf1", child, {"message": "declined"}
    )
    assert (outcome, is_error) == ({"sub_run": child, "undone": [], "failed": []}, False)
    assert store.get_run(child).status == "finished" and sent == ["hi"]
    assert Journal(store).get(child, names.SAGA_ABORT) is None
