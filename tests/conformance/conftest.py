"""The store fixture: every conformance test runs on InMemoryStore, PostgreSQL and SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo
from durable_agents.testing import InMemoryStore
from tests.support.doubles import crash_points
from tests.support.stores import STORES
from tests.support.wiring import wired


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, request: pytest.FixtureRequest):
    if store_kind == "memory":
        return InMemoryStore()
    return DjangoStore(using="default" if store_kind == "postgres" else "sqlite")


@pytest.fixture
def run_id(store) -> str:
    rid = f"run-{uuid.uuid4().hex[:12]}"
    store.create_run(RunInfo(run_id=rid, agent="test"))
    return rid


@pytest.fixture(autouse=True)
def _no_user_system():
    """Store rules, not identity: ``by="ann"`` is a trusted caller here (no user system)."""
    with wired(resolve_actor=None):
        yield


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at("after-decision:c1")``: the process dies (``Crash``) at that failpoint,
    once; the writes before it stay, as after a SIGKILL."""
    return crash_points(monkeypatch)
