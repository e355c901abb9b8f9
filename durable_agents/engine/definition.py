"""An agent's definition: a model, instructions and tools, checked once, with its
fingerprint; and what a finished run returns (``RunResult``).

The loop and the commands depend on this definition only. What you *do* with an agent
(``run``, ``start``, ``session``) is the facade in ``engine.agent``, the one module on top.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import durability as dial
from .errors import ConfigError
from .fingerprint import fingerprint, tools_digest
from .limits import check_limit
from .model import Model, Usage
from .tools import Tool, ToolSource, is_tool_source


@dataclass(frozen=True)
class ModelRetry:
    """How the loop retries a retryable model failure (rate limit, 5xx, timeout)."""

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_delay, self.base_delay * (2 ** max(0, attempt - 1))))


@dataclass(frozen=True)
class RunResult:
    """A finished run: its answer and what the whole run cost (identical however many
    crashes it went through)."""

    run_id: str
    answer: str
    usage: Usage
    spend: Usage
    turns: int
    events: Sequence[dict[str, Any]] = field(default=(), repr=False)


class AgentDefinition:
    """What an agent is, checked when it is made; ``engine.agent.Agent`` adds what you do
    with it."""

    def __init__(
        self,
        name: str,
        model: Model,
        instructions: str = "",
        tools: Sequence[Tool | ToolSource] = (),
        *,
        max_turns: int = 20,
        token_budget: int | None = None,
        tool_concurrency: int = 1,
        model_retry: ModelRetry | None = None,
        on_drift: str | None = None,
        saga: bool = False,
        durability: str = "sync",
        max_concurrent_runs: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigError("an agent needs a name of 1-200 characters", code="config.agent")
        if not hasattr(model, "generate"):
            raise ConfigError(
                f"agent {name!r}: model must have a generate(request) method",
                code="config.agent",
            )
        # A tool source (an MCP server) lists its tools when the agent first needs them.
        sources: list[ToolSource] = []
        direct: list[Tool] = []
        for t in tools:
            if isinstance(t, Tool):
                direct.append(t)
            elif is_tool_source(t):
                sources.append(t)
            else:
                raise ConfigError(
                    f"agent {name!r}: {t!r} is not a tool; decorate it with @durable_agents.tool",
                    code="config.agent",
                )
        names = [t.name for t in direct]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"agent {name!r} has two tools named {duplicates}", code="config.agent"
            )
        if max_turns < 1 or tool_concurrency < 1:
            raise ConfigError(
                "max_turns and tool_concurrency must be at least 1", code="config.agent"
            )
        if token_budget is not None and token_budget < 1:
            raise ConfigError("token_budget must be a positive int", code="config.agent")
        if on_drift not in (None, "warn", "error", "ignore"):
            raise ConfigError("on_drift is 'warn', 'error' or 'ignore'", code="config.agent")
        if not isinstance(saga, bool):
            raise ConfigError("saga must be True or False", code="config.agent")
        # Which records may commit without waiting for the disk (``engine.durability``).
        self.durability = dial.check(durability, name)
        self.name = name
        # A saga undoes its completed compensable calls when it fails for good (``sagas``).
        self.saga = saga
        self.model = model
        self.instructions = instructions
        self._sources: list[ToolSource] = sources
        self._tools: dict[str, Tool] | None = None if sources else {t.name: t for t in direct}
        self._direct = direct
        self._tools_lock = threading.Lock()
        self.max_turns = max_turns
        self.token_budget = token_budget
        self.tool_concurrency = tool_concurrency
        self.model_retry = model_retry or ModelRetry()
        self.on_drift = on_drift
        # How many of this agent's runs may be driven at once, across every process
        # (``engine.limits``); None: no limit. Not part of the fingerprint: a limit changes
        # when a run goes, not what it does.
        self.max_concurrent_runs = check_limit(
            max_concurrent_runs, f"agent {name!r}: max_concurrent_runs"
        )
        self._specs: list[Any] | None = None
        self._fingerprint: dict[str, Any] | None = None
        self._tools_digest: str | None = None

    @property
    def tools(self) -> dict[str, Tool]:
        """The agent's tools by name. Those of a tool source (``durable_agents.mcp.Server``)
        are listed the first time this is read in a process, not when the agent is made:
        a source that cannot list them raises its own error, and the next read tries again."""
        if self._tools is None:
            with self._tools_lock:
                if self._tools is None:
                    self._tools = self._load_tools()
        return self._tools

    def limited_tools(self) -> list[tuple[str, Any, int | None]]:
        """Each tool with a limit: (its name, its rate, its ``max_concurrent``). A tool
        source that can say its tools' limits without listing them (an MCP server: the
        site's ``ToolOptions``) is not connected to for this, so a page of limits never
        starts a server, nor fails because one is down; another source is listed."""
        if self._tools is not None:
            tools: list[Any] = list(self._tools.values())
            declared: list[tuple[str, Any, int | None]] = []
        else:
            tools, declared = list(self._direct), []
            for source in self._sources:
                limits = getattr(source, "declared_limits", None)
                if limits is None:
                    return [
                        (t.name, t.rate, t.max_concurrent)
                        for t in self.tools.values()
                        if t.rate is not None or t.max_concurrent is not None
                    ]
                declared += limits()
        own = [
            (t.name, t.rate, t.max_concurrent)
            for t in tools
            if t.rate is not None or t.max_concurrent is not None
        ]
        return own + declared

    def _load_tools(self) -> dict[str, Tool]:
        found: dict[str, tuple[Tool, str]] = {t.name: (t, "a Python tool") for t in self._direct}
        for source in self._sources:
            for t in source.load_tools():
                if not isinstance(t, Tool):
                    raise ConfigError(
                        f"agent {self.name!r}: {source!r} listed {t!r}, which is not a tool",
                        code="config.agent",
                    )
                if t.name in found:
                    raise ConfigError(
                        f"agent {self.name!r}: the tool name {t.name!r} of {source!r} is also "
                        f"the name of {found[t.name][1]}; rename one (an MCP server's "
                        "names={...})",
                        code="config.tool_name",
                    )
                found[t.name] = (t, repr(source))
        return {n: t for n, (t, _) in found.items()}

    @property
    def model_id(self) -> str:
        return str(getattr(self.model, "model_id", type(self.model).__name__))

    def tool_specs(self) -> list[Any]:
        if self._specs is None:
            self._specs = [t.spec() for t in self.tools.values()]
        return self._specs

    def tools_digest(self) -> str:
        """The digest of the tool specs the model is shown (each turn records it; replay
        compares it). Not the fingerprint's tools: a tool the site did not write is hashed
        whole there, its server's definition included. Computed once per agent."""
        if self._tools_digest is None:
            self._tools_digest = tools_digest(self.tool_specs())
        return self._tools_digest

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            definitions = {
                name: (str((t.origin or {}).get("server") or ""), t.definition_digest)
                for name, t in self.tools.items()
                if t.definition_digest
            }
            self._fingerprint = fingerprint(
                self.model_id, self.instructions, self.tool_specs(), definitions
            )
        return dict(self._fingerprint)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
