"""Notifications people act on (docs/notifications.md): each fact of an approval request —
it waits, was reminded, escalated, expired or decided — told once per channel through a
durable outbox, delivered at least once with backoff, never in the run's way.

``channels`` (the interface and ``build``), ``email`` and ``webhook`` (the two built in),
``payloads`` (what is sent), ``outbox`` (the rows: writing, reconciling, retrying),
``delivery`` (sending them). ``deliver()`` is one delivery pass, which Celery beat runs every
``NOTIFY["INTERVAL"]`` seconds (``durable_agents.tasks.deliver_notifications``).
"""

from .channels import Channel, DeliveryFailed, Notice
from .delivery import Pass, deliver
from .outbox import reconcile, retry

__all__ = ["Channel", "DeliveryFailed", "Notice", "Pass", "deliver", "reconcile", "retry"]
