"""What a tool's arguments and results look like on their way in and out of the journal:
``Annotated`` constraints, pydantic-model parameters, and values JSON has no type for
(datetimes, enums, UUIDs, Decimals) — journaled as JSON, handed to the tool as Python."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated

import pydantic
import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


class Speed(enum.Enum):
    SLOW = "slow"
    FAST = "fast"


class Address(pydantic.BaseModel):
    city: str
    zip_code: Annotated[str, pydantic.Field(min_length=4)]


class Opaque:
    """A type pydantic has no schema for."""


SHIP_ARGS = {
    "address": {"city": "Lyon", "zip_code": "69001"},
    "when": "2026-12-01T10:00:00Z",
    "speed": "fast",
    "parcel": "12345678-1234-5678-1234-567812345678",
    "price": "12.50",
}


def records(store, run_id):
    return {r.name: r.body for r in Journal(store).records(run_id)}


def tool_messages(seen):
    return [m for m in seen[-1] if m.role == "tool"]


def run_calls(store, tools, *calls, run_id="r1"):
    seen: list = []
    model = ScriptedModel(
        [scripted.calls(*calls), scripted.text("done")],
        on_request=lambda r: seen.append(r.messages),
    )
    da.Agent("args", model, "", tools).run(run_id, "go", store=store)
    return store.get_run(run_id), seen


# -- Annotated metadata ------------------------------------------------------------------


def make_refund(fired):
    @da.tool
    def refund(
        amount_cents: Annotated[int, pydantic.Field(gt=0, description="What to refund, in cents")],
        note: Annotated[str, pydantic.Field(max_length=10)] = "",
    ) -> dict:
        fired.append(amount_cents)
        return {"refunded": amount_cents}

    return refund


def test_annotated_constraints_reach_the_schema(fired):
    schema = make_refund(fired).parameters
    amount = schema["properties"]["amount_cents"]
    assert amount["exclusiveMinimum"] == 0
    assert amount["description"] == "What to refund, in cents"
    assert schema["properties"]["note"]["maxLength"] == 10
    assert schema["required"] == ["amount_cents"]


def test_an_argument_breaking_an_annotated_constraint_never_reaches_the_tool(store, fired):
    refund = make_refund(fired)
    _, seen = run_calls(
        store,
        [refund],
        scripted.call("refund", {"amount_cents": -500}, id="c1"),
        scripted.call("refund", {"amount_cents": 5, "note": "far too long a note"}, id="c2"),
        scripted.call("refund", {"amount_cents": 700}, id="c3"),
    )
    assert fired == [700]
    bad, long_note, good = tool_messages(seen)
    assert bad.is_error and "amount_cents" in bad.content and "greater than 0" in bad.content
    assert long_note.is_error and "note" in long_note.content
    assert not good.is_error
    journal = records(store, "r1")
    # Refused before any claim: a refused call leaves no attempt marker.
    assert "attempt:c1:1" not in journal and "attempt:c2:1" not in journal
    assert journal["attempt:c3:1"]["arguments"] == {"amount_cents": 700, "note": ""}


# -- pydantic models and JSON-less types in arguments ----------------------------------------


def make_ship(fired, **options):
    @da.tool(**options)
    def ship(address: Address, when: datetime, speed: Speed, parcel: uuid.UUID, price: Decimal):
        """Ship a parcel (a side effect)."""
        fired.append((address, when, speed, parcel, price))
        return {"shipped": address.city}

    return ship


def test_a_side_effect_with_a_model_argument_journals_json_and_gets_the_model(store, fired):
    result, _ = run_calls(store, [make_ship(fired)], scripted.call("ship", SHIP_ARGS, id="c1"))
    assert result.status == "finished"
    [(address, when, speed, parcel, price)] = fired
    assert address == Address(city="Lyon", zip_code="69001")
    assert when == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert speed is Speed.FAST
    assert parcel == uuid.UUID(SHIP_ARGS["parcel"])
    assert price == Decimal("12.50")
    journal = records(store, "r1")
    assert journal["attempt:c1:1"]["arguments"] == SHIP_ARGS
    assert journal["tool:c1"]["result"] == {"shipped": "Lyon"}


def test_a_bad_nested_field_is_an_invalid_call(store, fired):
    bad = {**SHIP_ARGS, "address": {"city": "Lyon", "zip_code": "1"}}
    _, seen = run_calls(store, [make_ship(fired)], scripted.call("ship", bad, id="c1"))
    [msg] = tool_messages(seen)
    assert msg.is_error and "address.zip_code" in msg.content
    assert fired == []


def test_an_approved_edit_of_a_model_argument_runs_exactly_as_approved(store, fired):
    ship = make_ship(fired, requires_approval=True)
    with pytest.raises(da.ApprovalPending):
        run_calls(store, [ship], scripted.call("ship", SHIP_ARGS, id="c1"))
    request = store.get_approval_request("r1", "c1")
    assert request.arguments == SHIP_ARGS
    edit = {**SHIP_ARGS, "address": {"city": "Paris", "zip_code": "75001"}, "price": "9.9"}
    da.approve("r1", "c1", True, by="ann", edit=edit, store=store)
    assert store.get_run("r1").status == "finished"
    [(address, _, _, _, price)] = fired
    assert address == Address(city="Paris", zip_code="75001")
    assert price == Decimal("9.9")
    journal = records(store, "r1")
    assert journal["attempt:c1:1"]["arguments"] == edit
    assert journal["approval:c1"]["edited"]["arguments"] == edit


def test_an_idempotency_key_function_gets_the_python_values(store, fired):
    keys = []

    def key(args):
        keys.append(args)
        return f"{args['parcel']}:{args['when'].date()}"

    _, _ = run_calls(
        store, [make_ship(fired, idempotency_key=key)], scripted.call("ship", SHIP_ARGS)
    )
    assert len(fired) == 1 and isinstance(keys[0]["address"], Address)


def test_argument_types_json_cannot_carry_are_refused_when_the_tool_is_defined():
    with pytest.raises(da.ConfigError, match="Opaque"):

        @da.tool
        def opaque(thing: Opaque) -> None: ...

    with pytest.raises(da.ConfigError, match="secret"):

        @da.tool
        def hidden(secret: Annotated[str, pydantic.Field(exclude=True)]) -> None: ...


def test_a_type_hint_that_cannot_be_resolved_is_refused_naming_the_tool_and_the_hint():
    # This module has ``from __future__ import annotations``: hints are text until read.
    with pytest.raises(da.ConfigError) as info:

        @da.tool
        def book(room: RoomNumber, nights: int) -> str: ...  # type: ignore[name-defined]  # noqa: F821

    assert info.value.code == "config.tool_signature"
    message = str(info.value)
    assert "tool book" in message and "'room'" in message and "RoomNumber" in message
    assert "TYPE_CHECKING" in message, "says how to fix it"

    with pytest.raises(da.ConfigError, match=r"the return type hint .*Ticket"):

        @da.tool
        def issue(n: int) -> Ticket: ...  # type: ignore[name-defined]  # noqa: F821


# -- results JSON has no type for ----------------------------------------------------------


@dataclasses.dataclass
class Receipt:
    number: int
    at: datetime


class Label(pydantic.BaseModel):
    parcel: uuid.UUID
    speed: Speed
    price: Decimal


def test_results_are_journaled_as_json(store):
    at = datetime(2026, 12, 1, 10, tzinfo=UTC)
    parcel = uuid.UUID(SHIP_ARGS["parcel"])

    @da.tool
    def label() -> Label:
        return Label(parcel=parcel, speed=Speed.SLOW, price=Decimal("1.10"))

    @da.tool
    def receipt() -> Receipt:
        return Receipt(7, at)

    @da.tool
    def stamp() -> dict:
        return {"at": at, "id": parcel, "speed": Speed.FAST, "cost": Decimal("3")}

    _, seen = run_calls(
        store,
        [label, receipt, stamp],
        scripted.call("label", {}, id="c1"),
        scripted.call("receipt", {}, id="c2"),
        scripted.call("stamp", {}, id="c3"),
    )
    assert not any(m.is_error for m in tool_messages(seen))
    journal = records(store, "r1")
    assert journal["tool:c1"]["result"] == {"parcel": str(parcel), "speed": "slow", "price": "1.10"}
    assert journal["tool:c2"]["result"] == {"number": 7, "at": "2026-12-01T10:00:00Z"}
    assert journal["tool:c3"]["result"] == {
        "at": "2026-12-01T10:00:00Z",
        "id": str(parcel),
        "speed": "fast",
        "cost": "3",
    }


def test_a_result_json_cannot_hold_is_an_error_result_not_a_crash(store, fired):
    @da.tool
    def weird() -> object:
        fired.append("ran")
        return {"x": object()}

    @da.tool
    def infinite() -> float:
        return float("inf")

    result, seen = run_calls(
        store,
        [weird, infinite],
        scripted.call("weird", {}, id="c1"),
        scripted.call("infinite", {}, id="c2"),
    )
    assert result.status == "finished" and fired == ["ran"]
    first, second = tool_messages(seen)
    assert first.is_error and "JSON cannot hold" in first.content
    assert "ran" in first.content  # the model is told the effect may have happened
    assert second.is_error


def _unrecordable(kind: str) -> object:
    """Results the journal cannot hold: ``object()`` the JSON encoder refuses with a
    TypeError; the others it refused with a bare ValueError or RecursionError."""
    if kind == "object":
        return {"x": object()}
    if kind == "huge-int":
        return {"total": 10**5000}  # past Python's 4300-digit int->str limit
    if kind == "self-list":
        loop: list = ["a"]
        loop.append(loop)
        return loop
    if kind == "self-dict":
        me: dict = {"a": 1}
        me["me"] = me
        return me
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    return {"deep": deep}


@pytest.mark.parametrize("kind", ["object", "huge-int", "self-list", "self-dict", "deep"])
def test_every_unrecordable_result_is_an_error_result_after_one_effect(store, fired, kind):
    """The tool ran (its effect counted once); what it returned cannot be journaled: the
    call's result says so, the run goes on and finishes, and nothing is left claimed, halted
    or half-written — as for any other result JSON cannot hold."""

    @da.tool
    def settle(order: str) -> object:
        """A side effect, not safe to repeat."""
        fired.append(order)
        return _unrecordable(kind)

    result, seen = run_calls(store, [settle], scripted.call("settle", {"order": "o1"}, id="c1"))
    assert result.status == "finished" and fired == ["o1"]
    [message] = tool_messages(seen)
    assert message.is_error and "JSON cannot hold" in message.content
    assert "may have happened" in message.content
    journal = records(store, "r1")
    assert journal["tool:c1"]["is_error"] and "attempt:c1:1" in journal
    assert store.list_halts(run_id="r1") == []
    assert da.resume("r1", store=store).answer == "done" and fired == ["o1"]


def test_identifying_names_arguments_of_the_tool_or_is_refused():
    def pay(memo: str, payee: str, amount_cents: int) -> dict:
        return {}

    made = da.tool(requires_approval=True, identifying=["payee", "amount_cents", "payee"])(pay)
    assert made.identifying == ("payee", "amount_cents")
    assert da.tool(pay).identifying == ()
    with pytest.raises(da.ConfigError, match="'iban', which is not an argument") as info:
        da.tool(identifying=["payee", "iban"])(pay)
    assert info.value.code == "config.tool_identifying"
    with pytest.raises(da.ConfigError, match="must be a list of argument names") as info:
        da.tool(identifying="payee")(pay)
    assert info.value.code == "config.tool_identifying"
