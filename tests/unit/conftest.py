"""Unit tests run the engine as plain Python: no user system, so ``by="ann"`` is a trusted
caller (``engine.identity.plain_actor``). Identity rules are tested with explicit
``Actor`` objects and, against real users, in tests/integration."""

import pytest

from durable_agents.engine import runtime


@pytest.fixture(autouse=True)
def _no_user_system():
    saved = runtime._runtime.resolve_actor
    runtime.configure(resolve_actor=None)
    yield
    runtime.configure(resolve_actor=saved)
