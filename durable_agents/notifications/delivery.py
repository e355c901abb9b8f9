"""Delivering the outbox: one pass claims each channel's due rows and sends them, at least
once, never inside the run that wrote them.

``deliver()`` first reconciles (``outbox.reconcile``), then claims a channel's due rows one
at a time (``FOR UPDATE SKIP LOCKED``, moving the row's next try past a claim lease), sends
each outside any transaction, and records the outcome: sent; tried again after
``BASE_DELAY`` * 2^(tries-1) (at most ``MAX_DELAY``); or failed (given up) when the channel
says retrying cannot help or after ``MAX_ATTEMPTS`` tries. Channels are delivered side by
side, each in a thread of its own, so a receiver that hangs holds up only its own rows; a
channel whose receiver fails stops for this pass after that one try (one timeout per pass,
not one per row). A worker that dies mid-send leaves the row claimed until the lease
passes; it is sent again then (at least once). Nothing here promises order.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from ..conf import ChannelConfig, Notify, get_settings
from ..engine.redact import redact_urls
from ..models import Notification
from .channels import Channel, DeliveryFailed, Notice, build
from .outbox import reconcile

log = logging.getLogger("durable_agents.notifications")

# A claimed row is due again after this long if its sender never says how it went (the
# worker died mid-send), or after twice the channel's timeout when that is longer: a send
# still in flight is not sent again beside it.
CLAIM_LEASE = 300.0
ERROR_LIMIT = 2000  # characters of a failure kept on the row


@dataclass
class Pass:
    """What one delivery pass did."""

    reconciled: int = 0  # rows the reconciling pass offered
    sent: int = 0
    retrying: int = 0  # failed this time, tried again later
    failed: int = 0  # given up

    def add(self, other: Pass) -> None:
        self.sent += other.sent
        self.retrying += other.retrying
        self.failed += other.failed


def deliver(*, using: str | None = None) -> Pass:
    """One delivery pass: reconcile, then send every channel's due rows (at most
    ``NOTIFY["BATCH"]`` each), the channels side by side."""
    settings = get_settings()
    notify = settings.notify
    using = using or settings.database
    done = Pass()
    if not notify.channels:
        return done
    done.reconciled = reconcile(using=using)
    if len(notify.channels) == 1:
        done.add(_drain(notify.channels[0], notify, using))
        return done
    lock = threading.Lock()

    def drain(config: ChannelConfig) -> None:
        try:
            result = _drain(config, notify, using)
            with lock:
                done.add(result)
        except Exception:
            log.exception("delivering channel %s failed", config.name)
        finally:
            connections.close_all()  # this thread's own

    threads = [
        threading.Thread(target=drain, args=(c,), name=f"notify-{c.name}", daemon=True)
        for c in notify.channels
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def _drain(config: ChannelConfig, notify: Notify, using: str) -> Pass:
    done = Pass()
    try:
        channel = build(config)
    except Exception:
        log.exception("the notification channel %s cannot be built; its rows wait", config.name)
        return done
    for _ in range(notify.batch):
        claimed = _claim(config, using)
        if claimed is None:
            break
        pk, notice = claimed
        if not _send(channel, pk, notice, notify, using, done):
            break  # the receiver is failing: one try a pass, not one per waiting row
    return done


def _claim(config: ChannelConfig, using: str) -> tuple[int, Notice] | None:
    """The channel's longest-due row, claimed: its try counted and its next try moved past
    the claim lease, so no other pass sends it meanwhile."""
    lease = timedelta(seconds=max(CLAIM_LEASE, 2 * config.timeout))
    rows = Notification.objects.using(using)
    for _ in range(3):  # another pass took the row between our read and our claim
        with transaction.atomic(using=using):
            row = (
                rows.select_for_update(skip_locked=True)
                .filter(
                    status=Notification.PENDING, channel=config.name, next_attempt_at__lte=Now()
                )
                .order_by("next_attempt_at", "id")
                .only("pk", "attempts", "delivery_id", "event", "payload", "created_at")
                .first()
            )
            if row is None:
                return None
            taken = rows.filter(
                pk=row.pk, status=Notification.PENDING, attempts=row.attempts
            ).update(attempts=F("attempts") + 1, next_attempt_at=Now() + lease)
        if taken:
            payload = row.payload if isinstance(row.payload, Mapping) else {}
            return row.pk, Notice(
                delivery_id=str(row.delivery_id),
                event=row.event,
                channel=config.name,
                run_id=str(payload.get("run_id", "")),
                call_id=str(payload.get("call_id", "")),
                attempt=row.attempts + 1,
                payload=payload,
                created_at=row.created_at,
            )
    return None


def _send(
    channel: Channel, pk: int, notice: Notice, notify: Notify, using: str, done: Pass
) -> bool:
    """Send one claimed row and record how it went; False when the receiver is failing."""
    failure: Exception | None = None
    try:
        channel.send(notice)
    except Exception as exc:
        failure = exc
    # Only while it is still the try we claimed (a Retry in the admin may have reset it).
    mine = Notification.objects.using(using).filter(
        pk=pk, status=Notification.PENDING, attempts=notice.attempt
    )
    if failure is None:
        mine.update(status=Notification.SENT, sent_at=Now(), next_attempt_at=None)
        done.sent += 1
        return True
    said = _said(failure)
    retry = getattr(failure, "retry", True) is not False
    if not retry or notice.attempt >= notify.max_attempts:
        why = said if not retry else f"given up after {notice.attempt} tries; the last: {said}"
        mine.update(status=Notification.FAILED, next_attempt_at=None, last_error=why[:ERROR_LIMIT])
        done.failed += 1
        log.warning(
            "notification %s (%s of run %s) to %s failed for good: %s",
            notice.delivery_id,
            notice.event,
            notice.run_id,
            notice.channel,
            why,
        )
        return retry is False  # a refusal is this row's; a receiver down is every row's
    delay = min(notify.max_delay, notify.base_delay * 2 ** (notice.attempt - 1))
    asked_wait = getattr(failure, "retry_after", None)
    if isinstance(asked_wait, int | float):
        delay = min(notify.max_delay, max(delay, float(asked_wait)))
    mine.update(
        next_attempt_at=Now() + timedelta(seconds=delay),
        last_error=f"try {notice.attempt}: {said}"[:ERROR_LIMIT],
    )
    done.retrying += 1
    log.info(
        "notification %s to %s failed (try %d), tried again in %.0f s: %s",
        notice.delivery_id,
        notice.channel,
        notice.attempt,
        delay,
        said,
    )
    return False


def _said(exc: BaseException) -> str:
    if isinstance(exc, DeliveryFailed):
        return str(exc)
    return redact_urls(f"{type(exc).__name__}: {exc}")
