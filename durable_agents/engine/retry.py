"""How a run whose drive failed is retried, and how that reads to a person.

The policy (``RetryPolicy``) comes from the glue through ``runtime``; recovery
(``commands.recovery``) applies it, and ``pending()`` explains it (``describe``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .ports import FAILED, RUNNING, RunInfo

DRIVER_LOST = "run.driver_lost"
EXHAUSTED = "run.recovery_exhausted"


@dataclass(frozen=True)
class RetryPolicy:
    """How a run whose drive failed is retried: at most ``max_attempts`` failures in a row,
    with exponential backoff from ``base_delay`` capped at ``max_delay`` (seconds)."""

    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff for the ``attempt``-th failure in a row (1-based)."""
        return float(min(self.max_delay, self.base_delay * (2 ** max(0, attempt - 1))))

    def wait_after(self, attempts: int) -> float:
        """How long after its last change a run that failed ``attempts`` times in a row
        waits before the next hand-over: none after the first failure."""
        return 0.0 if attempts <= 1 else self.delay(attempts - 1)


def due_at(run: RunInfo, policy: RetryPolicy) -> datetime | None:
    """When recovery may hand ``run`` over again (None: at once, or unknown)."""
    if run.updated_at is None:
        return None
    return run.updated_at + timedelta(seconds=policy.wait_after(run.attempts))


def describe(run: RunInfo, policy: RetryPolicy) -> str:
    """Why an unfinished run is not finished, and what happens next (for ``pending()``)."""
    error = run.last_error or {}
    message = str(error.get("message") or "")
    resume = f"durable_agents.resume({run.run_id!r})"
    if run.status == FAILED:
        if error.get("code") == EXHAUSTED or (
            error.get("retryable") and run.attempts >= policy.max_attempts
        ):
            return (
                f"recovery gave up after {run.attempts} attempts: {message}; fix the cause, "
                f"then {resume}"
            )
        if error.get("retryable"):
            due = due_at(run, policy)
            when = f" from {due.isoformat(timespec='seconds')}" if due is not None else ""
            return (
                f"the last attempt failed: {message}; recovery retries it{when} "
                f"(attempt {run.attempts + 1} of at most {policy.max_attempts})"
            )
        return f"the last attempt failed: {message}; fix the cause, then {resume}"
    if run.status == RUNNING and run.lease_expired:
        return (
            "its driver died; recovery hands it to another "
            f"(attempt {run.attempts + 1} of at most {policy.max_attempts})"
        )
    return ""
