"""A fresh process that loads (or not) a Celery app the way a site does, runs the checks
and hands a run over from a thread of its own, as a threaded web server would:
``python -m tests.support.celery_probe none|site|other-broker``. Prints one JSON line:
the check ids of this app and how many messages reached the test's queue."""

from __future__ import annotations

import json
import os
import sys
import threading

import django
import redis
from celery import Celery


def main(mode: str) -> None:
    # As mysite/__init__.py does, before Django is set up: the site's app, from its settings.
    if mode in ("site", "other-broker"):
        app = Celery("probe-site")
        app.config_from_object("django.conf:settings", namespace="CELERY")
        if mode == "other-broker":
            app.conf.broker_url = "redis://127.0.0.1:6379/15"
        app.autodiscover_tasks(["durable_agents"])
    django.setup()
    from durable_agents.celery.dispatch import deferred, send_to_celery
    from durable_agents.checks import check_settings

    ids = sorted({m.id for m in check_settings()})
    late: list[str] = []

    def hand_over() -> None:
        with deferred() as found:
            send_to_celery("probe-run")
        late.extend(str(d) for d in found)

    # Without the site's app the message would go to Celery's fallback broker (a RabbitMQ on
    # localhost, where one runs): the check is what this case is about.
    if mode != "none":
        thread = threading.Thread(target=hand_over)
        thread.start()
        thread.join(timeout=60)
    broker = os.environ["DA_BROKER_URL"]
    queued = redis.Redis.from_url(broker).llen(os.environ["DA_CELERY_QUEUE"])
    print(json.dumps({"checks": ids, "queued": queued, "deferred": late}))


if __name__ == "__main__":
    main(sys.argv[1])
