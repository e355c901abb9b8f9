"""The example trip-booking agent: a saga (docs/composition.md).

``trip`` books a flight, then a hotel, then charges the card. Each tool says how to undo
itself (``compensate=``): cancel the flight, cancel the hotel, refund the charge. When a
later step fails for good, the agent's run aborts and the completed bookings are undone,
latest first, each exactly once; the run ends ``compensated``.

The model is a scripted one that reads the request (so the example needs no API key): a
request that mentions a full hotel books the "Full House", which has no rooms; one that
mentions a declined card pays with the test card ending 0002, which the bank declines. The
"systems" the tools touch are the demo's JSON-lines ledger (``example_project.agents``), so
bookings and undos are counted outside the journal. ``python manage.py trip`` tells it.
"""

from __future__ import annotations

from typing import Any

import durable_agents as da
from durable_agents.engine.model import ModelRequest, ModelResponse
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from example_project.agents import record_effect

FULL_HOTEL = "Full House"
DECLINED_CARD = "4000-0000-0000-0002"  # the bank's test card that is always declined


def _cancel_flight(args: dict[str, Any], result: Any, ctx: da.ToolContext) -> dict:
    record_effect("flight_cancelled", booking=result["booking"], key=ctx.idempotency_key)
    return {"cancelled": result["booking"]}


def _cancel_hotel(args: dict[str, Any], result: Any, ctx: da.ToolContext) -> dict:
    record_effect("hotel_cancelled", booking=result["booking"], key=ctx.idempotency_key)
    return {"cancelled": result["booking"]}


def _refund(args: dict[str, Any], result: Any, ctx: da.ToolContext) -> dict:
    record_effect("charge_refunded", charge=result["charge"], key=ctx.idempotency_key)
    return {"refunded": result["charge"]}


@da.tool(compensate=_cancel_flight)
def book_flight(to: str, ctx: da.ToolContext) -> dict:
    """Book a flight to an airport (IATA code); returns the booking."""
    booking = f"FL-{to}-{ctx.idempotency_key[:6]}"
    record_effect("flight_booked", booking=booking, key=ctx.idempotency_key)
    return {"booking": booking}


@da.tool(compensate=_cancel_hotel)
def book_hotel(hotel: str, nights: int, ctx: da.ToolContext) -> dict:
    """Book a hotel for some nights; returns the booking."""
    if hotel == FULL_HOTEL:
        raise da.SagaAborted(f"{hotel} has no rooms left")  # nothing booked: nothing to undo
    booking = f"HT-{ctx.idempotency_key[:6]}"
    record_effect("hotel_booked", booking=booking, hotel=hotel, nights=nights)
    return {"booking": booking}


@da.tool(compensate=_refund)
def charge_card(card: str, cents: int, ctx: da.ToolContext) -> dict:
    """Charge the customer's card; returns the charge."""
    if card == DECLINED_CARD:
        raise da.SagaAborted("the card was declined")
    charge = f"CH-{ctx.idempotency_key[:6]}"
    record_effect("card_charged", charge=charge, cents=cents)
    return {"charge": charge}


class TripModel:
    """Flight, hotel, card, then the answer; the hotel and the card as the request says.
    Deterministic: the same request gets the same turn (a replay or a resume agrees)."""

    model_id = "scripted-trip"

    def generate(self, request: ModelRequest) -> ModelResponse:
        asked = next((m.content for m in request.messages if m.role == "user"), "").lower()
        hotel = FULL_HOTEL if "full" in asked else "Casa Lisboa"
        card = DECLINED_CARD if "declined" in asked else "4242-4242-4242-4242"
        turns = [
            scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
            scripted.calls(scripted.call("book_hotel", {"hotel": hotel, "nights": 3})),
            scripted.calls(scripted.call("charge_card", {"card": card, "cents": 98000})),
            scripted.text("Your trip to Lisbon is booked: flight, 3 nights, paid."),
        ]
        return ScriptedModel(turns, model_id=self.model_id).generate(request)


trip = da.Agent(
    "trip",
    TripModel(),
    "Book the customer's trip: the flight, then the hotel, then charge the card.",
    [book_flight, book_hotel, charge_card],
    saga=True,
)
