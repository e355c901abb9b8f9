"""Unit tests run the engine as plain Python on the in-memory store.

There is no user system, so ``by="ann"`` is a trusted caller (``engine.identity.plain_actor``);
identity rules are tested with explicit ``Actor`` objects and, against real users, in
tests/integration."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Clock, crash_points, hooks_at_points
from tests.support.wiring import wired


@pytest.fixture(autouse=True)
def _no_user_system() -> Iterator[None]:
    with wired(resolve_actor=None):
        yield


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> Iterator[InMemoryStore]:
    """A fresh in-memory store on the test's virtual ``clock``. A run a command queues is
    driven at once, here, on this store (the site's inline dispatch); leases last 30 s and a
    halt may be resolved at once, as in the test settings."""
    store = InMemoryStore(clock=clock)
    with wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        lease_ttl=lambda: 30.0,
        halt_min_age=lambda: 0.0,
    ):
        yield store


@pytest.fixture
def fired() -> list:
    """What the test's tools did, in order: a side-effect counter outside the journal."""
    return []


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at("after-decision:call_1_1")``: the process dies at that failpoint, once."""
    return crash_points(monkeypatch)


@pytest.fixture
def at_point(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Callable[[], None]], None]:
    """``at_point(name, fn)``: run ``fn`` when the engine reaches the named point (once)."""
    return hooks_at_points(monkeypatch)
