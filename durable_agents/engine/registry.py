"""Agents by name, in one place: a run names its agent, and any process drives it by that
name once the modules defining agents are loaded (the glue's loader, through ``runtime``)."""

from __future__ import annotations

import threading

from . import runtime
from .definition import AgentDefinition
from .errors import ConfigError

_REGISTRY: dict[str, AgentDefinition] = {}
_REGISTRY_LOCK = threading.Lock()


def register(agent: AgentDefinition) -> None:
    """Make ``agent`` the one its name finds (the last one made under a name wins)."""
    with _REGISTRY_LOCK:
        _REGISTRY[agent.name] = agent


def get_agent(name: str) -> AgentDefinition:
    """The agent registered under ``name`` (after the modules defining agents were loaded)."""
    runtime.load_agents()
    with _REGISTRY_LOCK:
        agent = _REGISTRY.get(name)
    if agent is None:
        raise ConfigError(
            f"no agent named {name!r} is loaded; list the module defining it in "
            "DURABLE_AGENTS['AGENTS']",
            code="config.agent_missing",
        )
    return agent
