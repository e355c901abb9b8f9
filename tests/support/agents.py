"""Agents the test suite's child processes drive (listed in tests/settings.py AGENTS).

Every tool fire is counted in a table of its own (``test_effects``), written on a separate
autocommit connection: outside the journal, so a crash test can count side effects the
journal knows nothing about.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Literal

import psycopg
import pydantic
from django.db import connections

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

EFFECTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS test_effects ("
    " id bigserial PRIMARY KEY, run_id text NOT NULL, call_id text NOT NULL,"
    " tool text NOT NULL, key text NOT NULL DEFAULT '')"
)


_table_ready: set[str] = set()


def effects_connection() -> psycopg.Connection:
    settings = connections["default"].settings_dict
    conn = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        host=settings["HOST"],
        port=settings["PORT"],
        autocommit=True,
    )
    if settings["NAME"] not in _table_ready:
        try:
            conn.execute(EFFECTS_TABLE)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # another process or thread created it at the same moment
        _table_ready.add(settings["NAME"])
    return conn


def count_effects(run_id: str) -> dict[str, int]:
    with effects_connection() as conn:
        rows = conn.execute(
            "SELECT call_id, count(*) FROM test_effects WHERE run_id = %s GROUP BY call_id",
            [run_id],
        ).fetchall()
    return {call_id: n for call_id, n in rows}


def fire(ctx: da.ToolContext, tool: str) -> None:
    with effects_connection() as conn:
        conn.execute(
            "INSERT INTO test_effects (run_id, call_id, tool, key) VALUES (%s, %s, %s, %s)",
            [ctx.run_id, ctx.call_id, tool, ctx.idempotency_key],
        )
    if os.environ.get("DA_CRASH_INSIDE") == ctx.call_id:
        os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its result never will


SAFETY = {
    "read_only": {"read_only": True},
    "idempotent": {"idempotent": True},
    "keyed": {"idempotency_key": lambda args: f"act:{args['item']}"},
    "side_effect": {},
}

# Two calls in turn 1, one in turn 2, then the answer.
CRASH_SCRIPT = [
    scripted.calls(scripted.call("act", {"item": "x"}), scripted.call("act", {"item": "y"})),
    scripted.calls(scripted.call("act", {"item": "z"})),
    scripted.text("all done"),
]


def _crash_agent(safety: str, concurrency: int) -> da.Agent:
    @da.tool(**SAFETY[safety])
    def act(item: str, ctx: da.ToolContext) -> dict:
        """Do something to an item."""
        fire(ctx, "act")
        return {"done": item}

    suffix = f"-c{concurrency}" if concurrency > 1 else ""
    return da.Agent(
        f"crash-{safety}{suffix}",
        ScriptedModel(CRASH_SCRIPT),
        "Act on every item.",
        [act],
        tool_concurrency=concurrency,
    )


crash_agents = [_crash_agent(s, 1) for s in SAFETY] + [_crash_agent("side_effect", 2)]


@da.tool(read_only=True)
def lookup(order_id: str) -> dict:
    """Look up an order."""
    return {"order": order_id, "status": "shipped"}


def _refund_summary(args: dict) -> str:
    return f"Refund {args['cents'] / 100:.2f} to order {args['order_id']}"


@da.tool(requires_approval=True, summary=_refund_summary)
def refund(order_id: str, cents: int, ctx: da.ToolContext) -> dict:
    """Refund an order (staff approve first)."""
    fire(ctx, "refund")
    return {"refunded": cents}


echo = da.Agent(
    "echo",
    ScriptedModel(
        [
            scripted.calls(scripted.call("lookup", {"order_id": "7"})),
            scripted.text("order 7 shipped"),
        ]
    ),
    "Answer about orders.",
    [lookup],
)

gated = da.Agent(
    "gated",
    ScriptedModel(
        [
            scripted.calls(scripted.call("refund", {"order_id": "7", "cents": 500})),
            scripted.text("refunded"),
        ]
    ),
    "Refund when asked.",
    [refund],
)


REQUESTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS test_model_requests (id bigserial PRIMARY KEY, body text NOT NULL)"
)


def _requests_table(conn: psycopg.Connection) -> None:
    try:
        conn.execute(REQUESTS_TABLE)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        pass  # another process created it at the same moment


def record_request(request: Any) -> None:
    """Keep a model request's messages outside the journal (table ``test_model_requests``):
    what a provider was really sent, for tests that check it from another process."""
    body = json.dumps(
        [{"role": m.role, "content": m.content} for m in request.messages], ensure_ascii=False
    )
    with effects_connection() as conn:
        _requests_table(conn)
        conn.execute("INSERT INTO test_model_requests (body) VALUES (%s)", [body])


def requests_containing(text: str) -> int:
    """How many recorded model requests contain ``text``."""
    with effects_connection() as conn:
        _requests_table(conn)
        row = conn.execute(
            "SELECT count(*) FROM test_model_requests WHERE strpos(body, %s) > 0", [text]
        ).fetchone()
    return int(row[0]) if row else 0


# ``gated`` whose model records every request it is sent (``record_request``).
gated_recorded = da.Agent(
    "gated_recorded",
    ScriptedModel(
        [
            scripted.calls(scripted.call("refund", {"order_id": "7", "cents": 500})),
            scripted.text("refunded"),
        ],
        on_request=record_request,
    ),
    "Refund when asked.",
    [refund],
)


@da.tool(approval=da.Quorum(need=2, group="finance"))
def pay(invoice: str, cents: int, ctx: da.ToolContext) -> dict:
    """Pay an invoice (two of group finance approve first)."""
    fire(ctx, "pay")
    return {"paid": cents}


# Two of group ``finance`` approve its payout first.
quorum = da.Agent(
    "quorum",
    ScriptedModel(
        [
            scripted.calls(scripted.call("pay", {"invoice": "inv-1", "cents": 9900})),
            scripted.text("paid"),
        ]
    ),
    "Pay invoices.",
    [pay],
)


@da.tool
def charge(card: str) -> dict:
    """Charge a card; the gateway always times out after the request was sent."""
    raise da.ToolOutcomeUnknown("the gateway timed out after the request was sent")


# Its only call's outcome is unknown: every run halts (``OutcomeUnknown``) until a person
# records what happened; then it answers "charged".
halting = da.Agent(
    "halting",
    ScriptedModel(
        [scripted.calls(scripted.call("charge", {"card": "4242"})), scripted.text("charged")]
    ),
    "Charge cards.",
    [charge],
)


# -- waits (issue 15) -----------------------------------------------------------------------


@da.tool(read_only=True)
def ask_warehouse(order: str, ctx: da.ToolContext) -> str:
    """Ask staff which warehouse ships the order (re-runs until answered: read-only)."""
    fire(ctx, "ask_warehouse")
    answer = ctx.interrupt(
        "warehouse",
        f"Which warehouse ships {order}?",
        schema={"type": "string", "enum": ["BER", "HAM"]},
    )
    if os.environ.get("DA_CRASH_AFTER_ANSWER") == ctx.call_id:
        os.kill(os.getpid(), signal.SIGKILL)  # the answer is in; the call's result never is
    return answer


@da.tool
def ship(order: str, warehouse: str, ctx: da.ToolContext) -> dict:
    """Ship an order from a warehouse (a side effect: at most once)."""
    fire(ctx, "ship")
    return {"shipped": order, "from": warehouse}


# Asks staff for the warehouse, then ships from it (the script ships from HAM).
waiting = da.Agent(
    "waiting",
    ScriptedModel(
        [
            scripted.calls(scripted.call("ask_warehouse", {"order": "o-7"})),
            scripted.calls(scripted.call("ship", {"order": "o-7", "warehouse": "HAM"})),
            scripted.text("shipped"),
        ]
    ),
    "Ship orders.",
    [ask_warehouse, ship],
)


class Packing(pydantic.BaseModel):
    """How staff say an order is packed (the admin's form is generated from this schema)."""

    warehouse: Literal["BER", "HAM"] = pydantic.Field(description="where it ships from")
    boxes: int = pydantic.Field(ge=1, le=10, description="boxes to pack (1 to 10)")


@da.tool(read_only=True)
def ask_packing(order: str, ctx: da.ToolContext) -> dict:
    """Ask staff how to pack the order (re-runs until answered: read-only)."""
    fire(ctx, "ask_packing")
    got = ctx.interrupt("packing", f"How should {order} be packed?", schema=Packing)
    return got.model_dump()


# Asks staff how to pack (a typed answer), then ships (the script ships o-8 from HAM).
packing = da.Agent(
    "packing",
    ScriptedModel(
        [
            scripted.calls(scripted.call("ask_packing", {"order": "o-8"})),
            scripted.calls(scripted.call("ship", {"order": "o-8", "warehouse": "HAM"})),
            scripted.text("packed"),
        ]
    ),
    "Pack and ship orders.",
    [ask_packing, ship],
)


@da.tool(idempotent=True)
def read_inbox(box: str, ctx: da.ToolContext) -> str:
    """Handle each message of ``box`` (one ``handle:<key>`` effect per handling) until one
    says stop. Kill points: DA_CRASH_BEFORE_ACK / DA_CRASH_AFTER_ACK name a message key."""
    while True:
        msg = ctx.receive(box)
        with effects_connection() as conn:
            conn.execute(
                "INSERT INTO test_effects (run_id, call_id, tool, key) VALUES (%s, %s, %s, %s)",
                [ctx.run_id, f"handle:{msg.key}", "handle", msg.key],
            )
        if os.environ.get("DA_CRASH_BEFORE_ACK") == msg.key:
            os.kill(os.getpid(), signal.SIGKILL)  # handled, not acked
        ctx.ack(box, msg.key)
        if os.environ.get("DA_CRASH_AFTER_ACK") == msg.key:
            os.kill(os.getpid(), signal.SIGKILL)  # acked; the call's result never is
        if msg.payload == "stop":
            return "read"


# Reads the "box" channel until a message says stop.
inbox = da.Agent(
    "inbox",
    ScriptedModel(
        [scripted.calls(scripted.call("read_inbox", {"box": "box"})), scripted.text("all read")]
    ),
    "Read the inbox.",
    [read_inbox],
)


# -- sub-agents (issue 16) ------------------------------------------------------------------


@da.tool(requires_approval=True)
def wire_money(to: str, ctx: da.ToolContext) -> dict:
    """Wire money (a gated side effect: at most once, after a staff decision)."""
    fire(ctx, "wire_money")
    return {"wired": to}


@da.tool
def post_letter(to: str, ctx: da.ToolContext) -> dict:
    """Post a letter (a side effect: at most once)."""
    fire(ctx, "post_letter")
    return {"posted": to}


def _tree(prefix: str, leaf_tool: da.Tool) -> list[da.Agent]:
    """``<prefix>-root`` -> ``<prefix>-middle`` -> ``<prefix>-leaf``, whose one call is
    ``leaf_tool(to="bob")``; every call id is ``call_1_1``, so the leaf is
    ``<run>/call_1_1/call_1_1``."""
    leaf = da.Agent(
        f"{prefix}-leaf",
        ScriptedModel(
            [
                scripted.calls(scripted.call(leaf_tool.name, {"to": "bob"})),
                scripted.text("leaf done"),
            ]
        ),
        "Do the errand.",
        [leaf_tool],
    )
    middle = da.Agent(
        f"{prefix}-middle",
        ScriptedModel(
            [
                scripted.calls(scripted.call(leaf.name, {"input": "errand"})),
                scripted.text("middle done"),
            ]
        ),
        "Delegate the errand.",
        [leaf.as_tool()],
    )
    root = da.Agent(
        f"{prefix}-root",
        ScriptedModel(
            [
                scripted.calls(scripted.call(middle.name, {"input": "plan"})),
                scripted.text("root done"),
            ]
        ),
        "Delegate the plan.",
        [middle.as_tool()],
    )
    return [root, middle, leaf]


gated_tree = _tree("gtree", wire_money)
side_tree = _tree("stree", post_letter)


# A saga (issue 16): book a flight, then a hotel, then charge a card, which is declined:
# the hotel, then the flight, are undone. Effects and undos are counted in ``test_effects``
# (an undo's call id is ``compensate:<call>``).
def _undo(what: str) -> Any:
    def undo(args: dict, result: Any, ctx: da.ToolContext) -> dict:
        fire(ctx, f"undo_{what}")
        return {"cancelled": result["booking"]}

    return undo


@da.tool(compensate=_undo("flight"))
def book_flight(to: str, ctx: da.ToolContext) -> dict:
    """Book a flight."""
    fire(ctx, "book_flight")
    return {"booking": f"F-{to}"}


@da.tool(compensate=_undo("hotel"))
def book_hotel(city: str, ctx: da.ToolContext) -> dict:
    """Book a hotel."""
    fire(ctx, "book_hotel")
    return {"booking": f"H-{city}"}


@da.tool
def charge_trip(cents: int, ctx: da.ToolContext) -> dict:
    """Charge the card; it is declined."""
    fire(ctx, "charge_trip")
    raise da.SagaAborted("the card was declined")


saga_trip = da.Agent(
    "saga-trip",
    ScriptedModel(
        [
            scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
            scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
            scripted.calls(scripted.call("charge_trip", {"cents": 50000})),
            scripted.text("booked"),
        ]
    ),
    "Book a trip: flight, hotel, then charge the card.",
    [book_flight, book_hotel, charge_trip],
    saga=True,
)


@da.tool(requires_approval=True)
def charge_trip_gated(cents: int, ctx: da.ToolContext) -> dict:
    """Charge the card (staff approve first)."""
    fire(ctx, "charge_trip")
    return {"charged": cents}


# ``DA_SAGA_GATED_V2=1`` (a child process's environment): the gated trip below deployed again
# with other instructions under ``on_drift="error"``: a run started before fails for good
# when driven, so its saga aborts by itself while its charge awaits approval.
_SAGA_GATED_V2 = os.environ.get("DA_SAGA_GATED_V2") == "1"

# The same trip, but the charge waits for staff: "cancel and compensate" undoes the bookings.
saga_gated = da.Agent(
    "saga-gated",
    ScriptedModel(
        [
            scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
            scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
            scripted.calls(scripted.call("charge_trip_gated", {"cents": 50000})),
            scripted.text("booked"),
        ]
    ),
    "Book the cheapest trip: flight, hotel, then charge the card."
    if _SAGA_GATED_V2
    else "Book a trip: flight, hotel, then charge the card.",
    [book_flight, book_hotel, charge_trip_gated],
    saga=True,
    on_drift="error" if _SAGA_GATED_V2 else None,
)


# A saga across a sub-agent (issue 16): the trip books a flight, asks ``saga-tree-hotels``
# (which books a hotel, then a car), then charges the card, which is declined: the child's
# car and hotel (in its own journal, its own undos), then the flight, are undone. The child
# run is ``<run>/call_2_1``; its undos' call ids are ``compensate:call_2_1`` (the car) and
# ``compensate:call_1_1`` (the hotel), the trip's flight undo ``compensate:call_1_1`` too,
# each under its own run id in ``test_effects``.
@da.tool(compensate=_undo("car"))
def book_car(city: str, ctx: da.ToolContext) -> dict:
    """Book a car."""
    fire(ctx, "book_car")
    return {"booking": f"C-{city}"}


@da.tool(compensate=_undo("car"), requires_approval=True)
def book_car_gated(city: str, ctx: da.ToolContext) -> dict:
    """Book a car (staff approve first)."""
    fire(ctx, "book_car")
    return {"booking": f"C-{city}"}


def _saga_tree(prefix: str, car: da.Tool) -> list[da.Agent]:
    hotels = da.Agent(
        f"{prefix}-hotels",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
                scripted.calls(scripted.call(car.name, {"city": "LIS"})),
                scripted.text("hotel and car booked"),
            ]
        ),
        "Book a hotel, then a car.",
        [book_hotel, car],
    )
    trip = da.Agent(
        prefix,
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                scripted.calls(scripted.call(hotels.name, {"input": "LIS"})),
                scripted.calls(scripted.call("charge_trip", {"cents": 50000})),
                scripted.text("booked"),
            ]
        ),
        "Book a trip: flight, then a hotel and a car, then charge the card.",
        [book_flight, hotels.as_tool(), charge_trip],
        saga=True,
    )
    return [trip, hotels]


saga_tree = _saga_tree("saga-tree", book_car)
# The same, but the child's car waits for staff: "cancel and compensate" of the trip undoes
# the child's hotel and the trip's flight.
saga_tree_gated = _saga_tree("saga-tree-gated", book_car_gated)
# An agent with no undo of its own that delegates to the gated hotels agent, which has: it
# counts as having undos (the admin offers "Cancel and compensate"), and a cancel-and-
# compensate of it undoes its sub-run's hotel.
saga_delegator = da.Agent(
    "saga-delegator",
    ScriptedModel(
        [
            scripted.calls(scripted.call(saga_tree_gated[1].name, {"input": "LIS"})),
            scripted.text("delegated"),
        ]
    ),
    "Delegate the booking.",
    [saga_tree_gated[1].as_tool()],
)


# -- work that spans runs (issue 29) ------------------------------------------------------
# ``stop-trip`` (a saga) books a flight, then asks ``stop-hotels``, which books a hotel, a
# car (staff approve it), then sends an SMS (no undo), then answers. ``DA_HOLD_FILE``: the
# car's call, once its effect fired, waits for ``<file>.go`` (having written
# ``<file>.inside``): the sub-run is busy in a call while the test cancels its root.


def _hold(ctx: da.ToolContext) -> None:
    path = os.environ.get("DA_HOLD_FILE")
    if not path:
        return
    with open(f"{path}.inside", "w") as out:
        out.write(ctx.run_id)
    for _ in range(600):
        if os.path.exists(f"{path}.go"):
            return
        time.sleep(0.05)


@da.tool(compensate=_undo("car"), requires_approval=True)
def stop_book_car(city: str, ctx: da.ToolContext) -> dict:
    """Book a car (staff approve first)."""
    fire(ctx, "book_car")
    _hold(ctx)
    return {"booking": f"C-{city}"}


@da.tool
def stop_send_sms(text: str, ctx: da.ToolContext) -> dict:
    """Tell the traveller (a side effect with no undo)."""
    fire(ctx, "send_sms")
    return {"sent": text}


@da.tool(requires_approval=True)
def stop_send_sms_gated(text: str, ctx: da.ToolContext) -> dict:
    """Tell the traveller (staff approve first)."""
    fire(ctx, "send_sms")
    return {"sent": text}


def _stop_trip(prefix: str, sms: da.Tool, *, saga: bool) -> list[da.Agent]:
    hotels = da.Agent(
        f"{prefix}-hotels",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_hotel", {"city": "LIS"})),
                scripted.calls(scripted.call("stop_book_car", {"city": "LIS"})),
                scripted.calls(scripted.call(sms.name, {"text": "booked"})),
                scripted.text("hotel and car booked"),
            ]
        ),
        "Book a hotel and a car, then tell the traveller.",
        [book_hotel, stop_book_car, sms],
    )
    trip = da.Agent(
        prefix,
        ScriptedModel(
            [
                scripted.calls(scripted.call("book_flight", {"to": "LIS"})),
                scripted.calls(scripted.call(hotels.name, {"input": "LIS"})),
                scripted.text("booked"),
            ]
        ),
        "Book a flight, then a hotel and a car.",
        [book_flight, hotels.as_tool()],
        saga=saga,
    )
    return [trip, hotels]


stop_trip = _stop_trip("stop-trip", stop_send_sms, saga=True)
stop_trip_plain = _stop_trip("stop-plain", stop_send_sms_gated, saga=False)


# An answer is for the question asked (issue 29): the refund asks staff about what the
# order is owed when the tool runs (``DA_OWED``, 100 unless set), and refunds it on "yes".
@da.tool(idempotent=True)
def refund_owed(order: str, ctx: da.ToolContext) -> dict:
    """Refund what the order is owed, once staff confirm it."""
    cents = int(os.environ.get("DA_OWED", "100"))
    ok = ctx.interrupt(
        "confirm", f"Refund {cents} cents on {order}?", schema={"enum": ["yes", "no"]}
    )
    if ok == "yes":
        fire(ctx, f"refund_{cents}")
    return {"refunded": cents if ok == "yes" else 0}


ask_refund = da.Agent(
    "ask-refund",
    ScriptedModel(
        [scripted.calls(scripted.call("refund_owed", {"order": "o-7"})), scripted.text("done")]
    ),
    "Refund order 7 once staff confirm.",
    [refund_owed],
)


# The undo gets the arguments the call ran with (issue 29): a seat booking that is
# idempotent, gated and editable; paying is declined, so the saga undoes the booking. Each
# booking and undo is counted with the seat as its key.
def _release_seat(args: dict, result: Any, ctx: da.ToolContext) -> dict:
    with effects_connection() as conn:
        conn.execute(
            "INSERT INTO test_effects (run_id, call_id, tool, key) VALUES (%s, %s, %s, %s)",
            [ctx.run_id, ctx.call_id, "release_seat", args["seat"]],
        )
    return {"released": args["seat"]}


@da.tool(idempotent=True, requires_approval=True, compensate=_release_seat)
def book_seat(seat: str, ctx: da.ToolContext) -> dict:
    """Book a seat (staff approve it, and may pick another)."""
    with effects_connection() as conn:
        conn.execute(
            "INSERT INTO test_effects (run_id, call_id, tool, key) VALUES (%s, %s, %s, %s)",
            [ctx.run_id, ctx.call_id, "book_seat", seat],
        )
    return {"seat": seat}


@da.tool
def pay_seat(cents: int) -> dict:
    """Pay for the seat; the card is declined."""
    raise da.SagaAborted("the card was declined")


seat_saga = da.Agent(
    "seat-saga",
    ScriptedModel(
        [
            scripted.calls(scripted.call("book_seat", {"seat": "1A"})),
            scripted.calls(scripted.call("pay_seat", {"cents": 900})),
            scripted.text("done"),
        ]
    ),
    "Book a seat, then pay.",
    [book_seat, pay_seat],
    saga=True,
)
