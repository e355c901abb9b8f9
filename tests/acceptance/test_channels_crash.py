"""SIGKILL around a channel: an enqueuer killed after its message was journaled but before
the run was handed over, a driver killed after handling a message but before acking it, and
one killed after the ack but before the tool's result. Each time a fresh process goes on;
each handling is counted outside the journal (``handle:<key>`` rows)."""

from __future__ import annotations

import json

import pytest

from durable_agents.database.store import site_store
from durable_agents.engine import names
from durable_agents.models import Run
from tests.support.agents import count_effects
from tests.support.procs import run_module

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

READ = "call_1_1"


def drive(run_id: str, text: str | None = None, **env: str) -> tuple[int, dict | None]:
    code, out = run_module("tests.support.drive", "inbox", run_id, *([text] if text else []), **env)
    return code, json.loads(out) if out else None


def enqueue(run_id: str, key: str, payload: str, **env: str) -> tuple[int, dict | None]:
    code, out = run_module("tests.support.enqueue", run_id, "box", key, json.dumps(payload), **env)
    return code, json.loads(out) if out else None


def handled(run_id: str) -> dict[str, int]:
    return {
        call.removeprefix("handle:"): n
        for call, n in count_effects(run_id).items()
        if call.startswith("handle:")
    }


def _acked_once_by_the_call(run_id: str, *keys: str) -> None:
    store = site_store()
    for key in keys:
        ack = store.get(run_id, names.ack("box", key))
        assert ack is not None and json.loads(ack.data)["call_id"] == READ


def test_an_enqueue_killed_before_the_hand_over_is_finished_by_the_redelivery():
    assert drive("c-1", "read")[1] == {"status": "awaiting_input", "waits": ["box"]}
    code, _ = enqueue("c-1", "m1", "stop", DURABLE_AGENTS_CRASH_AT="after-enqueue:box:m1")
    assert code == -9
    # Journaled, but the run was never queued: it still shows as waiting...
    assert site_store().get("c-1", names.message("box", "m1")) is not None
    assert Run.objects.get(run_id="c-1").status == "awaiting_input"
    # ...until the sender's retry of the same key (another payload: the first one stands).
    assert enqueue("c-1", "m1", "other")[1] == {"recorded": False, "value": "stop"}
    assert drive("c-1")[1] == {"status": "finished", "answer": "all read"}
    assert handled("c-1") == {"m1": 1}
    _acked_once_by_the_call("c-1", "m1")


def test_an_enqueue_killed_before_the_hand_over_is_handed_over_by_the_sweep():
    """Issue 17: the sender never retries; the periodic sweep (``wake_timers``) sees a run
    waiting on a channel that has its message and hands it over, once."""
    from durable_agents.engine.commands.timers import wake_timers

    assert drive("c-4", "read")[1] == {"status": "awaiting_input", "waits": ["box"]}
    code, _ = enqueue("c-4", "m1", "stop", DURABLE_AGENTS_CRASH_AT="after-enqueue:box:m1")
    assert code == -9
    assert Run.objects.get(run_id="c-4").status == "awaiting_input"
    assert wake_timers() == ["c-4"]
    assert Run.objects.get(run_id="c-4").status == "finished"
    assert wake_timers() == []
    assert handled("c-4") == {"m1": 1}
    _acked_once_by_the_call("c-4", "m1")


def test_a_driver_killed_before_its_ack_handles_the_message_again():
    assert drive("c-2", "read")[1] == {"status": "awaiting_input", "waits": ["box"]}
    # The enqueue hands the run to a driver in its own process (inline dispatch), which is
    # killed after handling m1, before acking it.
    code, _ = enqueue("c-2", "m1", "hello", DA_CRASH_BEFORE_ACK="m1")
    assert code == -9
    assert site_store().get("c-2", names.ack("box", "m1")) is None
    assert enqueue("c-2", "m2", "stop")[1] == {"recorded": True, "value": "stop"}
    assert drive("c-2")[1] == {"status": "finished", "answer": "all read"}
    # Not acked, so received again: handling must be idempotent until the ack.
    assert handled("c-2") == {"m1": 2, "m2": 1}
    _acked_once_by_the_call("c-2", "m1", "m2")


def test_a_driver_killed_after_its_ack_never_gets_that_message_again():
    assert drive("c-3", "read")[1] == {"status": "awaiting_input", "waits": ["box"]}
    code, _ = enqueue("c-3", "m1", "hello", DA_CRASH_AFTER_ACK="m1")
    assert code == -9
    assert site_store().get("c-3", names.ack("box", "m1")) is not None
    assert site_store().get("c-3", names.tool(READ)) is None
    # The tool runs again from the top: m1 is consumed, so it waits for the next message.
    assert drive("c-3")[1] == {"status": "awaiting_input", "waits": ["box"]}
    assert enqueue("c-3", "m2", "stop")[1] == {"recorded": True, "value": "stop"}
    assert drive("c-3")[1] == {"status": "finished", "answer": "all read"}
    assert handled("c-3") == {"m1": 1, "m2": 1}
    _acked_once_by_the_call("c-3", "m1", "m2")
