"""The channel interface: a channel delivers one notification, or raises.

A channel is any object with ``send(notice) -> None``, built from its entry of
``NOTIFY["CHANNELS"]`` (a ``conf.ChannelConfig``). ``send`` returns once the notification is
delivered and raises ``DeliveryFailed`` (or any exception) when it is not: the outbox tries
it again later with backoff, unless the failure says ``retry=False`` (the receiver refused
it for good), and gives it up after ``NOTIFY["MAX_ATTEMPTS"]`` tries. It may be called more
than once for one notification (a worker that died mid-send, a retry after a timeout the
receiver had in fact answered): ``notice.delivery_id`` is the same on every try, for the
receiver to drop repeats.

Two are built in, ``"email"`` (``notifications.email``) and ``"webhook"``
(``notifications.webhook``); a site names its own by dotted path: ``{"kind":
"myapp.notify.PagerChannel", "routing_key": ...}`` builds ``PagerChannel(config)``, with the
entry's other keys in ``config.options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from django.utils.module_loading import import_string

from ..conf import ChannelConfig

__all__ = ["Channel", "DeliveryFailed", "Notice", "build"]


@dataclass(frozen=True)
class Notice:
    """One notification as a channel sees it (a row of the outbox, read)."""

    delivery_id: str  # the row's stable id: the same on every try
    event: str  # engine.events: approval_requested, approval_reminded, …
    channel: str  # the channel's name
    run_id: str
    call_id: str
    attempt: int  # 1 on the first try
    payload: Mapping[str, Any]  # what is sent (``notifications.payloads``)
    created_at: datetime | None = None


@runtime_checkable
class Channel(Protocol):
    def send(self, notice: Notice) -> None:
        """Deliver ``notice``; raise if it was not delivered."""


class DeliveryFailed(Exception):
    """A notification was not delivered. ``retry=False``: trying again cannot help (the
    receiver refused it, nobody can be told), so it is given up at once. ``retry_after``:
    seconds the receiver asked to wait (HTTP 429's ``Retry-After``)."""

    def __init__(self, message: str, *, retry: bool = True, retry_after: float | None = None):
        super().__init__(message)
        self.retry = retry
        self.retry_after = retry_after


def build(config: ChannelConfig) -> Channel:
    """The channel an entry of ``NOTIFY["CHANNELS"]`` describes."""
    if config.kind == "email":
        from .email import EmailChannel

        return EmailChannel(config)
    if config.kind == "webhook":
        from .webhook import WebhookChannel

        return WebhookChannel(config)
    factory = import_string(config.kind)
    channel = factory(config)
    if not callable(getattr(channel, "send", None)):
        raise TypeError(f"{config.kind}(config) returned {channel!r}, which has no send()")
    return channel  # type: ignore[no-any-return]
