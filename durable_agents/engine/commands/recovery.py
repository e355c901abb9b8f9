"""Recovery: hand unfinished runs that nobody drives back to a driver, a bounded number of
times.

A pass lists, through the store's index of unfinished agent runs, the ones whose lease is
free and that are

* ``queued`` — a hand-over that never arrived (a lost message): handed over again (see
  below on how often); a driver that finds the run busy or done just stops;
* ``running`` — its driver died mid-drive (a crash, a kill): that counts as a failed attempt;
* ``compensating`` — a saga's rollback whose driver died, or that nobody drove yet (a
  sub-run stopped by its parent's abort): the same, its cause kept as its last error;
* ``failed`` with a retryable error.

Recovery never floods the broker: a run handed to a driver less than one recovery interval
ago (by recovery, whose hand-overs the row records in ``dispatched_at``, or by whoever made it
``queued``) is not sent again; its message may still be waiting in a busy queue. A run that
stays queued after that is sent again once it has waited as long again as it had waited when
last sent (after 1, 2, 4, 8… intervals, at most ``MAX_RESEND_WAIT`` apart): with no worker
consuming, its messages grow with the logarithm of its wait, not with the number of passes.
Of two passes at once, one sends (``Store.mark_dispatched``).

A run whose drive failed or whose driver died is handed over again at once the first time,
then after a growing delay (judged by the store's clock from the row's last change), and at
most ``max_attempts`` times in a row: after that it is left ``failed``
(``run.recovery_exhausted``) for a person, and ``pending()`` says why. Recorded progress (a
model turn, a pause, the end) resets the count. Runs paused on a person, and rows that are
not agent runs, are never touched. The cost of a pass depends on the unfinished runs only.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from .. import lifecycle, runtime
from ..loop import announce_failure
from ..ports import COMPENSATING, FAILED, QUEUED, RUNNING, RunInfo, Store
from ..retry import DRIVER_LOST, EXHAUSTED, RetryPolicy, due_at

log = logging.getLogger("durable_agents.recovery")

RECOVERABLE = (QUEUED, RUNNING, COMPENSATING, FAILED)
# The longest a run that stays queued waits between two hand-overs by recovery (seconds).
MAX_RESEND_WAIT = 3600.0


def last_handed_over(run: RunInfo) -> datetime | None:
    """When ``run`` was last handed to a driver, as far as its row tells: recovery's stamp,
    or for a queued run the moment it became queued (whoever queued it handed it over)."""
    times = [run.dispatched_at, run.updated_at if run.status == QUEUED else None]
    return max((t for t in times if t is not None), default=None)


def resend_at(run: RunInfo, interval: float) -> datetime | None:
    """The earliest time recovery may hand ``run`` over again (None: no hand-over known)."""
    last = last_handed_over(run)
    if last is None:
        return None
    wait = interval
    sent, queued = run.dispatched_at, run.updated_at
    if run.status == QUEUED and sent is not None and queued is not None and sent > queued:
        # Still queued after recovery sent it: wait as long again as it had waited then.
        wait = max(interval, min((sent - queued).total_seconds(), MAX_RESEND_WAIT))
    return last + timedelta(seconds=wait)


def recover(
    *,
    store: Store | None = None,
    policy: RetryPolicy | None = None,
    batch: int = 500,
    interval: float | None = None,
) -> list[str]:
    """One recovery pass; returns the run ids it handed to a driver. ``interval``: the
    recovery interval (by default the configured one); 0 sends every run nobody drives again."""
    store = store or runtime.store()
    policy = policy or runtime.retry_policy()
    interval = runtime.recovery_interval() if interval is None else interval
    now = store.now()
    sent: list[str] = []
    after: str | None = None
    while True:
        runs = store.list_unfinished(
            limit=batch, after=after, statuses=RECOVERABLE, lease_free=True
        )
        for run in runs:
            again = resend_at(run, interval) if interval > 0 else None
            if again is not None and now < again:
                continue  # handed over less than an interval ago: maybe still in the queue
            if (
                _hand_over(store, run, policy, now)
                and store.mark_dispatched(run.run_id, seen=run.dispatched_at)
                and _still_ours(store, run.run_id)
            ):
                runtime.dispatch(run.run_id)
                sent.append(run.run_id)
        if len(runs) < batch:
            break
        after = runs[-1].run_id
    if sent:
        log.info("recovery re-enqueued %d run(s)", len(sent))
    return sent


def _still_ours(store: Store, run_id: str) -> bool:
    """Whether ``run_id`` is still a run recovery hands over, read after its hand-over was
    marked: a driver may have taken the run between the pass's list and its move, and paused
    it since (halted on an unknown outcome, say). A paused run is a person's: handing it to a
    driver would only drive it into its pause again (found by the simulator)."""
    run = store.get_run(run_id)
    return run is not None and run.status in RECOVERABLE


def _hand_over(store: Store, run: RunInfo, policy: RetryPolicy, now: datetime) -> bool:
    if run.status == QUEUED:
        return True
    due = due_at(run, policy)
    if due is not None and now < due:
        return False  # backing off
    if run.status == FAILED:
        error = run.last_error or {}
        return bool(error.get("retryable")) and run.attempts < policy.max_attempts
    # Running (or rolling back) with a free lease: its driver died. Each death counts as a
    # failed attempt; the changes apply only while the run is still in that state (another
    # driver may have just taken it).
    if run.attempts >= policy.max_attempts:
        error = {
            "code": EXHAUSTED,
            "message": f"its driver died {run.attempts} times in a row without the "
            "run making progress (a tool or the model may be killing the worker)",
            "retryable": False,
        }
        if lifecycle.move(
            store,
            run.run_id,
            FAILED,
            lifecycle.RECOVERY,
            changes={"last_error": error},
            only_from=run.status,
        ):
            announce_failure(store, run.run_id, run.agent, error, run.attempts)
        log.warning("recovery gave up on run %s after %d attempts", run.run_id, run.attempts)
        return False
    changes: dict[str, object] = {"attempts": run.attempts + 1}
    if run.status == RUNNING:
        # (A rollback keeps its saga's cause as its last error: what it is undoing for.)
        changes["last_error"] = {
            "code": DRIVER_LOST,
            "message": "its driver stopped mid-drive (a crash, a kill or a lost lease)",
            "retryable": True,
        }
    return lifecycle.move(
        store, run.run_id, run.status, lifecycle.RECOVERY, changes=changes, only_from=run.status
    )
