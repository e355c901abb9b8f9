"""Stand-ins the engine's unit tests share: a process that dies, a clock that only moves when
told to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Crash(BaseException):
    """Stands in for the process dying: a ``BaseException``, so nothing below the loop
    catches it and whatever the journal holds at that moment is what a restart finds."""


class Clock:
    """A virtual clock for ``InMemoryStore(clock=...)``: lease expiry and halt ages move
    only when a test moves them."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def crash_points(monkeypatch: Any) -> Callable[[str], None]:
    """Make the process die (``Crash``) at named failpoints, each once: the writes before
    the point stay, as after a SIGKILL. Returns ``add(point)``; a test's ``crash_at``."""
    from durable_agents.engine import failpoints

    points: set[str] = set()
    real = failpoints.hit

    def hit(name: str) -> None:
        if name in points:
            points.discard(name)
            raise Crash(name)
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    return points.add


def hooks_at_points(monkeypatch: Any) -> Callable[[str, Callable[[], None]], None]:
    """Run a function when the engine reaches a named failpoint (once): another process's
    step slipped in at an exact place. Returns ``at_point(name, fn)``; a test's ``at_point``."""
    from durable_agents.engine import failpoints

    hooks: dict[str, Callable[[], None]] = {}
    real = failpoints.hit

    def hit(name: str) -> None:
        hook = hooks.pop(name, None)
        if hook is not None:
            hook()
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    return hooks.__setitem__
