"""``da.ask_staff``: the model asks staff a question, the run waits ``awaiting_input``, a
person answers with ``da.answer_interrupt`` and the answer is the tool's result (in-memory
store, runs handed over inline)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.engine.staff import question_name
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


def staff_agent(args, name="unit-ask-staff"):
    script = [
        scripted.calls(scripted.call("ask_staff", args)),
        scripted.text("thanks"),
    ]
    return da.Agent(name, ScriptedModel(script), "", [da.ask_staff])


def result_of(store, call_id="call_1_1"):
    rec = Journal(store).get("r1", names.tool(call_id))
    assert rec is not None
    return rec.get("result"), rec.get("is_error")


def test_the_model_asks_staff_and_reads_their_answer(store):
    a = staff_agent({"question": "Which warehouse ships order 7?", "choices": ["BER", "HAM"]})
    with pytest.raises(da.InterruptPending):
        a.run("r1", "ship order 7", store=store)
    assert store.get_run("r1").status == "awaiting_input"
    [p] = da.pending(store=store)
    [w] = p.waits
    assert (w.kind, w.name, w.tool) == ("interrupt", "staff.call_1_1", "ask_staff")
    assert w.prompt == "Which warehouse ships order 7?"
    assert w.schema == {"type": "string", "enum": ["BER", "HAM"]}

    with pytest.raises(da.InterruptAnswerInvalid):
        da.answer_interrupt("r1", w.name, "PAR", by="ann", store=store)
    assert store.get_run("r1").status == "awaiting_input"
    out = da.answer_interrupt("r1", w.name, "HAM", by="ann", store=store)
    assert out.recorded and out.woke
    assert store.get_run("r1").status == "finished"
    assert result_of(store) == ("HAM", False)
    assert [(x.actor, x.action, x.target) for x in store.list_actions(run_id="r1")] == [
        ("ann", "answer", "staff.call_1_1")
    ]


def test_a_free_text_question_takes_any_non_empty_answer(store):
    a = staff_agent({"question": "May I waive the fee?"}, name="unit-ask-staff-free")
    with pytest.raises(da.InterruptPending):
        a.run("r1", "go", store=store)
    with pytest.raises(da.InterruptAnswerInvalid):
        da.answer_interrupt("r1", "staff.call_1_1", "", by="ann", store=store)
    with pytest.raises(da.InterruptAnswerInvalid):
        da.answer_interrupt("r1", "staff.call_1_1", {"yes": True}, by="ann", store=store)
    da.answer_interrupt("r1", "staff.call_1_1", "yes, once", by="ann", store=store)
    assert result_of(store) == ("yes, once", False)


@pytest.mark.parametrize(
    "args",
    [
        {"question": "   "},
        {"question": "Which?", "choices": []},
        {"question": "Which?", "choices": ["a", "a"]},
        {"question": "Which?", "choices": ["a", " "]},
        {"question": "Which?", "choices": [str(i) for i in range(21)]},
    ],
)
def test_a_malformed_question_goes_back_to_the_model_and_asks_nobody(store, args):
    a = staff_agent(args, name="unit-ask-staff-bad")
    assert a.run("r1", "go", store=store).answer == "thanks"
    result, is_error = result_of(store)
    assert is_error and result
    assert not [r for r in Journal(store).records("r1") if r.name.startswith(names.WAIT)]


def test_the_question_name_is_a_valid_wait_name_for_any_call_id():
    assert question_name("call_1_1") == "staff.call_1_1"
    odd = question_name("toolu/01:ABC" + "x" * 200)
    assert odd.startswith("staff.") and names.validate_wait_name(odd) == odd
    assert odd == question_name("toolu/01:ABC" + "x" * 200)
