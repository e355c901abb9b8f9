"""Facts the engine announces to its host: a call started waiting for approval, a decision
became final, a run halted, finished or failed.

The engine calls ``announce(store, event, **details)`` once, at the one write that makes the
fact true (a request row written, a decision record inserted, a halt row saved, ``run:complete``
inserted, a failure projected) — never at a write that merely repeats or repairs it, so a resume
or a re-projection announces nothing new. A store that can tell its host implements
``announce(event, details)`` (the Django store sends signals after the transaction commits);
one without it (``InMemoryStore``) ignores them.

At most once: a process that dies between the write and the announcement loses the
announcement, never the fact (the journal and the rows still hold it).
"""

from __future__ import annotations

import logging
from typing import Any

APPROVAL_REQUESTED = "approval_requested"
APPROVAL_DECIDED = "approval_decided"
# A pending request's deadline steps (``engine.rules.Deadline``), each once per request.
APPROVAL_REMINDED = "approval_reminded"
APPROVAL_ESCALATED = "approval_escalated"
APPROVAL_EXPIRED = "approval_expired"
RUN_HALTED = "run_halted"
RUN_FINISHED = "run_finished"
RUN_FAILED = "run_failed"
EVENTS = (
    APPROVAL_REQUESTED,
    APPROVAL_DECIDED,
    APPROVAL_REMINDED,
    APPROVAL_ESCALATED,
    APPROVAL_EXPIRED,
    RUN_HALTED,
    RUN_FINISHED,
    RUN_FAILED,
)

log = logging.getLogger("durable_agents")


def announce(store: Any, event: str, **details: Any) -> None:
    """Tell ``store``'s host that ``event`` happened. Never raises: a run does not stop
    because its host could not be told."""
    hook = getattr(store, "announce", None)
    if hook is None:
        return
    try:
        hook(event, details)
    except Exception:
        log.exception("could not announce %s for run %s", event, details.get("run_id"))
