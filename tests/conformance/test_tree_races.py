"""Races in trees of sub-agents, on every store (InMemoryStore, PostgreSQL, SQLite): a sub-run
that ends while its parent pauses on it, and a saga's rollback of a sub-run another driver
holds. Two drivers are two greenlets switched at the engine's named points, so each schedule
is exact; effects are counted outside the journal (``fired``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import greenlet
import pytest

import durable_agents as da
from durable_agents.engine import names, saga_tree
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.engine.loop import drive
from durable_agents.engine.retry import RetryPolicy
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring
from tests.support.doubles import Crash, hooks_at_points


@pytest.fixture
def wired(store):
    """Hand runs over inline, to this store, and say which runs were handed over."""
    sent: list[str] = []

    def dispatch(run_id: str) -> None:
        sent.append(run_id)
        drive_quietly(run_id, store=store)

    with wiring.wired(dispatcher=dispatch, halt_min_age=lambda: 0.0):
        yield store, sent


@pytest.fixture
def at_point(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Callable[[], None]], None]:
    """``at_point(name, fn)``: run ``fn`` when a driver reaches the named point (once)."""
    return hooks_at_points(monkeypatch)


def die() -> None:
    raise Crash()


def new_id(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def pair(prefix: str, fired: list, *, saga: bool = False) -> tuple[da.Agent, da.Agent]:
    """``<prefix>-parent`` asks ``<prefix>-child`` (which books, undoably), then answers."""

    def unbook(args, result, ctx):
        fired.append(("unbook", ctx.run_id))
        return "unbooked"

    @da.tool(idempotent=True, compensate=unbook)
    def book(ctx: da.ToolContext) -> str:
        fired.append(("book", ctx.run_id))
        return "booked"

    @da.tool
    def pay(ctx: da.ToolContext) -> str:
        raise da.SagaAborted("the card was declined")

    child = da.Agent(
        f"{prefix}-child",
        ScriptedModel([scripted.calls(scripted.call("book", {})), scripted.text("child done")]),
        "Book.",
        [book],
    )
    parent = da.Agent(
        f"{prefix}-parent",
        ScriptedModel(
            [
                scripted.calls(scripted.call(child.name, {"input": "errand"})),
                scripted.calls(scripted.call("pay", {})),
                scripted.text("parent done"),
            ]
        ),
        "Delegate, then pay.",
        [child.as_tool(), pay],
        saga=saga,
    )
    return parent, child


def child_driver(child: da.Agent, child_id: str, run: str, store) -> Callable[[], None]:
    """Another driver of the sub-run; a failure of the sub-run is that driver's, not ours."""

    def go() -> None:
        try:
            drive(
                child,
                child_id,
                "errand",
                store=store,
                derived_id=True,
                meta={"parent_run_id": run, "root_run_id": run},
            )
        except da.DurableAgentsError:
            pass

    return go


def test_a_sub_run_ending_while_its_parent_pauses_on_it_hands_the_parent_over(wired, at_point):
    """The child's driver looks for a paused parent before its end record (the parent is
    still running: nothing to hand over), the parent then pauses on the busy child and finds
    it unfinished, then the child's end is written: the child's driver looks again."""
    store, sent = wired
    fired: list = []
    parent, child = pair("trr-end", fired)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    main = greenlet.getcurrent()

    other = greenlet.greenlet(child_driver(child, child_id, run, store))
    # The parent journaled its call's sub-run; another driver starts it and drives it to
    # just before its end record, then the parent goes on (and finds the child busy).
    at_point(f"after-child:{child_id}", other.switch)
    at_point(f"before-complete:{child_id}", main.switch)
    with pytest.raises(da.ChildPending):
        drive(parent, run, "go", store=store)
    assert store.get_run(run).status == "awaiting_input"
    other.switch()  # the child's end is written now
    assert other.dead
    assert store.get_run(child_id).status == "finished"
    assert sent == [run]
    assert store.get_run(run).status == "finished"
    assert fired == [("book", child_id)]


def test_the_sweep_hands_over_a_parent_paused_on_a_sub_run_that_ended(wired, at_point):
    """The same race, and the child's driver dies right after its end record: the next
    sweep of paused runs (``wake_timers``, on beat) hands the parent over, once."""
    store, sent = wired
    fired: list = []
    parent, child = pair("trr-sweep", fired)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    main = greenlet.getcurrent()

    other = greenlet.greenlet(child_driver(child, child_id, run, store))
    at_point(f"after-child:{child_id}", other.switch)
    at_point(f"before-complete:{child_id}", main.switch)
    with pytest.raises(da.ChildPending):
        drive(parent, run, "go", store=store)
    # The child's driver writes its end and dies before anything else.
    at_point(f"after-complete:{child_id}", die)
    with pytest.raises(Crash):
        other.switch()
    assert store.get_run(child_id).status == "finished"
    assert store.get_run(run).status == "awaiting_input"
    assert sent == []
    assert wake_timers(store=store) == [run]
    assert store.get_run(run).status == "finished"
    assert wake_timers(store=store) == []
    assert fired == [("book", child_id)]


@pytest.mark.timeout(60)
def test_a_sagas_rollback_of_a_sub_run_held_elsewhere_pauses_until_it_is_free(wired, at_point):
    """The parent aborts while another driver holds its finished sub-run's lease: it pauses
    (it does not spin on the busy lease), the sweep of paused runs leaves it while the lease
    is held, and hands it over once it is free; the child's call is undone once."""
    store, sent = wired
    fired: list = []
    parent, _child = pair("trr-saga", fired, saga=True)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    at_point("after-saga-abort", lambda: store.acquire_lease(child_id, "elsewhere", "tok", 30))
    with pytest.raises(da.ChildPending) as paused:
        drive(parent, run, "go", store=store)
    assert paused.value.details["children"] == [child_id]
    assert store.get_run(run).status == "awaiting_input"
    assert Journal(store).get(child_id, names.SAGA_ABORT) is None
    assert wake_timers(store=store) == []
    store.release_lease(child_id, "tok")
    assert wake_timers(store=store) == [run]
    assert sent == [run]
    assert store.get_run(child_id).status == "compensated"
    assert store.get_run(run).status == "compensated"
    assert fired == [("book", child_id), ("unbook", child_id)]


@pytest.mark.timeout(60)
def test_a_parent_paused_on_a_sub_runs_rollback_is_handed_over_by_its_end(wired, at_point):
    """Another driver rolls the sub-run back itself (as a fork's rollback of the sub-run it
    references does): the end of that rollback hands the paused parent over, which records
    it as its call's undo without undoing anything again."""
    store, sent = wired
    fired: list = []
    parent, child = pair("trr-saga-end", fired, saga=True)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    at_point("after-saga-abort", lambda: store.acquire_lease(child_id, "elsewhere", "tok", 30))
    with pytest.raises(da.ChildPending):
        drive(parent, run, "go", store=store)
    store.release_lease(child_id, "tok")
    cause = {"code": "saga.aborted", "message": "another rollback"}
    saga_tree.rollback_child(child, store, "elsewhere", child_id, cause)
    assert store.get_run(child_id).status == "compensated"
    assert sent == [run]
    assert store.get_run(run).status == "compensated"
    assert fired == [("book", child_id), ("unbook", child_id)]


def test_a_forks_call_fails_on_a_referenced_sub_run_rolled_back_after_it_finished(wired, at_point):
    """A fork references a sub-run that finished before the fork point, whose end its parent
    never learnt (its driver died); the source's side then rolls that sub-run back (as its
    parent's saga would: a fork never rolls back what it references). The fork's call must
    not answer with the undone run's old answer: it is the call's error
    (``subagent.failed``), and nothing is booked or undone again."""
    store, _sent = wired
    fired: list = []

    def unbook(args, result, ctx):
        fired.append(("unbook", ctx.run_id))
        return "unbooked"

    @da.tool(idempotent=True, compensate=unbook)
    def book(ctx: da.ToolContext) -> str:
        fired.append(("book", ctx.run_id))
        return "booked"

    child = da.Agent(
        "trr-ref-child",
        ScriptedModel([scripted.calls(scripted.call("book", {})), scripted.text("child done")]),
        "Book.",
        [book],
    )
    parent = da.Agent(
        "trr-ref-parent",
        ScriptedModel(
            [
                scripted.calls(scripted.call(child.name, {"input": "errand"})),
                scripted.text("parent done"),
            ]
        ),
        "Delegate.",
        [child.as_tool()],
    )
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    at_point(f"after-complete:{child_id}", die)
    with pytest.raises(Crash):
        drive(parent, run, "go", store=store)
    assert Journal(store).get(run, names.tool("call_1_1")) is None
    fork = da.fork(run, 1, store=store)
    assert Journal(store).get(fork, names.child("call_1_1")).get("run_id") == child_id
    cause = {"code": "saga.cancelled", "message": "called off"}
    assert saga_tree.abort_subrun(store, child_id, run, cause)
    saga_tree.rollback_child(child, store, run, child_id, cause)
    assert store.get_run(child_id).status == "compensated"
    assert fired == [("book", child_id), ("unbook", child_id)]
    assert da.resume(fork, store=store).answer == "parent done"
    result = Journal(store).get(fork, names.tool("call_1_1"))
    assert result.get("is_error")
    assert "subagent.failed" in str(result.get("result"))
    assert "rolled back" in str(result.get("result"))
    assert fired == [("book", child_id), ("unbook", child_id)]
    assert store.get_run(f"{fork}/call_1_1") is None


def failing_pair(prefix: str, error: da.ModelError) -> tuple[da.Agent, da.Agent]:
    """``<prefix>-parent`` asks ``<prefix>-child``, whose model fails with ``error`` (each
    time it is asked: a drive of the child fails the same way again), then answers."""
    child = da.Agent(
        f"{prefix}-child",
        ScriptedModel([scripted.error(error)]),
        "Fail.",
        [],
        model_retry=da.ModelRetry(max_attempts=1),
    )
    parent = da.Agent(
        f"{prefix}-parent",
        ScriptedModel(
            [scripted.calls(scripted.call(child.name, {"input": "errand"})), scripted.text("done")]
        ),
        "Delegate.",
        [child.as_tool()],
    )
    return parent, child


FOR_GOOD = {
    "non-retryable": (da.ModelError("refused", code="model.refused", retryable=False), 5),
    "retries-exhausted": (da.ModelError("overloaded", code="model.overloaded", retryable=True), 1),
}


@pytest.mark.parametrize("how", sorted(FOR_GOOD))
def test_a_sub_run_failing_for_good_while_its_parent_pauses_on_it_hands_the_parent_over(
    store, at_point, how
):
    """Another driver holds the child when the parent's call drives it (busy); the child
    fails for good (an error no retry fixes, or a retryable one with no attempt left) after
    that, but before the parent pauses: its hand-over finds the parent still running, so
    the parent's own look after its pause must count the failure as the child's end. The
    parent then records its call's error (``subagent.failed``) and goes on, once."""
    error, attempts = FOR_GOOD[how]
    sent: list[str] = []

    def dispatch(run_id: str) -> None:
        sent.append(run_id)
        drive_quietly(run_id, store=store)

    parent, child = failing_pair(f"trr-fail-{how}", error)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    main = greenlet.getcurrent()
    other = greenlet.greenlet(child_driver(child, child_id, run, store))

    def start_child() -> None:
        at_point("after-start", main.switch)  # the child's drive, once it holds the lease
        other.switch()

    at_point(f"after-child:{child_id}", start_child)
    at_point(f"before-pause:{run}", other.switch)  # the child fails now
    policy = RetryPolicy(max_attempts=attempts)
    with wiring.wired(dispatcher=dispatch, halt_min_age=lambda: 0.0, retry_policy=lambda: policy):
        result = drive(parent, run, "go", store=store)
    assert other.dead
    assert result.answer == "done"
    assert store.get_run(child_id).status == "failed"
    outcome = Journal(store).get(run, names.tool("call_1_1"))
    assert outcome.get("is_error")
    assert "subagent.failed" in str(outcome.get("result"))
    assert sent == []  # the parent's own drive went on: nobody else was handed it


@pytest.mark.parametrize("how", sorted(FOR_GOOD))
def test_the_sweep_hands_over_a_parent_paused_on_a_sub_run_that_failed(store, at_point, how):
    """The parent paused on the busy child; the child then fails for good and its driver
    dies before handing the parent over: the next sweep of paused runs hands it over, once,
    and the parent records its call's error."""
    error, attempts = FOR_GOOD[how]
    sent: list[str] = []

    def dispatch(run_id: str) -> None:
        sent.append(run_id)
        drive_quietly(run_id, store=store)

    parent, child = failing_pair(f"trr-fsweep-{how}", error)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    main = greenlet.getcurrent()
    other = greenlet.greenlet(child_driver(child, child_id, run, store))

    def start_child() -> None:
        at_point("after-start", main.switch)
        other.switch()

    at_point(f"after-child:{child_id}", start_child)
    policy = RetryPolicy(max_attempts=attempts)
    with wiring.wired(dispatcher=dispatch, halt_min_age=lambda: 0.0, retry_policy=lambda: policy):
        with pytest.raises(da.ChildPending):
            drive(parent, run, "go", store=store)
        assert store.get_run(run).status == "awaiting_input"
        at_point(f"after-failed:{child_id}", die)
        with pytest.raises(Crash):
            other.switch()
        assert store.get_run(child_id).status == "failed"
        assert store.get_run(run).status == "awaiting_input"
        assert sent == []
        assert wake_timers(store=store) == [run]
        assert store.get_run(run).status == "finished"
        assert wake_timers(store=store) == []
    outcome = Journal(store).get(run, names.tool("call_1_1"))
    assert "subagent.failed" in str(outcome.get("result"))


def gated_pair(prefix: str, fired: list, *, saga: bool) -> tuple[da.Agent, da.Agent]:
    """``<prefix>-child`` books (undoably), then asks approval to charge; its parent asks it."""

    def unbook(args, result, ctx):
        fired.append(("unbook", ctx.run_id))
        return "unbooked"

    @da.tool(idempotent=True, compensate=unbook)
    def book(ctx: da.ToolContext) -> str:
        fired.append(("book", ctx.run_id))
        return "booked"

    @da.tool(requires_approval=True)
    def charge(ctx: da.ToolContext) -> str:
        fired.append(("charge", ctx.run_id))
        return "charged"

    child = da.Agent(
        f"{prefix}-child",
        ScriptedModel(
            [
                scripted.calls(scripted.call("book", {}, id="c_book")),
                scripted.calls(scripted.call("charge", {}, id="c_charge")),
                scripted.text("child done"),
            ]
        ),
        "Book, then charge.",
        [book, charge],
        saga=saga,
    )
    parent = da.Agent(
        f"{prefix}-parent",
        ScriptedModel(
            [scripted.calls(scripted.call(child.name, {"input": "errand"})), scripted.text("done")]
        ),
        "Delegate.",
        [child.as_tool()],
    )
    return parent, child


@pytest.mark.parametrize("compensate", [False, True], ids=["cancelled", "compensated"])
def test_a_sub_run_cancelled_while_its_parent_pauses_on_it_hands_the_parent_over(
    wired, at_point, compensate
):
    """The child pauses on an approval (the parent's call finds it paused); before the
    parent pauses, a person cancels the child (or cancels it with compensation: a saga
    child rolls back and ends compensated), whose hand-over finds the parent still running.
    The parent's look after its pause counts that end: it records its call's error
    (``subagent.cancelled`` / ``subagent.failed``) and goes on, once."""
    store, sent = wired
    fired: list = []
    parent, _child = gated_pair(f"trr-cancel-{compensate}", fired, saga=compensate)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    ended = "compensated" if compensate else "cancelled"
    at_point(
        f"before-pause:{run}",
        lambda: da.cancel(child_id, by="ann", compensate=compensate, store=store),
    )
    result = drive(parent, run, "go", store=store)
    assert result.answer == "done"
    assert store.get_run(child_id).status == ended
    outcome = Journal(store).get(run, names.tool("call_1_1"))
    assert outcome.get("is_error")
    code = "subagent.cancelled" if not compensate else "subagent.failed"
    assert code in str(outcome.get("result"))
    assert fired == [("book", child_id)] + ([("unbook", child_id)] if compensate else [])
    assert sent.count(run) <= 1


def test_the_sweep_hands_over_a_parent_whose_sub_run_recovery_gave_up_on(store, at_point):
    """The child's driver dies while the parent pauses on it, and recovery gives up on the
    child (no attempt left): nothing hands the parent over but the sweep of paused runs,
    once. The parent's call is then an error (``subagent.failed``): the child, which may
    be what kills its workers, is not driven again."""
    sent: list[str] = []

    def dispatch(run_id: str) -> None:
        sent.append(run_id)
        drive_quietly(run_id, store=store)

    fired: list = []
    parent, child = pair("trr-gaveup", fired)
    run = new_id("trr")
    child_id = f"{run}/call_1_1"
    main = greenlet.getcurrent()
    other = greenlet.greenlet(child_driver(child, child_id, run, store))

    def start_child() -> None:
        at_point("after-start", main.switch)
        other.switch()

    at_point(f"after-child:{child_id}", start_child)
    policy = RetryPolicy(max_attempts=0)
    with wiring.wired(dispatcher=dispatch, halt_min_age=lambda: 0.0, retry_policy=lambda: policy):
        with pytest.raises(da.ChildPending):
            drive(parent, run, "go", store=store)
        with pytest.raises(Crash):
            other.throw(Crash())  # the child's driver dies; its lease goes with it
        assert store.get_run(child_id).status == "running"
        assert recover(store=store) == []
        assert store.get_run(child_id).status == "failed"
        assert store.get_run(run).status == "awaiting_input"
        assert wake_timers(store=store) == [run]
        assert wake_timers(store=store) == []
    assert sent == [run]
    outcome = Journal(store).get(run, names.tool("call_1_1"))
    assert "subagent.failed" in str(outcome.get("result"))
    assert "run.recovery_exhausted" in str(outcome.get("result"))
    assert fired == []
    assert store.get_run(child_id).status == "failed"
