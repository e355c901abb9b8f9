"""A Redis transport for Celery workers that survives a Redis restart.

Select it with Celery's ``broker_transport`` setting; the broker URL stays ``redis://…``::

    CELERY_BROKER_TRANSPORT = "durable_agents.celery.transport:Transport"

Why: under load, celery 5.7.0 can kill a worker when Redis restarts, with ``CRITICAL
Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")``. On a
lost connection the worker calls ``connection.collect()``, which detaches the transport
(``transport.client = None``), and then, new in 5.7.0, ``connection.close()``. When
``collect()`` could not finish closing the default channel, that channel lives on half closed
and without its connection pools: closing it again restores its unacknowledged messages, and a
task that finishes later acks on it; both build a new pool from ``self.connection.client``,
which is ``None``. Celery treats any error but a connection error as unrecoverable, and the
worker exits. Here such an orphaned channel raises ``redis.exceptions.ConnectionError``
instead, which every caller already handles as a lost connection (``ignore_errors`` around
the close, ``ack_log_error`` logs "Couldn't ack" and goes on) and the worker reconnects.

The messages that channel held are not restored to Redis. durable_agents does not need them:
the runs are in the database, and recovery hands them over again. See docs/celery.md and
docs/notes/redis-restart.md (section 2) for the reproduction, the upstream reports and the
numbers.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from redis import exceptions as redis_errors

log = logging.getLogger("durable_agents.celery")


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, failing like a lost connection once its connection is gone."""

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or getattr(transport, "client", None) is None:
            log.warning(
                "a channel of a closed broker connection asked for a new connection; "
                "treating it as a lost connection"
            )
            raise redis_errors.ConnectionError("this channel's broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above (``broker_transport``)."""

    Channel = Channel
