"""Limits through real Celery workers (docs/limits.md): many runs on several worker
processes, each tool measuring for itself how many calls run at once (a Redis counter the
tools keep, ``tests.support.limit_agents``), and a worker SIGKILLed while it holds a slot.
Nothing of Celery, the store or the leases is mocked."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from durable_agents.engine.ports import FINISHED
from durable_agents.models import Slot, Throttle
from tests.integration.test_celery_workers import (  # noqa: F401  (fixtures)
    RUN_TIMEOUT,
    celery,
    target,
    wait_status,
)
from tests.support.agents import count_effects
from tests.support.limit_agents import dying, limited_runs, limited_tool, unlimited
from tests.support.workers import pid_alive, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]

REDIS = "redis://127.0.0.1:6379/15"
RUNS = 8


@pytest.fixture
def measure():
    """The tools' own count of calls in flight: a fresh prefix per test."""
    client = redis.Redis.from_url(REDIS)
    prefix = f"da-limits-{uuid.uuid4().hex[:10]}"
    yield prefix, client
    for suffix in ("in", "max", "killed"):
        client.delete(f"{prefix}:{suffix}")


def _start_many(agent, prefix: str, n: int) -> list[str]:
    where = json.dumps({"redis": REDIS, "prefix": prefix})
    return [agent.start(where, run_id=f"{agent.name}-{uuid.uuid4().hex[:8]}") for _ in range(n)]


def _most_at_once(client, prefix: str) -> int:
    return int(client.get(f"{prefix}:max") or 0)


def _all_finished(run_ids: list[str], timeout: float = 3 * RUN_TIMEOUT) -> None:
    for run_id in run_ids:
        wait_status(run_id, FINISHED, timeout=timeout)


def test_an_agents_run_limit_holds_across_workers(celery, measure):  # noqa: F811
    prefix, client = measure
    for _ in range(2):
        celery.worker("threads", 4)
    runs = _start_many(limited_runs, prefix, RUNS)
    _all_finished(runs)
    assert _most_at_once(client, prefix) == 2, "never more than the limit, and the limit used"
    # Every call ran once: waiting ran nothing again.
    assert all(count_effects(r) == {"call_1": 1, "call_2": 1} for r in runs)
    # Some runs had to wait, and said so (their throttle rows stay as a record).
    assert Throttle.objects.filter(run_id__in=runs, key="agent/limit-runs").exists()


def test_without_the_limit_the_same_runs_overlap_more(celery, measure):  # noqa: F811
    """The measurement can fail: the same work with no limit runs more than two at once."""
    prefix, client = measure
    for _ in range(2):
        celery.worker("threads", 4)
    runs = _start_many(unlimited, prefix, RUNS)
    _all_finished(runs)
    assert _most_at_once(client, prefix) > 2


def test_a_tools_concurrency_holds_across_workers(celery, measure):  # noqa: F811
    prefix, client = measure
    for _ in range(2):
        celery.worker("threads", 3)
    runs = _start_many(limited_tool, prefix, 6)
    _all_finished(runs)
    assert _most_at_once(client, prefix) == 1
    assert all(count_effects(r) == {"call_1": 1, "call_2": 1} for r in runs)


def test_a_worker_killed_holding_a_slot_does_not_leak_it(celery, measure):  # noqa: F811
    prefix, client = measure
    [doomed] = _start_many(dying, prefix, 1)
    victim = celery.worker("threads", 2, DA_LIMIT_KILL_RUN=doomed)
    wait_for(lambda: client.get(f"{prefix}:killed"), RUN_TIMEOUT, "the tool to kill its worker")
    wait_for(lambda: not pid_alive(victim.proc.pid), RUN_TIMEOUT, "the worker to die")
    # It died inside its call, holding the agent's only slot: its row is still there.
    assert Slot.objects.filter(key="agent/limit-dying", run_id=doomed).exists()
    client.decr(f"{prefix}:in")  # the dead call is not running any more
    celery.worker("threads", 2)
    celery.beat()  # recovery hands the dead driver's run over
    others = _start_many(dying, prefix, 3)
    # A leaked slot would keep every one of them throttled for ever.
    _all_finished([doomed, *others])
    assert _most_at_once(client, prefix) == 1
    # Every slot was given back, the dead one's deleted by the next claim of its key.
    assert not Slot.objects.filter(key="agent/limit-dying").exists()
    assert all(count_effects(r) == {"call_1": 1, "call_2": 1} for r in others)
    # The dead call was read-only: re-run after the crash, so it fired once when it finished.
    assert count_effects(doomed) == {"call_1": 1, "call_2": 1}
