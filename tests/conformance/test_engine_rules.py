"""Engine commands on every store (InMemoryStore, PostgreSQL, SQLite): the rules of issue 10
that hold only if the store's writes compose — concurrent forks, an approval landing during a
cancel, refusals on a cancelled run, a run row that disagrees with its journal, and
``Journal.step`` under concurrent callers."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from decimal import Decimal

import pydantic
import pytest

import durable_agents as da
from durable_agents.engine.commands import approvals as approvals_module
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.procs import in_threads


@pytest.fixture
def wired(store):
    """Hand runs over inline, to this store (not the settings' default database)."""
    with wiring.wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        halt_min_age=lambda: 0.0,
    ):
        yield store


FIRED: list[str] = []


@da.tool(read_only=True)
def lookup(city: str) -> str:
    """The weather."""
    return "sun"


@da.tool(requires_approval=True)
def pay(cents: int) -> str:
    """Pay out."""
    FIRED.append(f"pay {cents}")
    return "paid"


@da.tool
def ship(box: str) -> str:
    """Ship a box."""
    FIRED.append(f"ship {box}")
    raise Crash()


class Crash(BaseException):
    """Stands in for the process dying inside the tool."""


trip = da.Agent(
    "rules-trip",
    ScriptedModel(
        [
            scripted.calls(scripted.call("lookup", {"city": "Oslo"})),
            scripted.calls(scripted.call("lookup", {"city": "Rome"})),
            scripted.text("planned"),
        ]
    ),
    "",
    [lookup],
)
payer = da.Agent(
    "rules-pay",
    ScriptedModel([scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("ok")]),
    "",
    [pay],
)
shipper = da.Agent(
    "rules-ship",
    ScriptedModel([scripted.calls(scripted.call("ship", {"box": "b1"})), scripted.text("ok")]),
    "",
    [ship],
)


class Parcel(pydantic.BaseModel):
    weight_g: int
    sent: datetime


RECEIVED: list[tuple[Parcel, Decimal]] = []


@da.tool(requires_approval=True)
def post(parcel: Parcel, price: Decimal) -> Parcel:
    """Post a parcel (a side effect, gated)."""
    RECEIVED.append((parcel, price))
    return parcel


POST_ARGS = {"parcel": {"weight_g": 250, "sent": "2026-12-01T10:00:00Z"}, "price": "3.10"}
poster = da.Agent(
    "rules-post",
    ScriptedModel([scripted.calls(scripted.call("post", POST_ARGS)), scripted.text("posted")]),
    "",
    [post],
)


# -- 8. forks ---------------------------------------------------------------------------


def test_concurrent_forks_get_distinct_ids_and_keep_their_patches(wired):
    store = wired
    trip.run("src", "plan", store=store)
    forks = in_threads(
        6,
        lambda i: da.fork("src", 1, da.Patch(tool_results={"call_1_1": f"storm {i}"}), store=store),
    )
    assert sorted(forks) == [f"src.fork-{n}" for n in range(1, 7)]
    journal = Journal(store)
    patched = {journal.get(f, "tool:call_1_1").get("result") for f in forks}
    assert patched == {f"storm {i}" for i in range(6)}
    for fork_id in forks:
        assert [r.name for r in journal.records(fork_id)].count("fork:done") == 1


def test_an_explicit_fork_id_that_exists_is_refused(wired):
    store = wired
    trip.run("src", "plan", store=store)

    def fork(i: int):
        try:
            return da.fork("src", 1, da.Patch(append_user=f"m{i}"), "mine", store=store)
        except da.ConfigError as exc:
            return exc.code

    outcomes = in_threads(4, fork)
    assert outcomes.count("mine") == 1 and outcomes.count("history.fork_exists") == 3
    users = [r for r in Journal(store).records("mine") if r.name.startswith("user:")]
    assert len(users) == 1, "one fork's records, not a mix of four"


# -- 6. cancel, and what lands during or after it --------------------------------------


def test_an_approval_landing_during_a_cancel_does_not_bring_the_run_back(wired, monkeypatch):
    store = wired
    FIRED.clear()
    with pytest.raises(da.ApprovalPending):
        payer.run("pay-1", "pay me", store=store)
    original = approvals_module._refuse_orphans

    def check_then_cancel(*args, **kwargs):
        original(*args, **kwargs)  # the run is still waiting when the decision is checked...
        da.cancel("pay-1", by="bob", reason="customer withdrew", store=store)  # ...then not

    monkeypatch.setattr(approvals_module, "_refuse_orphans", check_then_cancel)
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("pay-1", "call_1_1", True, by="ann", store=store)
    run = store.get_run("pay-1")
    assert run.status == "cancelled" and FIRED == []
    assert store.get_approval_request("pay-1", "call_1_1").status == "withdrawn"
    with pytest.raises(da.ConfigError) as info:
        da.resume("pay-1", store=store)
    assert info.value.code == "run.cancelled" and store.get_run("pay-1").status == "cancelled"
    assert FIRED == []


def _trip(instructions: str = "Book, then pay.", on_drift: str | None = None) -> da.Agent:
    """A saga: book (undone by ``unbook``), then ``pay`` (gated). Deployed again with other
    instructions under ``on_drift="error"``, a run it started fails for good: it aborts."""
    return da.Agent(
        "rules-saga",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book", {"room": "12"})),
                scripted.calls(scripted.call("pay", {"cents": 5})),
                scripted.text("ok"),
            ]
        ),
        instructions,
        [book, pay],
        saga=True,
        on_drift=on_drift,
    )


def _unbook(args, result, ctx):
    FIRED.append(f"unbook {args['room']}")
    return "unbooked"


@da.tool(compensate=_unbook)
def book(room: str) -> str:
    """Book a room."""
    FIRED.append(f"book {room}")
    return "booked"


@pytest.mark.parametrize("lands", ["before-the-check", "during-the-decision"])
def test_an_approval_of_a_saga_that_aborted_is_refused_and_never_runs(wired, monkeypatch, lands):
    """The saga aborts by itself (not a cancel) while its payment awaits approval: the
    request is withdrawn, and a decision — arriving after, or checked just before the abort
    and recorded after it — is refused as orphaned; the run ends compensated, never queued
    forward, and the payment never runs."""
    store = wired
    FIRED.clear()
    with pytest.raises(da.ApprovalPending):
        _trip().run(f"saga-{lands}", "book and pay", store=store)

    def abort() -> None:
        with pytest.raises(da.SagaAborted):
            _trip("Book cheaper.", on_drift="error").run(f"saga-{lands}", None, store=store)

    if lands == "before-the-check":
        abort()
        assert store.get_approval_request(f"saga-{lands}", "call_2_1").status == "withdrawn"
    else:
        original = approvals_module._refuse_orphans

        def check_then_abort(*args, **kwargs):
            original(*args, **kwargs)
            abort()

        monkeypatch.setattr(approvals_module, "_refuse_orphans", check_then_abort)
    with pytest.raises(da.ApprovalOrphaned):
        da.approve(f"saga-{lands}", "call_2_1", True, by="ann", store=store)
    assert store.get_approval_request(f"saga-{lands}", "call_2_1").status == "withdrawn"
    assert store.get_run(f"saga-{lands}").status == "compensated"
    assert store.list_approval_requests(run_id=f"saga-{lands}") == []
    assert FIRED == ["book 12", "unbook 12"]


def test_cancel_closes_requests_and_halts_and_refuses_what_comes_after(wired):
    store = wired
    FIRED.clear()
    with pytest.raises(da.ApprovalPending):
        payer.run("pay-2", "pay me", store=store)
    with pytest.raises(Crash):
        shipper.run("ship-2", "ship it", store=store)
    with pytest.raises(da.OutcomeUnknown):
        da.resume("ship-2", store=store)
    da.cancel("pay-2", by="bob", store=store)
    da.cancel("ship-2", by="bob", store=store)
    assert store.get_approval_request("pay-2", "call_1_1").status == "withdrawn"
    assert [h.status for h in store.list_halts(run_id="ship-2", status=None)] == ["orphaned"]
    with pytest.raises(da.ApprovalOrphaned):
        da.approve("pay-2", "call_1_1", True, by="ann", store=store)
    with pytest.raises(da.ConfigError) as info:
        da.resolve_halt("ship-2", "call_1_1", "shipped", by="ann", store=store)
    assert info.value.code == "halt.orphaned"
    assert Journal(store).get("ship-2", "tool:call_1_1") is None
    assert {store.get_run(r).status for r in ("pay-2", "ship-2")} == {"cancelled"}
    assert FIRED == ["ship b1"]


# -- 7. the journal is the truth --------------------------------------------------------


def test_a_drive_repairs_a_row_that_disagrees_with_the_journal(wired):
    store = wired
    result = trip.run("fix-1", "plan", store=store)
    store.update_run("fix-1", {"status": "running", "answer": None})  # a row left behind
    assert [r.run_id for r in store.list_unfinished()] == ["fix-1"]
    assert da.resume("fix-1", store=store) == result
    run = store.get_run("fix-1")
    assert (run.status, run.answer, run.turns) == ("finished", "planned", 3)
    assert store.list_unfinished() == []


# -- 13. Journal.step: at most once under concurrent callers ----------------------------


def test_a_journal_step_runs_once_under_concurrent_callers(store, run_id):
    calls: list[int] = []
    lock = threading.Lock()

    def effect() -> str:
        with lock:
            calls.append(1)
        return "charged"

    def step(i: int):
        try:
            return Journal(store).step(run_id, "charge", effect)
        except da.OutcomeUnknown as exc:
            return exc.details["cause"]

    outcomes = in_threads(8, step)
    assert len(calls) == 1, "the function ran once"
    # The others found the claim taken (by the caller still running it): unknown to them.
    assert set(outcomes) <= {"charged", "contended", "crashed"} and "charged" in outcomes
    assert Journal(store).step(run_id, "charge", effect) == "charged" and len(calls) == 1


def test_a_retry_safe_journal_step_may_run_again_but_records_once(store, run_id):
    calls: list[int] = []
    values = in_threads(
        4,
        lambda i: Journal(store).step(
            run_id, "look", lambda: calls.append(i) or f"v{i}", retry_safe=True
        ),
    )
    assert len(set(values)) == 1 and len(calls) >= 1
    assert not any(r.name.startswith("attempt:") for r in Journal(store).records(run_id))


# -- tool arguments JSON has no type for ---------------------------------------------------


def test_model_arguments_are_asked_approved_claimed_and_run_as_json(wired):
    store = wired
    RECEIVED.clear()
    with pytest.raises(da.ApprovalPending):
        poster.run("post-1", "post it", store=store)
    assert store.get_approval_request("post-1", "call_1_1").arguments == POST_ARGS
    edit = {**POST_ARGS, "price": "7.25"}
    da.approve("post-1", "call_1_1", True, by="ann", edit=edit, store=store)
    assert store.get_run("post-1").status == "finished"
    [(parcel, price)] = RECEIVED
    assert parcel == Parcel(weight_g=250, sent=datetime(2026, 12, 1, 10, tzinfo=UTC))
    assert price == Decimal("7.25")
    journal = Journal(store)
    assert journal.get("post-1", "attempt:call_1_1:1").get("arguments") == edit
    assert journal.get("post-1", "tool:call_1_1").get("result") == edit["parcel"]
