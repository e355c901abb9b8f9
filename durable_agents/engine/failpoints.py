"""Named crash points for crash tests: the process kills itself (SIGKILL) at a boundary.

Set ``DURABLE_AGENTS_CRASH_AT`` to a comma-separated list of point names (for example
``after-model:1,after-attempt:call_1``). Unset — always, outside tests — ``hit`` is one
dictionary lookup. Points: ``after-start``, ``after-model:<n>``, ``after-attempt:<call>``,
``after-result:<call>``, ``after-session-journal``, ``after-fork-row`` (a fork's row exists,
nothing is copied yet), ``before-decision:<call>`` (a person's decision passed its checks;
nothing of it is written yet), ``after-vote:<call>`` (a person's vote is saved; nothing is
counted or journaled yet), ``after-decision:<call>`` (a decision is journaled; its request
and run are not updated yet), ``after-resolution:<call>`` (a halt's outcome is journaled; its
run and halt row are not updated yet), ``after-wait:<name>`` (a tool's wait is journaled; the
run is not paused yet), ``after-answer:<name>`` / ``after-signal:<name>`` (an answer or a
signal is journaled; the run is not handed over yet), ``after-child:<child run>`` (a parent
journaled the sub-run a call starts; the sub-run is not driven yet), ``before-complete:<run>``
(a run's paused parent is queued; its ``run:complete`` is not journaled yet),
``after-complete:<run>`` (a run's ``run:complete`` is journaled; its paused parent is queued
but not handed over yet, nor looked for again), ``after-failed:<run>`` (a drive's failure is on
the run's row; a sub-run that failed for good has not handed its paused parent over yet),
``before-pause:<run>`` (a drive is about to pause the run: its row still says running),
``after-saga-abort`` (a saga's abort is journaled, nothing undone yet), ``after-cancel:<run>``
(a run's ``run:cancelled`` is journaled — by a person's cancel, or by the run's own drive
obeying a cancel above it — or a person's ``saga:abort``; nothing below it is stopped yet),
``after-compensate:<call>`` (an undo's outcome is journaled), ``after-subrun-abort:<child
run>`` (a rolling-back parent journaled its sub-run's abort; the sub-run is not rolled back
yet), ``after-compensated:<run>`` (a saga's ``run:compensated`` is journaled; its paused parent
is not handed over yet), ``before-notify:<call>`` (a decision or a deadline step of the call
is committed and its signal is being received; its notification rows are not written yet:
``durable_agents.notifications.outbox``), ``after-deadline:<call>:<step>`` (a pending request's
deadline step — ``remind``, ``escalate``, ``expire`` — is journaled; nothing of it is projected
yet), ``after-expiry-decision:<call>`` (an expiry's denial is journaled; its request is still
pending), ``after-expiry:<call>`` (the request is expired; its run is not handed over or
cancelled yet), and ``prune`` (``durable_agents.database.retention``):
``prune-after-export``
(a batch's export file is written and fsynced; nothing is deleted yet),
``prune-after-tombstones`` (the batch's tombstones are inserted, uncommitted; its rows are
not deleted yet), ``prune-before-commit`` (the batch is deleted and logged, uncommitted),
``prune-after-batch`` (a batch is committed; the next is not begun).
"""

from __future__ import annotations

import os
import signal
import sys

_POINTS = frozenset(p for p in os.environ.get("DURABLE_AGENTS_CRASH_AT", "").split(",") if p)


def hit(name: str) -> None:
    if _POINTS and name in _POINTS:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
