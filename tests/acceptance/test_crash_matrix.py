"""The SIGKILL matrix: a child process drives a run and is killed at a named boundary; a
fresh process resumes (and, in the second round, is killed again at a later boundary, then
a third one finishes). Side effects are counted in PostgreSQL outside the journal.

For every safety class and every boundary this proves: an effect that is not retry-safe
fires at most once per call; a run halts exactly where an effect's outcome is unknown;
retry-safe tools re-run; every run ends finished or halted; the transcript is valid.
"""

from __future__ import annotations

import json

import pytest

from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.engine.transcript import RunState
from tests.support.agents import count_effects
from tests.support.chains import check_chain
from tests.support.procs import run_python

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]

CALLS = ["call_1_1", "call_1_2", "call_2_1"]
# Boundaries in the order a clean run passes them.
BOUNDARIES = [
    "after-start",
    "after-model:1",
    *[p for c in CALLS[:2] for p in (f"after-attempt:{c}", f"inside:{c}", f"after-result:{c}")],
    "after-model:2",
    "after-attempt:call_2_1",
    "inside:call_2_1",
    "after-result:call_2_1",
    "after-model:3",
]
AGENTS = ["side_effect", "read_only", "idempotent", "keyed", "side_effect-c2"]


def drive(agent: str, run_id: str, crash: str | None) -> tuple[int, dict | None]:
    env = {"DA_LEASE_TTL": "1"}
    if crash and crash.startswith("inside:"):
        env["DA_CRASH_INSIDE"] = crash.split(":", 1)[1]
    elif crash:
        env["DURABLE_AGENTS_CRASH_AT"] = crash
    proc = run_python("tests.support.drive", [f"crash-{agent}", run_id, "go"], **env)
    if proc.returncode == -9:
        return -9, None
    assert proc.returncode == 0, proc.stderr
    return 0, json.loads(proc.stdout.strip().splitlines()[-1])


def reached(agent: str, point: str) -> bool:
    """Attempt markers exist only for tools that are not retry-safe."""
    return not (point.startswith("after-attempt:") and not agent.startswith("side_effect"))


def unknown_outcome(agent: str, hit: list[str]) -> set[str]:
    """Calls whose effect may have happened with no result recorded: where a halt belongs."""
    if not agent.startswith("side_effect"):
        return set()
    return {p.split(":", 1)[1] for p in hit if p.startswith(("after-attempt:", "inside:"))}


def may_halt(agent: str, hit: list[str]) -> set[str]:
    """With parallel calls, a kill anywhere in a turn's batch can also leave the other calls
    of that batch claimed and unfinished: they may halt too, never anything else."""
    allowed = unknown_outcome(agent, hit)
    if agent.endswith("-c2"):
        for point in hit:
            call = (
                point.split(":", 1)[1]
                if point.split(":", 1)[0] in ("after-attempt", "inside", "after-result")
                else ""
            )
            if call.startswith("call_1_"):
                allowed |= {"call_1_1", "call_1_2"}
    return allowed


def check_transcript(run_id: str) -> RunState:
    check_chain(run_id)
    state = RunState.of(Journal(DjangoStore()).records(run_id))
    messages = state.messages()
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            following = messages[i + 1 : i + 1 + len(message.tool_calls)]
            assert [m.tool_call_id for m in following] == [c.id for c in message.tool_calls][
                : len(following)
            ], "tool results follow their call, in call order"
    return state


def scenario(agent: str, crashes: list[str], run_id: str) -> int:
    hit = []
    for point in crashes:
        code, out = drive(agent, run_id, point)
        if code == -9:
            hit.append(point)
        else:
            # Not reached: the run halted first (or the boundary does not exist for it).
            assert not reached(agent, point) or out["status"] == "halted", (point, out)
    code, out = drive(agent, run_id, None)
    assert code == 0
    required, allowed = unknown_outcome(agent, hit), may_halt(agent, hit)
    halts = {h.op_id for h in DjangoStore().list_halts(run_id=run_id)}
    assert required <= halts <= allowed, (hit, halts)
    effects = count_effects(run_id)
    state = check_transcript(run_id)
    if halts:
        assert out["status"] == "halted" and set(out["halts"]) <= halts, out
        assert DjangoStore().get_run(run_id).status == "halted"
    else:
        assert out == {"status": "finished", "answer": "all done"}, out
        assert set(state.results) == set(CALLS) and state.complete is not None
    for call in CALLS:
        fired = effects.get(call, 0)
        if agent.startswith("side_effect"):
            assert fired <= 1, f"{call} fired {fired} times"
            if call in state.results:
                assert not state.results[call].get("is_error"), state.results[call].body
                assert fired == 1, f"{call} has a result but fired {fired} times"
        elif call in state.results:
            reruns = sum(1 for p in hit if p == f"inside:{call}")
            assert 1 <= fired <= 1 + reruns, (call, fired, hit)
    return len(hit)


def _cases() -> list[tuple[str, list[str]]]:
    """Each case kills the driver at one boundary, then the resuming process at a later one,
    then the next at a later one still (where the run gets that far), then finishes."""
    cases = []
    for agent in AGENTS:
        points = [p for p in BOUNDARIES if reached(agent, p)]
        for i, point in enumerate(points):
            crashes = [point]
            later = points[i + 2 :]
            if later:
                crashes.append(later[len(later) // 2])
                rest = points[points.index(crashes[-1]) + 2 :]
                if rest:
                    crashes.append(rest[-1])
            cases.append((agent, crashes))
    return cases


CASES = _cases()


def test_the_matrix_is_big_enough():
    """At least 100 kills land for sure: every first one, and the later ones of runs whose
    earlier kill left no outcome unknown (a halted run stops before later boundaries)."""

    def certain(agent: str, crashes: list[str]) -> int:
        n = 0
        for point in crashes:
            n += 1
            batch = point.split(":")[-1].startswith("call_1") and agent.endswith("-c2")
            if agent.startswith("side_effect") and (
                point.startswith(("after-attempt:", "inside:")) or batch
            ):
                break
        return n

    assert sum(certain(a, c) for a, c in CASES) >= 100


@pytest.mark.timeout(240)
@pytest.mark.parametrize("agent,crashes", CASES, ids=[f"{a}-{'+'.join(c)}" for a, c in CASES])
def test_kill_and_resume(agent, crashes):
    run_id = f"crash-{agent}-{'-'.join(c.replace(':', '_') for c in crashes)}"[:200]
    kills = scenario(agent, crashes, run_id)
    assert kills >= 1, "the first boundary is always reached"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("agent", ["side_effect", "read_only"])
def test_a_kill_with_the_final_answer_in_hand_records_neither_and_repeats_no_effect(agent):
    """The final turn and ``run:complete`` are one write: a driver SIGKILLed with the answer
    in hand (``before-complete``) has recorded neither; the next process asks the model
    again and finishes, and no tool fires again."""
    run_id = f"crash-final-{agent}"
    code, _ = drive(agent, run_id, f"before-complete:{run_id}")
    assert code == -9
    names = [r.name for r in Journal(DjangoStore()).records(run_id)]
    assert "model:3" not in names and "run:complete" not in names
    assert set(CALLS) <= {n.removeprefix("tool:") for n in names}
    code, out = drive(agent, run_id, None)
    assert (code, out) == (0, {"status": "finished", "answer": "all done"})
    assert count_effects(run_id) == dict.fromkeys(CALLS, 1)
    names = [r.name for r in Journal(DjangoStore()).records(run_id)]
    assert names[-2:] == ["model:3", "run:complete"]
