"""The MCP tests: real MCP servers (``tests/support/mcp_server.py``) as subprocesses, the
engine on the in-memory store. One stdio server and one HTTP server per module (starting
one costs about two seconds: the mcp package's import)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import durable_agents as da
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.testing import InMemoryStore
from tests.support.doubles import Clock
from tests.support.mcp_servers import HttpServer, stdio
from tests.support.wiring import wired


@pytest.fixture(autouse=True)
def _no_user_system() -> Iterator[None]:
    with wired(resolve_actor=None):
        yield


@pytest.fixture
def store() -> Iterator[InMemoryStore]:
    """A fresh in-memory store; a run a command queues is driven at once, here."""
    store = InMemoryStore(clock=Clock())
    with wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        lease_ttl=lambda: 30.0,
        halt_min_age=lambda: 0.0,
    ):
        yield store


@pytest.fixture(scope="module")
def effects_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "effects.jsonl"


@pytest.fixture(scope="module")
def crm(effects_file: Path) -> Iterator[da.mcp.Server]:
    """The stdio server, untrusted: every tool a side effect."""
    server = stdio(effects_file)
    yield server
    server.close()


@pytest.fixture(scope="module")
def trusted(effects_file: Path) -> Iterator[da.mcp.Server]:
    """The stdio server again, its annotations trusted."""
    server = stdio(effects_file, name="crm-trusted", trust_annotations=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def http_server(effects_file: Path) -> Iterator[HttpServer]:
    server = HttpServer(effects_file)
    server.start()
    yield server
    server.kill()
