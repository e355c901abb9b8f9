"""Work that spans runs is durable work (issue 29), on the in-memory store: a cancel cascade
or a saga's rollback that a crash cut short is finished by whoever touches the tree next
(a drive, a decision, recovery, the sweep); a sub-run busy when its root is cancelled or
aborted stops before its next step; an undo gets the arguments its call ran with; an answer
counts only for the question it was given to. Effects are counted here, outside the
journal."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.simulation.invariants import saga_violations
from tests.support.doubles import Crash


class Booking:
    """``<p>-trip`` (a saga unless told) books a flight, then asks ``<p>-hotels``, which
    books a hotel, then a car (gated unless told), then sends an SMS (no undo; gated with
    ``sms_gated``), then answers. ``during_car`` runs inside the car's call."""

    def __init__(
        self,
        prefix: str,
        *,
        saga: bool = True,
        car_gated: bool = True,
        sms_gated: bool = False,
        during_car=None,
    ) -> None:
        self.effects: list[str] = []
        self.undos: list[str] = []
        me = self

        def undo(what: str):
            def fn(args, result, ctx):
                me.undos.append(what)
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

        @da.tool(compensate=undo("car"), requires_approval=car_gated)
        def book_car(city: str, ctx: da.ToolContext) -> dict:
            me.effects.append("car")
            if during_car is not None:
                during_car(ctx)
            return {"booking": f"C-{city}"}

        @da.tool(requires_approval=sms_gated)
        def send_sms(text: str) -> dict:
            me.effects.append("sms")
            return {"sent": text}

        self.hotels = da.Agent(
            f"{prefix}-hotels",
            ScriptedModel(
                [
                    scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
                    scripted.calls(scripted.call("book_car", {"city": "LIS"})),
                    scripted.calls(scripted.call("send_sms", {"text": "booked"})),
                    scripted.text("hotel and car booked"),
                ]
            ),
            "Book a hotel and a car, then tell the traveller.",
            [book_hotel, book_car, send_sms],
        )
        self.agent = da.Agent(
            f"{prefix}-trip",
            ScriptedModel(
                [
                    scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                    scripted.calls(scripted.call(self.hotels.name, {"input": "LIS"})),
                    scripted.text("booked"),
                ]
            ),
            "Book a trip.",
            [book_flight, self.hotels.as_tool()],
            saga=saga,
        )


CHILD_CALL = "call_2_1"  # the trip's call of the hotels agent
CAR = "call_2_1"  # the hotels agent's car call (its second turn)


def child_of(run_id: str) -> str:
    return f"{run_id}/{CHILD_CALL}"


def sound(store, *run_ids):
    for run_id in run_ids:
        assert saga_violations(Journal(store).records(run_id)) == [], run_id


# -- 1. a cancel cascade cut short ------------------------------------------------------


def test_a_cancel_killed_before_its_cascade_leaves_no_sub_run_that_can_go_on(store, crash_at):
    trip = Booking("cc1", saga=False)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c1", "go", store=store)
    child = child_of("c1")
    crash_at("after-cancel:c1")
    with pytest.raises(Crash):
        da.cancel("c1", by="ann", store=store)
    assert store.get_run("c1").status == "cancelled"
    # The sub-run's call can no longer be approved into an effect under the cancelled root.
    with pytest.raises(da.ApprovalOrphaned):
        da.approve(child, CAR, approved=True, by="ann", store=store)
    assert "car" not in trip.effects
    assert store.get_run(child).status == "cancelled"
    assert [r.status for r in store.list_approval_requests(run_id=child, status=None)] == [
        "withdrawn"
    ]
    cancelled = Journal(store).get(child, names.RUN_CANCELLED)
    assert cancelled.get("cause") == {"code": "run.ancestor_cancelled", "run_id": "c1"}


def test_the_sweep_finishes_a_cancel_cascade_nobody_finished(store, crash_at):
    trip = Booking("cc2", saga=False)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("c2", "go", store=store)
    child = child_of("c2")
    crash_at("after-cancel:c2")
    with pytest.raises(Crash):
        da.cancel("c2", by="ann", store=store)
    assert store.get_run(child).status == "awaiting_approval"
    assert wake_timers(store=store) == [child]
    assert store.get_run(child).status == "cancelled"
    assert store.list_approval_requests() == []
    assert wake_timers(store=store) == []
    assert trip.effects == ["flight", "hotel"]


# -- 3. a rollback cut short ------------------------------------------------------------


def declined_trip(prefix: str, undos: list[str]) -> da.Agent:
    """A saga: book a flight, then a hotel, then charge the card, which is declined."""

    @da.tool(compensate=lambda args, result, ctx: undos.append("flight"))
    def book_flight(to: str) -> dict:
        return {"booking": f"F-{to}"}

    @da.tool(compensate=lambda args, result, ctx: undos.append("hotel"))
    def book_hotel(city: str) -> dict:
        return {"booking": f"H-{city}"}

    @da.tool
    def charge_card(cents: int) -> dict:
        raise da.SagaAborted("the card was declined")

    return da.Agent(
        f"{prefix}-trip",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
                scripted.calls(scripted.call("charge_card", {"cents": 500})),
                scripted.text("booked"),
            ]
        ),
        "Book a trip, then pay.",
        [book_flight, book_hotel, charge_card],
        saga=True,
    )


@pytest.mark.parametrize("point", ["after-saga-abort", "after-compensate:call_2_1"])
def test_recovery_finishes_a_rollback_killed_midway(store, crash_at, clock, point):
    undos: list[str] = []
    trip = declined_trip("rb", undos)
    crash_at(point)
    with pytest.raises(Crash):
        trip.run("r3", "go", store=store)
    assert store.get_run("r3").status == "compensating"
    [listed] = da.pending(store=store)
    assert listed.status == "compensating"
    clock.advance(31)  # the dead driver's lease lapses
    assert recover(store=store, interval=0) == ["r3"]
    assert store.get_run("r3").status == "compensated"
    assert undos == ["hotel", "flight"]
    assert recover(store=store, interval=0) == []
    sound(store, "r3")


# -- 4. a busy sub-run under an abort or a cancel ----------------------------------------


def test_cancel_and_compensate_stops_a_sub_run_busy_in_a_call_before_its_next_step(store):
    cancelled = []

    def cancel_the_trip(ctx):
        if not cancelled:
            cancelled.append(True)
            da.cancel("b4", compensate=True, by="ann", store=store)

    trip = Booking("bb4", during_car=cancel_the_trip)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("b4", "go", store=store)
    child = child_of("b4")
    # The decision drives the sub-run (inline dispatch); inside its car call, the trip is
    # cancelled and compensated. The car was in flight: it is undone; nothing comes after.
    da.approve(child, CAR, approved=True, by="ann", store=store)
    assert trip.effects == ["flight", "hotel", "car"]
    assert trip.undos == ["car", "hotel", "flight"]
    assert store.get_run(child).status == "compensated"
    assert store.get_run("b4").status == "compensated"
    sound(store, "b4", child)


def test_a_plain_cancel_stops_a_busy_sub_run_before_it_asks_anything_new(store):
    cancelled = []

    def cancel_the_trip(ctx):
        if not cancelled:
            cancelled.append(True)
            da.cancel("b5", by="ann", store=store)

    trip = Booking("bb5", saga=False, sms_gated=True, during_car=cancel_the_trip)
    with pytest.raises(da.ApprovalPending):
        trip.agent.run("b5", "go", store=store)
    child = child_of("b5")
    da.approve(child, CAR, approved=True, by="ann", store=store)
    assert trip.effects == ["flight", "hotel", "car"]
    assert store.get_run(child).status == "cancelled"
    assert store.list_approval_requests() == []  # no request for the SMS, ever
    assert Journal(store).get(child, names.model(3)) is None  # no step after the car
    assert Journal(store).get(child, names.tool(CAR)) is not None  # the car's result kept


# -- 5. the undo gets the arguments its call ran with ----------------------------------


def test_the_undo_of_an_edited_idempotent_call_gets_the_edited_arguments(store):
    undone: list[dict] = []
    booked: list[str] = []

    @da.tool(
        idempotent=True,
        requires_approval=True,
        compensate=lambda args, result, ctx: undone.append(args),
    )
    def book_seat(seat: str) -> dict:
        booked.append(seat)
        return {"seat": seat}

    @da.tool
    def pay(cents: int) -> dict:
        raise da.SagaAborted("the card was declined")

    agent = da.Agent(
        "seats",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_seat", {"seat": "1A"})),
                scripted.calls(scripted.call("pay", {"cents": 900})),
                scripted.text("done"),
            ]
        ),
        "Book a seat, then pay.",
        [book_seat, pay],
        saga=True,
    )
    with pytest.raises(da.ApprovalPending):
        agent.run("e5", "go", store=store)
    da.approve("e5", "call_1_1", approved=True, edit={"seat": "2B"}, by="ann", store=store)
    assert booked == ["2B"]
    assert undone == [{"seat": "2B"}]
    assert store.get_run("e5").status == "compensated"


# -- refusals: a compensating run waits for nothing ---------------------------------------


def test_a_signal_an_answer_or_a_message_to_a_compensating_run_is_refused(store, crash_at):
    trip = declined_trip("rf", [])
    crash_at("after-saga-abort")
    with pytest.raises(Crash):
        trip.run("rf1", "go", store=store)
    before = [r.name for r in Journal(store).records("rf1")]
    for send in (
        lambda: da.signal("rf1", "paid", {"ok": True}, store=store),
        lambda: da.enqueue("rf1", "inbox", "k1", {"ok": True}, store=store),
        lambda: da.answer_interrupt("rf1", "ok", "yes", by="ann", store=store),
    ):
        with pytest.raises(da.DurableAgentsError) as info:
            send()
        assert info.value.code == "run.compensating"
    assert [r.name for r in Journal(store).records("rf1")] == before


# -- 2. an answer is for the question it was given to --------------------------------------


def refund_agent(prefix: str, amounts: dict[str, int], refunded: list[int]) -> da.Agent:
    """Refunds what order 7 is owed now (read when the tool runs), after staff say yes."""

    @da.tool(idempotent=True)
    def refund(order: str, ctx: da.ToolContext) -> dict:
        cents = amounts[order]
        ok = ctx.interrupt(
            "confirm",
            prompt=f"Refund {cents} cents on order {order}?",
            schema={"type": "string", "enum": ["yes", "no"]},
        )
        if ok == "yes":
            refunded.append(cents)
        return {"refunded": cents if ok == "yes" else 0}

    return da.Agent(
        f"{prefix}-refunds",
        ScriptedModel(
            [scripted.calls(scripted.call("refund", {"order": "7"})), scripted.text("done")]
        ),
        "Refund order 7.",
        [refund],
    )


def test_an_answer_is_never_taken_for_a_question_that_changed_since(store):
    amounts, refunded = {"7": 100}, []
    agent = refund_agent("q1", amounts, refunded)
    with pytest.raises(da.InterruptPending):
        agent.run("q1", "go", store=store)
    [wait] = da.pending(store=store)[0].waits
    assert wait.prompt == "Refund 100 cents on order 7?"
    amounts["7"] = 5000  # what the tool will ask when it runs again
    # Staff answer the question they were shown; the tool, run again, asks another one.
    outcome = da.answer_interrupt(
        "q1", "confirm", "yes", by="ann", prompt="Refund 100 cents on order 7?", store=store
    )
    assert outcome.recorded
    assert refunded == []  # the yes was for 100 cents, never for 5000
    assert store.get_run("q1").status == "awaiting_input"
    [wait] = da.pending(store=store)[0].waits
    assert wait.prompt == "Refund 5000 cents on order 7?"
    # An answer to the old question (a page shown before) is refused, and writes nothing.
    before = [r.name for r in Journal(store).records("q1")]
    with pytest.raises(da.DurableAgentsError) as info:
        da.answer_interrupt(
            "q1", "confirm", "yes", by="bob", prompt="Refund 100 cents on order 7?", store=store
        )
    assert info.value.code == "interrupt.question_changed"
    assert [r.name for r in Journal(store).records("q1")] == before
    da.answer_interrupt(
        "q1", "confirm", "no", by="ann", prompt="Refund 5000 cents on order 7?", store=store
    )
    assert store.get_run("q1").status == "finished" and refunded == []


def test_an_answer_stands_for_the_same_question_asked_again(store):
    amounts, refunded = {"7": 100}, []
    agent = refund_agent("q2", amounts, refunded)
    with pytest.raises(da.InterruptPending):
        agent.run("q2", "go", store=store)
    da.answer_interrupt("q2", "confirm", "yes", by="ann", store=store)
    assert refunded == [100] and store.get_run("q2").status == "finished"
