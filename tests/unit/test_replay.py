"""Replay: today's agent code against a recorded run, without calling the model or a tool."""

from __future__ import annotations

import pydantic
import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.engine.model import ModelRequest, ModelResponse
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


class Counting:
    """A model wrapper counting every request, outside the journal."""

    def __init__(self, model):
        self.model = model
        self.model_id = model.model_id
        self.requests = 0

    def generate(self, request: ModelRequest) -> ModelResponse:
        self.requests += 1
        return self.model.generate(request)


def _at_most_100(cls, value: int) -> int:
    if value > 100:
        raise ValueError("at most 100 cents")
    return value


def _at_most_1000(cls, value: int) -> int:
    if value > 1000:
        raise ValueError("at most 1000 cents")
    return value


def _at_most_100_v2(cls, value: int) -> int:
    if value > 100:
        raise ValueError("refunds above one dollar need a manager")
    return value


SCRIPT = [
    scripted.calls(scripted.call("lookup", {"order_id": "7"})),
    scripted.calls(scripted.call("refund", {"order_id": "7", "amount_cents": 500})),
    scripted.text("Refunded."),
]
SCRIPT_VALIDATED = [
    SCRIPT[0],
    scripted.calls(scripted.call("refund", {"order_id": "7", "amount_cents": {"cents": 500}})),
    SCRIPT[2],
]


def shop(
    fired,
    *,
    instructions="Help customers.",
    refund_doc="Refund an order.",
    gated=False,
    validator=None,
    with_lookup=True,
    extra=(),
    script=SCRIPT,
    max_turns=20,
):
    @da.tool(read_only=True)
    def lookup(order_id: str) -> dict:
        """Look an order up."""
        fired.append(("lookup", order_id))
        return {"order_id": order_id, "paid_cents": 500}

    def refund(order_id, amount_cents):
        fired.append(("refund", order_id))
        return {"refunded": amount_cents}

    # Set by hand: annotations here are strings. A validator checks the amount without
    # showing in the schema (a pydantic model's field validator).
    refund.__annotations__ = {"order_id": str, "amount_cents": int, "return": dict}
    if validator is not None:
        amount = pydantic.create_model(
            "Amount",
            cents=(int, ...),
            __validators__={"check": pydantic.field_validator("cents")(validator)},
        )

        def refund(order_id, amount_cents):
            fired.append(("refund", order_id))
            return {"refunded": amount_cents.cents}

        refund.__annotations__ = {"order_id": str, "amount_cents": amount, "return": dict}
        script = SCRIPT_VALIDATED
    refund.__doc__ = refund_doc
    # (idempotent with a model argument: an attempt claim records plain JSON arguments only)
    refund_tool = da.tool(requires_approval=gated, idempotent=validator is not None)(refund)
    tools = [lookup, refund_tool, *extra] if with_lookup else [refund_tool, *extra]
    model = Counting(ScriptedModel(script))
    agent = da.Agent("unit-replay-shop", model, instructions, tools, max_turns=max_turns)
    return agent, model


def record(store, fired, **kwargs):
    agent, _ = shop(fired, **kwargs)
    result = agent.run("order-7", "Refund order 7", store=store)
    assert result.answer == "Refunded."
    return agent


def test_an_unchanged_agent_replays_identical_and_calls_nothing(store):
    fired: list = []
    record(store, fired)
    assert len(fired) == 2
    today, model = shop(fired)
    report = da.replay("order-7", today, store=store)
    assert report.identical and report.diverged_at is None and report.kind is None
    assert [s.step for s in report.a] == [1, 2, 3]
    assert [s.shape() for s in report.b] == [s.shape() for s in report.a]
    assert "replays identical" in report.describe()
    # Counted outside the journal: no model request, no tool ran.
    assert model.requests == 0
    assert len(fired) == 2
    body = report.to_json()
    assert set(body) >= {"a", "b", "diverged_at", "drift"} and body["identical"] is True


def test_replay_finds_the_agent_by_the_name_the_run_recorded(store):
    fired: list = []
    record(store, fired)
    shop(fired, instructions="Be terse.")  # registered last under the run's agent name
    report = da.replay("order-7", store=store)
    assert (report.diverged_at, report.kind) == (1, "instructions")


def test_changed_instructions_diverge_at_the_first_request(store):
    fired: list = []
    record(store, fired)
    today, model = shop(fired, instructions="Never refund.")
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (1, "instructions")
    assert report.drift["recorded"] != report.drift["today"]
    assert report.b == [] and len(report.a) == 3
    assert model.requests == 0 and len(fired) == 2


def test_a_removed_tool_is_reported_with_the_steps_that_call_it(store):
    fired: list = []
    record(store, fired)
    today, _ = shop(fired, with_lookup=False)
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (1, "tool_removed")
    assert list(report.drift["recorded"]) == ["lookup"] and report.drift["today"] is None
    assert "called at steps [1]" in report.drift["message"]


def test_a_changed_schema_is_reported_with_both_hashes(store):
    fired: list = []
    record(store, fired)
    today, _ = shop(fired, refund_doc="Refund an order, in cents.")
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (1, "tool_changed")
    assert set(report.drift["recorded"]) == set(report.drift["today"]) == {"refund"}
    assert report.drift["recorded"] != report.drift["today"]
    assert "called at steps [2]" in report.drift["message"]


def test_a_tool_removed_by_a_later_deploy_diverges_at_the_step_offered_it(store):
    """A run that paused, then resumed under an agent with one more tool: its first steps
    replay identical under the old agent, the step after the deploy does not."""
    fired: list = []
    agent, _ = shop(fired, gated=True)
    with pytest.raises(da.ApprovalPending) as paused:
        agent.run("order-7", "Refund order 7", store=store)
    call_id = paused.value.details["calls"][0]

    @da.tool(read_only=True)
    def note(text: str) -> str:
        """Keep a note."""
        return text

    newer, _ = shop(fired, gated=True, extra=[note])
    da.approve("order-7", call_id, approved=True, by="ann", store=store)
    assert newer.run("order-7", store=store).answer == "Refunded."
    older, _ = shop(fired, gated=True)
    report = da.replay("order-7", older, store=store)
    assert (report.diverged_at, report.kind) == (3, "tool_removed")
    assert list(report.drift["recorded"]) == ["note"]
    assert len(report.b) == 2
    assert da.replay("order-7", newer, store=store).kind == "request"  # step 1: note is new


def test_a_call_that_now_needs_approval_is_refused_at_its_step(store):
    fired: list = []
    record(store, fired)
    today, _ = shop(fired, gated=True)
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (2, "refused")
    assert report.drift["today"]["requires_approval"] is True
    assert report.drift["recorded"]["approval"] is None
    assert [s.step for s in report.b] == [1]


def test_a_recorded_approval_replays_identical_under_a_gated_tool(store):
    fired: list = []
    agent, _ = shop(fired, gated=True)
    with pytest.raises(da.ApprovalPending) as paused:
        agent.run("order-7", "Refund order 7", store=store)
    da.approve("order-7", paused.value.details["calls"][0], approved=True, by="ann", store=store)
    agent.run("order-7", store=store)
    assert da.replay("order-7", shop(fired, gated=True)[0], store=store).identical
    # Without the gate, today's code runs the call as the approved recording did.
    assert da.replay("order-7", shop(fired)[0], store=store).identical


def test_arguments_todays_tool_refuses_are_refused_at_their_step(store):
    fired: list = []
    record(store, fired, validator=_at_most_1000)
    today, _ = shop(fired, validator=_at_most_100)  # same schema, stricter validation
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (2, "refused")
    assert report.drift["recorded"] == {"refunded": 500}
    assert fired == [("lookup", "7"), ("refund", "7")]
    assert "at most 100 cents" in report.drift["today"]["error"]


def test_a_different_error_the_loop_gives_diverges_at_the_next_request(store):
    """The recording's call was refused by validation; today's code refuses it too, with
    another message: the model would read something else at the next step."""
    fired: list = []
    record(store, fired, validator=_at_most_100)
    assert fired == [("lookup", "7")]
    today, _ = shop(fired, validator=_at_most_100_v2)
    report = da.replay("order-7", today, store=store)
    assert (report.diverged_at, report.kind) == (3, "request")
    assert "at most 100 cents" in report.drift["recorded"][0]["content"]
    assert "need a manager" in report.drift["today"][0]["content"]
    assert da.replay("order-7", shop(fired, validator=_at_most_100)[0], store=store).identical


def test_fewer_turns_allowed_today_are_refused_at_the_first_step_beyond(store):
    fired: list = []
    record(store, fired)
    report = da.replay("order-7", shop(fired, max_turns=2)[0], store=store)
    assert (report.diverged_at, report.kind) == (3, "refused")


def test_replaying_a_missing_run_is_not_found(store):
    with pytest.raises(da.ConfigError) as exc:
        da.replay("nope", shop([])[0], store=store)
    assert exc.value.code == "run.not_found"


# -- ReplayModel on its own -----------------------------------------------------------


def test_replay_model_answers_from_the_journal(store):
    fired: list = []
    record(store, fired)
    records = Journal(store).records("order-7")
    agent, model = shop(fired)
    agent.model = da.ReplayModel(records)
    assert agent.run("order-7-again", "Refund order 7", store=store).answer == "Refunded."
    assert agent.model.calls == 3 and model.requests == 0
    # The tools did run: only the model replays.
    assert fired[2:] == [("lookup", "7"), ("refund", "7")]


def test_replay_model_refuses_a_request_the_recording_was_not_sent(store):
    fired: list = []
    record(store, fired)
    agent, _ = shop(fired)
    agent.model = da.ReplayModel.from_journal("order-7", store=store)
    with pytest.raises(da.ReplayDiverged) as exc:
        agent.run("order-8", "Refund order 8", store=store)
    assert exc.value.code == "replay.diverged" and exc.value.http_status == 409
    assert exc.value.details["step"] == 1 and exc.value.details["kind"] == "request"
    assert "Refund order 8" in str(exc.value.details["today"])


def test_replay_model_refuses_a_turn_the_recording_does_not_have(store):
    fired: list = []
    record(store, fired)
    model = da.ReplayModel.from_journal("order-7", store=store, check=False)
    for _ in range(3):
        model.generate(ModelRequest("", []))
    with pytest.raises(da.ReplayDiverged) as exc:
        model.generate(ModelRequest("", []))
    assert exc.value.details["step"] == 4
