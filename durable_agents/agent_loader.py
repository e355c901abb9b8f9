"""Finding agents by name in any process: import what ``DURABLE_AGENTS["AGENTS"]`` names (an
``Agent`` object, a list of them, or a module defining them).

``manage.py check`` runs the same import (``agent_problems``), so a misspelled path or two
agents with one name stop the site at startup instead of failing a run later.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from django.utils.module_loading import import_string

from .conf import get_settings
from .engine.agent import Agent
from .engine.errors import AgentPathError, ConfigError

_loaded: set[tuple[str, ...]] = set()
_lock = threading.Lock()


def agents_at(path: str) -> list[Agent]:
    """The agents ``path`` names; ``AgentPathError`` with the import's own message if it
    cannot be imported or names no agent."""
    try:
        target = _import(path)
    except Exception as exc:
        raise AgentPathError(
            f"DURABLE_AGENTS['AGENTS'] names {path!r}, which cannot be imported: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    agents = _agents_in(target)
    if not agents:
        raise AgentPathError(
            f"DURABLE_AGENTS['AGENTS'] names {path!r}, which is not an Agent, a list of "
            "Agents or a module defining one"
        )
    return agents


def _import(path: str) -> Any:
    """An object by dotted path, or else a module by that name."""
    try:
        return import_string(path)
    except ImportError as attribute_error:
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError as module_error:
            if module_error.name == path:  # not a module either: the first error says why
                raise attribute_error from None
            raise


def _agents_in(target: Any) -> list[Agent]:
    if isinstance(target, Agent):
        return [target]
    if isinstance(target, ModuleType):
        values: Iterable[Any] = vars(target).values()
    elif isinstance(target, list | tuple):
        values = target
    else:
        return []
    found: list[Agent] = []
    for value in values:
        for agent in [value] if isinstance(value, Agent) else _listed(value):
            if all(agent is not other for other in found):
                found.append(agent)
    return found


def _listed(value: Any) -> list[Agent]:
    if isinstance(value, list | tuple) and value and all(isinstance(v, Agent) for v in value):
        return list(value)
    return []


def configured_agents(paths: Iterable[str]) -> dict[str, Agent]:
    """Every agent the paths name, by name; ``ConfigError`` if one cannot be imported or two
    distinct agents share a name (a worker could not tell which one a run belongs to)."""
    by_name: dict[str, Agent] = {}
    where: dict[str, str] = {}
    for path in paths:
        for agent in agents_at(path):
            other = by_name.get(agent.name)
            if other is not None and other is not agent:
                raise ConfigError(
                    f"two agents are named {agent.name!r} (in {where[agent.name]!r} and "
                    f"{path!r}); a run names its agent, so give each agent its own name",
                    code="config.agent_duplicate",
                )
            by_name[agent.name] = agent
            where.setdefault(agent.name, path)
    return by_name


def load_agents() -> None:
    """Import the configured agents (once per process and setting), so ``get_agent`` finds
    them by name."""
    paths = get_settings().agents
    if paths in _loaded:
        return
    with _lock:
        if paths in _loaded:
            return
        configured_agents(paths)  # importing an agent registers it by name
        _loaded.add(paths)
