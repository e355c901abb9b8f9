"""The audit chain as the acceptance tests check it after crashes and races."""

from __future__ import annotations

from durable_agents.database.store import DjangoStore
from durable_agents.engine.audit import verify_run
from durable_agents.models import JournalEntry


def check_chain(run_id: str) -> None:
    """Killed drivers, the ones that took over and racing ones (each hashing its own records
    after the last one it knew, migration 0012) leave one unbroken chain: every record
    hashed, each naming the record before it as its ``prev_seq``."""
    report = verify_run(DjangoStore(), run_id)
    assert report.ok and not report.unchained, report.message()
    links = list(
        JournalEntry.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "prev_seq")
    )
    assert [p for _, p in links] == [None] + [s for s, _ in links[:-1]], links
