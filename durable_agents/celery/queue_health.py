"""Queue health: runs that have waited in the queue for several recovery intervals with no
driver. Recovery re-sends a queued run after an interval or two, so a run still queued well
after that means nobody consumes the queue (no worker, a worker on another queue, workers
stuck) or the workers are far behind. Staff see it on the admin index, in ``manage.py
durable_agents runs`` and as the system check ``durable_agents.W003``; all three read
``stalled_runs()``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Exists, OuterRef, Window
from django.db.models.functions import Now

from ..conf import Settings, get_settings
from ..engine.ports import KIND_AGENT, QUEUED
from ..models import Lease, Run

# How many recovery intervals a queued run may wait before it counts as stalled: recovery
# sends a lost message again after one or two intervals, and a worker takes it at once.
STALLED_AFTER_INTERVALS = 4


@dataclass(frozen=True)
class QueueHealth:
    """What ``stalled_runs()`` found: how many runs wait, the oldest few, and why."""

    stalled: int
    oldest: tuple[tuple[str, datetime], ...]  # (run id, queued since), oldest first
    after: float  # seconds a run waited before it counts
    dispatch: str
    queue: str

    def __bool__(self) -> bool:
        return self.stalled > 0

    @property
    def cause(self) -> str:
        if self.dispatch == "inline":
            return (
                "DISPATCH is 'inline', so a queued run is driven only by a recovery pass "
                "(`python manage.py durable_agents recover` from cron, or Celery beat)"
            )
        return (
            f"likely no Celery worker is consuming the queue {self.queue!r} (start one with "
            f"`{worker_command(self.queue)}`), or the workers are stuck or far behind"
        )

    def message(self) -> str:
        """One line for staff: what is wrong and the likely cause."""
        since = self.oldest[0][1].isoformat(timespec="seconds") if self.oldest else "?"
        ids = ", ".join(run_id for run_id, _ in self.oldest)
        rest = self.stalled - len(self.oldest)
        more = f" and {rest} more" if rest > 0 else ""
        return (
            f"{self.stalled} run(s) have been queued for more than {self.after:g}s with no "
            f"driver (the oldest since {since}: {ids}{more}); {self.cause}"
        )


def stalled_runs(*, limit: int = 5, settings: Settings | None = None) -> QueueHealth:
    """Agent runs queued for more than ``STALLED_AFTER_INTERVALS`` recovery intervals (by
    the database clock) with no live lease: the oldest ``limit`` and the total, in one
    query (the partial and status indexes keep it independent of finished runs)."""
    settings = settings or get_settings()
    after = STALLED_AFTER_INTERVALS * settings.recovery_interval
    live = Lease.objects.using(settings.database).filter(
        run_id=OuterRef("run_id"), expires_at__gt=Now()
    )
    rows = (
        Run.objects.using(settings.database)
        .filter(
            status=QUEUED,
            kind=KIND_AGENT,
            finished_at__isnull=True,
            updated_at__lt=Now() - timedelta(seconds=after),
        )
        .exclude(Exists(live))
        .annotate(total=Window(Count("run_id")))
        .order_by("updated_at", "run_id")
        .values_list("run_id", "updated_at", "total")[: max(1, limit)]
    )
    found = list(rows)
    return QueueHealth(
        stalled=found[0][2] if found else 0,
        oldest=tuple((run_id, since) for run_id, since, _ in found[:limit]),
        after=after,
        dispatch=settings.dispatch,
        queue=settings.celery_queue,
    )


def worker_command(queue: str) -> str:
    """The command that starts a worker on ``queue``, for a hint: the Celery app is taken to
    be the settings module's package (``mysite.settings`` → ``-A mysite``), as in the README
    and docs/celery.md."""
    project = os.environ.get("DJANGO_SETTINGS_MODULE", "").rpartition(".")[0] or "mysite"
    return (
        f"celery -A {shlex.quote(project)} worker -Q {shlex.quote(queue)} --pool threads -c 8 "
        "-l info"
    )
