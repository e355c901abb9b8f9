"""``Agent``: a model, instructions and tools, driven durably by the loop.

``agent.run(run_id, input)`` drives a run in this process under a lease and returns a
``RunResult`` or raises a ``Pause``. The store and defaults come from ``engine.runtime``
(the Django app configures them; tests may pass ``store=`` directly).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import runtime
from .errors import ConfigError
from .fingerprint import fingerprint
from .model import Model, Usage
from .ports import Store
from .tools import Tool

if TYPE_CHECKING:
    from .sessions import Session

_REGISTRY: dict[str, Agent] = {}
_REGISTRY_LOCK = threading.Lock()


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


class Agent:
    """An agent definition. Construct it at import time in your own module and list that
    module's dotted path in ``DURABLE_AGENTS["AGENTS"]`` so workers find it by name."""

    def __init__(
        self,
        name: str,
        model: Model,
        instructions: str = "",
        tools: Sequence[Tool] = (),
        *,
        max_turns: int = 20,
        token_budget: int | None = None,
        tool_concurrency: int = 1,
        model_retry: ModelRetry | None = None,
        on_drift: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigError("an agent needs a name of 1-200 characters", code="config.agent")
        if not hasattr(model, "generate"):
            raise ConfigError(
                f"agent {name!r}: model must have a generate(request) method",
                code="config.agent",
            )
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"agent {name!r} has two tools named {duplicates}", code="config.agent"
            )
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(
                    f"agent {name!r}: {t!r} is not a tool; decorate it with @durable_agents.tool",
                    code="config.agent",
                )
        if max_turns < 1 or tool_concurrency < 1:
            raise ConfigError(
                "max_turns and tool_concurrency must be at least 1", code="config.agent"
            )
        if token_budget is not None and token_budget < 1:
            raise ConfigError("token_budget must be a positive int", code="config.agent")
        if on_drift not in (None, "warn", "error", "ignore"):
            raise ConfigError("on_drift is 'warn', 'error' or 'ignore'", code="config.agent")
        self.name = name
        self.model = model
        self.instructions = instructions
        self.tools = {t.name: t for t in tools}
        self.max_turns = max_turns
        self.token_budget = token_budget
        self.tool_concurrency = tool_concurrency
        self.model_retry = model_retry or ModelRetry()
        self.on_drift = on_drift
        self._specs: list[Any] | None = None
        self._fingerprint: dict[str, Any] | None = None
        with _REGISTRY_LOCK:
            _REGISTRY[name] = self

    @property
    def model_id(self) -> str:
        return str(getattr(self.model, "model_id", type(self.model).__name__))

    def tool_specs(self) -> list[Any]:
        if self._specs is None:
            self._specs = [t.spec() for t in self.tools.values()]
        return self._specs

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.model_id, self.instructions, self.tool_specs())
        return dict(self._fingerprint)

    def run(self, run_id: str, input: Any = None, *, store: Store | None = None) -> RunResult:
        """Drive run ``run_id`` to its end in this process, under a lease.

        A new run records ``input``; an unfinished one resumes (``input`` must match what
        it recorded, or be None); a finished one, given the same input or None, returns its
        recorded answer without calling the model. Another input is refused with
        ``ConfigError`` (``config.input_mismatch``) whether the run is finished or not: a run
        id names one request, like an idempotency key; use a new id for a new request.
        Raises a ``Pause`` when the run must wait, ``RunBusy`` when another driver holds it.
        """
        from .loop import drive

        return drive(self, run_id, input, store=store or runtime.store())

    def start(self, input: Any, run_id: str | None = None, *, store: Store | None = None) -> str:
        """Create the run, record its input, and hand it to a driver; return its id at once.

        Inside a transaction, the run and its input are written in that transaction and the
        run is handed over only after it commits (a rolled-back start leaves nothing). The
        same id started again with the same input just hands it over again.
        """
        from .commands import create_run

        store = store or runtime.store()
        run_id = create_run(self, input, run_id, store=store)
        runtime.dispatch(run_id)
        return run_id

    def session(self, session_id: str, *, store: Store | None = None) -> Session:
        """A durable conversation with this agent (see ``engine.sessions``)."""
        from .sessions import Session

        return Session(self, session_id, store=store)

    def __repr__(self) -> str:
        return f"<Agent {self.name}>"


def get_agent(name: str) -> Agent:
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
