"""Process-wide wiring the engine reads but does not decide: which store to use, how to
load agent definitions, lease and drift defaults. The Django app fills it in when it is
ready; plain-Python users and tests call ``configure`` themselves (or pass ``store=``).

Everything the engine needs from above it arrives here as a value, never as an import:
even the inline driver that ``dispatch`` falls back to without a dispatcher is handed in
(by ``commands.runs``), so this module depends only on the modules below it."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .ports import Store
from .retry import RetryPolicy


@dataclass
class Runtime:
    store_factory: Callable[[], Store] | None = None
    agent_loader: Callable[[], None] | None = None
    lease_ttl: Callable[[], float] = lambda: 30.0
    on_drift: Callable[[], str] = lambda: "warn"
    # Hands a run to a driver: Celery after commit, or inline. None: drive it right here,
    # with ``inline_driver``.
    dispatcher: Callable[[str], None] | None = None
    # Drives a run here and now, a pause or a busy run being an outcome: the engine's own
    # ``commands.runs.drive_quietly``, installed when that module loads.
    inline_driver: Callable[[str], object] | None = None
    # True once this process is shutting down: drivers stop after the step in flight.
    should_stop: Callable[[], bool] = lambda: False
    # Who may decide a Quorum gate of a group (usernames), and the Ed25519 public keys
    # (base64) registered to a user, by the user's stable id.
    eligible_approvers: Callable[[str], list[str]] = lambda group: []
    approver_keys: Callable[[str], list[str]] = lambda user_id: []
    # Turns a command's ``by=`` (a user object or a username) into an ``identity.Actor``, or
    # None when it names no user. None here: a plain name is a trusted caller.
    resolve_actor: Callable[[Any], Any] | None = None
    # How old (by the store's clock) a halt must be before a person may resolve it; by
    # default twice the lease, so a driver that merely stalled has lost its lease for a
    # whole lease period before anyone decides what happened.
    halt_min_age: Callable[[], float] | None = None
    # How often, and how soon, a run whose drive failed or whose driver died is handed over.
    retry_policy: Callable[[], RetryPolicy] = RetryPolicy
    # Seconds between recovery passes: recovery hands a run over again no sooner than this.
    recovery_interval: Callable[[], float] = lambda: 15.0
    # Real-time waits (model retry backoff, waiting for another caller's turn); a simulator
    # may replace them with its own clock.
    sleep: Callable[[float], None] = time.sleep
    # Follows a run's journal as it is committed (``agent.events``): the glue's, which
    # listens for notifications; None: poll the store (``engine.follow.follow``).
    events: Callable[[str, int], Iterator[Any]] | None = None
    monotonic: Callable[[], float] = time.monotonic
    # How many levels of sub-runs (``agent.as_tool()``) a tree may have below its root.
    subagent_depth: Callable[[], int] = lambda: 5
    # Calls per period a site allows each model provider (``engine.limits``), by the name its
    # adapter gives (``model.provider``): the Django app's ``MODEL_RATES``.
    model_rates: Callable[[], Mapping[str, Any]] = dict

    def __post_init__(self) -> None:
        if self.halt_min_age is None:
            self.halt_min_age = lambda: 2 * float(self.lease_ttl())


_runtime = Runtime()


def configure(**values: Any) -> None:
    """Set wiring: ``store_factory``, ``agent_loader``, ``lease_ttl``, ``on_drift``,
    ``dispatcher``, ``inline_driver``, ``should_stop``, ``eligible_approvers``, ``approver_keys``,
    ``resolve_actor``, ``halt_min_age``, ``retry_policy``, ``recovery_interval``, ``sleep``,
    ``monotonic``, ``subagent_depth``, ``events``, ``model_rates``."""
    for key, value in values.items():
        if not hasattr(_runtime, key):
            raise ConfigError(f"unknown runtime setting {key!r}", code="config.runtime")
        setattr(_runtime, key, value)


def store() -> Store:
    if _runtime.store_factory is None:
        raise ConfigError(
            "no store is configured: add 'durable_agents' to INSTALLED_APPS, or pass store= "
            "(e.g. durable_agents.testing.InMemoryStore())",
            code="config.store",
        )
    return _runtime.store_factory()


def load_agents() -> None:
    if _runtime.agent_loader is not None:
        _runtime.agent_loader()


def lease_ttl() -> float:
    return float(_runtime.lease_ttl())


def on_drift() -> str:
    return str(_runtime.on_drift())


def halt_min_age() -> float:
    configured = _runtime.halt_min_age
    return float(configured()) if configured is not None else 2 * lease_ttl()


def retry_policy() -> RetryPolicy:
    return _runtime.retry_policy()


def recovery_interval() -> float:
    return float(_runtime.recovery_interval())


def subagent_depth() -> int:
    return int(_runtime.subagent_depth())


def sleep(seconds: float) -> None:
    _runtime.sleep(seconds)


def monotonic() -> float:
    return float(_runtime.monotonic())


def dispatch(run_id: str) -> None:
    """Hand ``run_id`` to a driver: the configured dispatcher, else drive it right here."""
    if _runtime.dispatcher is not None:
        _runtime.dispatcher(run_id)
        return
    if _runtime.inline_driver is None:
        raise ConfigError(
            "no dispatcher is configured and no inline driver is installed: import "
            "durable_agents (or durable_agents.engine.commands) before handing runs over",
            code="config.runtime",
        )
    _runtime.inline_driver(run_id)


def has_dispatcher() -> bool:
    """Whether hand-overs go to a dispatcher (a worker) rather than an inline drive."""
    return _runtime.dispatcher is not None


def model_rate(provider: str) -> Any:
    """The ``limits.Rate`` a site allows ``provider``'s model calls, or None."""
    return _runtime.model_rates().get(provider)


def events_source() -> Callable[[str, int], Iterator[Any]] | None:
    """The host's follower of a run's journal (None: poll the store)."""
    return _runtime.events


def eligible_approvers(group: str) -> list[str]:
    return list(_runtime.eligible_approvers(group))


def approver_keys(user_id: str) -> list[str]:
    return list(_runtime.approver_keys(user_id))


def actor_resolver() -> Callable[[Any], Any] | None:
    """The host's resolver of a command's ``by=`` (None: none configured; ``identity``
    then takes a plain name for a trusted caller)."""
    return _runtime.resolve_actor


def should_stop() -> bool:
    return bool(_runtime.should_stop())


@functools.cache
def _host() -> str:
    return socket.gethostname()  # a system call per run otherwise; read once per process


def holder_name() -> str:
    """Who a lease names as its holder: host, process and thread, for people reading it."""
    return f"{_host()}:{os.getpid()}:{threading.current_thread().name}"[:200]
