"""A driver that takes a run over from another holder's expired lease journals it
(``@takeover/<nonce>``): an internal record, beside the run's steps, never replayed."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.admin.timeline import build_timeline
from durable_agents.engine import names
from durable_agents.engine.commands.forks import fork
from durable_agents.engine.journal import Journal, header
from durable_agents.engine.ports import RunInfo
from durable_agents.engine.steps import history
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


def _agent(seen: list[str]) -> da.Agent:
    @da.tool(read_only=True)
    def look(n: int) -> str:
        seen.append(f"look {n}")
        return f"found {n}"

    script = [scripted.calls(scripted.call("look", {"n": 1})), scripted.text("done")]
    return da.Agent("takeover", ScriptedModel(script), "", [look])


def _takeovers(store, run_id):
    return [r for r in Journal(store).records(run_id) if r.name.startswith(names.TAKEOVER)]


def _dead_driver(store, run_id: str) -> None:
    """A driver that opened the run's journal and died: its lease stays until it expires."""
    store.create_run(RunInfo(run_id, agent="takeover"))
    store.insert(run_id, *header())
    assert store.acquire_lease(run_id, "worker-dead@host:41", "dead-token", 30)


def test_taking_over_an_expired_lease_is_journaled(store, clock):
    seen: list[str] = []
    a = _agent(seen)
    _dead_driver(store, "r1")
    with pytest.raises(da.RunBusy):
        a.run("r1", "go", store=store)
    assert _takeovers(store, "r1") == []
    clock.t += 31
    assert a.run("r1", "go", store=store).answer == "done"
    [rec] = _takeovers(store, "r1")
    assert rec.get("previous_holder") == "worker-dead@host:41"
    assert rec.get("reason") == "expired"
    assert rec.get("holder") and rec.get("holder") != "worker-dead@host:41"
    assert rec.get("expired_at") and rec.get("renewed_at")
    # Evidence beside the steps: the run's history and answer are those of a run never taken over.
    assert [s.text for s in history("r1", store=store)] == ["", "done"]
    assert seen == ["look 1"]


def test_a_free_or_released_lease_is_no_takeover(store, clock):
    seen: list[str] = []
    a = _agent(seen)
    assert a.run("r1", "go", store=store).answer == "done"
    assert a.run("r1", None, store=store).answer == "done"
    assert _takeovers(store, "r1") == []


def test_a_takeover_is_its_own_timeline_entry_and_a_fork_does_not_copy_it(store, clock):
    seen: list[str] = []
    a = _agent(seen)
    _dead_driver(store, "r1")
    clock.t += 31
    a.run("r1", "go", store=store)
    timeline = build_timeline(Journal(store).records("r1"))
    [entry] = [e for e in timeline if e["name"].startswith(names.TAKEOVER)]
    assert entry["kind"] == "takeover" and not entry["internal"]
    assert "took the run over from worker-dead@host:41" in entry["title"]
    assert any("lease had expired" in m for m in entry["meta"])
    copy = fork("r1", 1, store=store)
    assert _takeovers(store, copy) == []


def test_a_driver_dead_before_the_journal_opened_leaves_no_takeover_record(store, clock):
    seen: list[str] = []
    a = _agent(seen)
    store.create_run(RunInfo("r1", agent=a.name))
    assert store.acquire_lease("r1", "worker-dead@host:41", "dead-token", 30)
    clock.t += 31
    assert a.run("r1", "go", store=store).answer == "done"
    assert _takeovers(store, "r1") == []
    assert Journal(store).records("r1")[0].name == names.HEADER
