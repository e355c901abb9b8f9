"""``durable_agents.testing.replay_cases``: exported runs as pytest cases."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import durable_agents as da
from durable_agents.engine.export import end_line, header_line, line, record_line
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.testing import ReplayCase, replay_cases


def agent(instructions="Answer about orders."):
    @da.tool(read_only=True)
    def lookup(order_id: str) -> dict:
        """Look an order up."""
        return {"order_id": order_id, "status": "shipped"}

    script = [scripted.calls(scripted.call("lookup", {"order_id": "7"})), scripted.text("Shipped.")]
    return da.Agent("unit-replay-cases", ScriptedModel(script), instructions, [lookup])


def export(store, path, *run_ids):
    """What ``manage.py durable_agents export`` writes, from the in-memory store."""
    lines = [header_line(run_ids, exported_at=datetime.now(UTC), library="test")]
    for run_id in run_ids:
        lines.append(line({"type": "run", "run_id": run_id, "row": {"run_id": run_id}}))
        lines.extend(record_line(r) for r in Journal(store).records(run_id))
    lines.append(end_line(len(lines)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_one_case_per_exported_run(store, tmp_path):
    recorded = agent()
    for run_id in ("a-1", "a-2", "b-1"):
        recorded.run(run_id, "Where is order 7?", store=store)
    export(store, tmp_path / "a.jsonl", "a-1", "a-2")
    export(store, tmp_path / "b.jsonl", "b-1")
    test = replay_cases(tmp_path / "*.jsonl", agent=agent())
    [mark] = test.pytestmark
    assert mark.name == "parametrize" and mark.args[0] == "replay_case"
    cases = mark.args[1]
    assert [c.id for c in cases] == ["a.jsonl:a-1", "a.jsonl:a-2", "b.jsonl:b-1"]
    assert mark.kwargs["ids"] == [c.id for c in cases]
    for case in cases:
        test(case)  # passes: today's agent is the recorded one
        assert case.replay(agent()).identical


def test_a_case_fails_with_the_replay_report(store, tmp_path):
    agent().run("c-1", "Where is order 7?", store=store)
    export(store, tmp_path / "c.jsonl", "c-1")
    test = replay_cases(str(tmp_path / "c.jsonl"), agent=agent("Never answer."))
    [case] = test.pytestmark[0].args[1]
    with pytest.raises(pytest.fail.Exception) as failed:
        test(case)
    assert "c.jsonl:c-1" in str(failed.value)
    assert "diverges at step 1 of 2 (instructions)" in str(failed.value)
    # Default agent: the one registered under the run's agent name (the last one made).
    agent("Never answer.")
    assert ReplayCase(tmp_path / "c.jsonl", "c-1").replay().kind == "instructions"


def test_a_pattern_that_matches_nothing_is_a_config_error(tmp_path):
    with pytest.raises(da.ConfigError) as exc:
        replay_cases(tmp_path / "none-*.jsonl")
    assert exc.value.code == "config.replay_cases"


def test_a_file_of_another_format_is_refused_at_collection(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"type": "header", "format": "other"}\n')
    with pytest.raises(da.ProtocolError) as exc:
        replay_cases(tmp_path / "x.jsonl")
    assert exc.value.code == "export.format"
