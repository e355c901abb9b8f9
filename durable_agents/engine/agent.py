"""``Agent``: the definition (``engine.definition``) and what you do with it, the one
module on top of the engine.

``agent.run(run_id, input)`` drives a run in this process under a lease and returns a
``RunResult`` or raises a ``Pause``. The store and defaults come from ``engine.runtime``
(the Django app configures them; tests may pass ``store=`` directly).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import registry, runtime
from .commands.runs import start
from .commands.sessions import Session
from .definition import AgentDefinition, ModelRetry, RunResult
from .follow import follow
from .loop import drive
from .model import Model
from .ports import Store
from .records import Record
from .registry import get_agent
from .subagents import as_tool
from .tools import Tool, ToolSource

__all__ = ["Agent", "ModelRetry", "RunResult", "get_agent"]


class Agent(AgentDefinition):
    """An agent. Construct it at import time in your own module and list that module's
    dotted path in ``DURABLE_AGENTS["AGENTS"]`` so workers find it by name."""

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
        super().__init__(
            name,
            model,
            instructions,
            tools,
            max_turns=max_turns,
            token_budget=token_budget,
            tool_concurrency=tool_concurrency,
            model_retry=model_retry,
            on_drift=on_drift,
            saga=saga,
            durability=durability,
            max_concurrent_runs=max_concurrent_runs,
        )
        registry.register(self)

    def run(self, run_id: str, input: Any = None, *, store: Store | None = None) -> RunResult:
        """Drive run ``run_id`` to its end in this process, under a lease.

        A new run records ``input``; an unfinished one resumes (``input`` must match what
        it recorded, or be None); a finished one, given the same input or None, returns its
        recorded answer without calling the model. Another input is refused with
        ``ConfigError`` (``config.input_mismatch``) whether the run is finished or not: a run
        id names one request, like an idempotency key; use a new id for a new request.
        Raises a ``Pause`` when the run must wait, ``RunBusy`` when another driver holds it.
        """
        return drive(self, run_id, input, store=store or runtime.store())

    def run_saga(self, run_id: str, input: Any = None, *, store: Store | None = None) -> RunResult:
        """``run``, as a saga (docs/composition.md) even if this agent was not made with
        ``saga=True``: when the run fails for good, its completed compensable calls (and its
        sub-runs') are undone, latest first, and it raises ``SagaAborted``. Saga mode is
        recorded in the run's ``run:start``, so a resume anywhere (``run``, ``da.resume``, a
        worker) keeps it. A run already started without it is refused
        (``config.saga_mismatch``): saga mode is chosen when a run starts."""
        return drive(self, run_id, input, store=store or runtime.store(), saga=True)

    def start(
        self,
        input: Any,
        run_id: str | None = None,
        *,
        store: Store | None = None,
        by: Any = None,
    ) -> str:
        """Create the run, record its input, and hand it to a driver; return its id at once.

        Inside a transaction, the run and its input are written in that transaction and the
        run is handed over only after it commits (a rolled-back start leaves nothing). The
        same id started again with the same input just hands it over again. ``by`` (a user
        or a username): who asked for it, logged, and the requester an approval rule that
        separates duties keeps from deciding the run's calls.
        """
        return start(self, input, run_id, store=store, by=by)

    def as_tool(self, name: str | None = None, description: str | None = None) -> Tool:
        """This agent as a tool for another agent: each call runs a child run
        ``<parent>/<call_id>`` of this agent and returns its answer (docs/composition.md)."""
        return as_tool(self, name, description)

    def session(
        self, session_id: str, *, store: Store | None = None, channel: str = "site"
    ) -> Session:
        """A durable conversation with this agent (see ``engine.commands.sessions``), as
        the ``channel`` its messages come from: a session takes messages only from the
        channel that opened it (the site's own code is ``"site"``; docs/sessions.md)."""
        return Session(self, session_id, store=store, channel=channel)

    def events(
        self, run_id: str, after: int = 0, *, store: Store | None = None
    ) -> Iterator[Record]:
        """The journal records of run ``run_id`` with ``seq > after``, each as soon as it is
        committed, in ``seq`` order; the iterator ends when the run ends or pauses. Resume
        with ``after=`` the last ``seq`` seen. With the Django app on PostgreSQL it waits on
        ``LISTEN``/``NOTIFY`` (``durable_agents.database.events``); otherwise it polls the store.
        It reads any run, not only this agent's."""
        source = runtime.events_source()
        if store is None and source is not None:
            return source(run_id, after)
        return follow(store or runtime.store(), run_id, after)
