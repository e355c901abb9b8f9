"""Helpers for testing your own agents: an in-memory store that behaves like the real one.

``InMemoryStore`` passes the same conformance suite as the PostgreSQL and SQLite stores;
use it to test tools and agents without a database. It cannot coordinate processes.
"""

from __future__ import annotations

from .engine.memstore import InMemoryStore

__all__ = ["InMemoryStore"]
