"""Runtime wiring for one test: what the Django app configures for a site, set by a test and
put back when it ends, so no test leaks a dispatcher or a clock into the next."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from durable_agents.engine import runtime


@contextmanager
def wired(**settings: Any) -> Iterator[None]:
    """``runtime.configure(**settings)`` for the ``with`` block; every setting (not only
    these) is restored afterwards, so changes made inside the block do not leak either."""
    saved = dict(runtime._runtime.__dict__)
    runtime.configure(**settings)
    try:
        yield
    finally:
        runtime._runtime.__dict__.update(saved)
