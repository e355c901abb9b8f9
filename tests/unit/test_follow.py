"""Following a run on any store by polling (``engine.follow``): records in order, each once,
the status first and on change, idle ticks, and the end on a pause or a finish."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.errors import NotFound
from durable_agents.engine.follow import ends, follow, ticks
from durable_agents.engine.ports import AWAITING_APPROVAL, FINISHED, RUNNING, RunInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.wiring import wired


def test_follow_polls_until_the_run_pauses_and_a_watch_goes_on_until_it_ends(store):
    store.create_run(RunInfo(run_id="f1", agent="a", status=RUNNING))
    store.insert("f1", "step:0", '{"kind":"step"}')
    script = iter(
        [
            lambda: store.insert("f1", "step:1", '{"kind":"step"}'),
            lambda: None,  # a quiet poll
            lambda: store.insert("f1", "step:2", '{"kind":"step"}'),
            lambda: store.update_run("f1", {"status": AWAITING_APPROVAL}),
            lambda: store.insert("f1", "step:3", '{"kind":"step"}'),
            lambda: store.update_run("f1", {"status": FINISHED}),
        ]
    )
    with wired(sleep=lambda seconds: next(script)()):
        names = [r.name for r in follow(store, "f1")]
        assert names == ["step:0", "step:1", "step:2"]  # ends on the pause
        watched = list(ticks(store, "f1", after=3, stop=ends))
    assert [getattr(i, "name", i) for i in watched] == [
        AWAITING_APPROVAL,
        "step:3",
        FINISHED,
    ]


def test_idle_ticks_and_an_unknown_run(store):
    store.create_run(RunInfo(run_id="f2", agent="a", status=RUNNING))
    with wired(sleep=lambda seconds: None, monotonic=iter(range(0, 1000, 5)).__next__):
        stream = ticks(store, "f2", idle=9.0)
        assert next(stream) == RUNNING
        assert next(stream) is None  # 10 virtual seconds without news
    with pytest.raises(NotFound):
        list(follow(store, "nope"))


def test_agent_events_on_an_in_memory_store(store):
    agent = da.Agent("ev-unit", ScriptedModel([scripted.text("hi")]), "Say hi.")
    agent.run("u1", "hello", store=store)
    records = list(agent.events("u1", store=store))
    assert [r.name for r in records] == [e.name for e in store.load("u1")]
    assert records[-1].kind == "complete"
