"""Django signals for what happens to runs, sent after the transaction that wrote the fact
commits (``transaction.on_commit``), never when it rolls back.

Every signal is sent with ``sender=Run`` (the model class) and these keyword arguments:

``approval_requested``
    ``run_id``, ``agent``, ``call_id``, ``tool``, ``arguments`` (what the call would run
    with), ``policy`` (``{"kind": "single"}`` or ``{"kind": "quorum", "need", "group"}``),
    ``previous_arguments`` (set when the call is asked again for other arguments than an
    earlier approval's, else None).
``approval_decided``
    ``run_id``, ``agent``, ``call_id``, ``tool``, ``decision`` (``"approve"``, ``"edit"`` — an
    approval with edited arguments — or ``"deny"``), ``approved``, ``by`` (the username whose
    decision made it final), ``note`` (a denial's message to the model), ``arguments`` (what
    runs: the edited ones for an edit), ``original_arguments`` (for an edit, the ones asked
    about; else None), ``tally`` (who approved and denied, for a quorum).
``approval_reminded``, ``approval_escalated``, ``approval_expired``
    a pending request's deadline steps (``da.Deadline``), each once per request: ``run_id``,
    ``agent``, ``call_id``, ``tool``, ``arguments``, ``policy`` (as it stands after the step:
    an escalation adds ``escalated_to``), ``step`` (``"remind"``, ``"escalate"``,
    ``"expire"``), ``rule`` (the rule that asked), and for an expiry ``on_expiry``. Sent by
    the sweep whose write made the step true (docs/approvals.md, "Deadlines"); an expiry
    that loses the race to a person's decision sends nothing (``approval_decided`` is sent).
``run_halted``
    ``run_id``, ``agent``, ``call_id`` (the tool call id, or ``step:<name>``), ``tool``,
    ``cause`` (``"crashed"``, ``"contended"``, ``"outcome_unknown"``: the tool raised
    ``ToolOutcomeUnknown``, or ``"expired"``: its approval request expired and its deadline
    halts the run). One per halted call.
``run_finished``
    ``run_id``, ``agent``, ``answer``, ``turns``, ``usage``.
``run_failed``
    ``run_id``, ``agent``, ``error`` (``{"code", "message", "retryable"}``), ``attempts``
    (failures in a row), ``will_retry`` (recovery hands the run over again).

Each is sent once per fact: at the write that makes it true, never when a resume or a drive
repairs the rows again. At most once: a process that dies between the commit and the signal
loses the signal, not the fact. Receivers run in the process that wrote the fact (a Celery
worker, a web request); one that raises is logged and does not disturb the run or the other
receivers. Keep them quick, or hand slow work to a task of your own.

Only the Django store sends them; ``InMemoryStore`` does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from .engine import events

log = logging.getLogger("durable_agents")

approval_requested = Signal()
approval_decided = Signal()
approval_reminded = Signal()
approval_escalated = Signal()
approval_expired = Signal()
run_halted = Signal()
run_finished = Signal()
run_failed = Signal()

SIGNALS: dict[str, Signal] = {
    events.APPROVAL_REQUESTED: approval_requested,
    events.APPROVAL_DECIDED: approval_decided,
    events.APPROVAL_REMINDED: approval_reminded,
    events.APPROVAL_ESCALATED: approval_escalated,
    events.APPROVAL_EXPIRED: approval_expired,
    events.RUN_HALTED: run_halted,
    events.RUN_FINISHED: run_finished,
    events.RUN_FAILED: run_failed,
}

__all__ = [
    "approval_decided",
    "approval_escalated",
    "approval_expired",
    "approval_reminded",
    "approval_requested",
    "run_failed",
    "run_finished",
    "run_halted",
    "send_after_commit",
]


def send_after_commit(event: str, details: Mapping[str, Any], *, using: str) -> None:
    """Send ``event``'s signal once the current transaction on ``using`` commits (at once
    outside one); dropped if it rolls back."""
    signal = SIGNALS[event]
    kwargs = dict(details)
    transaction.on_commit(lambda: _send(event, signal, kwargs), using=using)


def _send(event: str, signal: Signal, kwargs: dict[str, Any]) -> None:
    from .models import Run

    for receiver, outcome in signal.send_robust(sender=Run, **kwargs):
        if isinstance(outcome, Exception):
            log.error(
                "receiver %r of %s for run %s raised; the run goes on",
                receiver,
                event,
                kwargs.get("run_id"),
                exc_info=outcome,
            )
