"""Reading a run's journal on the site's database, as tests assert on it."""

from __future__ import annotations

from typing import Any

from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal


def journal(run_id: str) -> dict[str, Any]:
    """The run's records on the default database: body by record name."""
    return {r.name: r.body for r in Journal(DjangoStore()).records(run_id)}
