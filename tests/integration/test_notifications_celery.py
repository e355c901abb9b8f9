"""Issue 42 under Celery: a notification leaves from a real worker within seconds of its
fact, with no beat running — the transaction that writes its row asks a worker for a
delivery pass once it commits — and a real receiver on 127.0.0.1 gets it once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from durable_agents.models import Notification
from tests.integration.test_celery_workers import Harness, celery, target  # noqa: F401
from tests.support.agents import gated
from tests.support.receiver import Receiver, verified

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def test_a_worker_sends_the_notification_within_seconds_without_beat(
    celery: Harness,  # noqa: F811 - the fixture imported above
    settings,
    receiver,
):
    # As tests/settings.py configures the worker from DA_NOTIFY_URL.
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "NOTIFY": {
            "BASE_URL": "https://ops.example.com",
            "CHANNELS": [
                {"kind": "webhook", "url": receiver.url, "secret_setting": "NOTIFY_HOOK_SECRET"}
            ],
        },
    }
    celery.worker(DA_NOTIFY_URL=receiver.url).wait_ready()
    gated.start("refund order 7", run_id="celery-notify")
    deadline = time.monotonic() + 30
    while not receiver.got or Notification.objects.filter(status="pending").exists():
        assert time.monotonic() < deadline, "no notification within 30 s"
        time.sleep(0.05)
    [got] = receiver.got
    payload = verified(got)
    assert (payload["event"], payload["run_id"]) == ("approval_requested", "celery-notify")
    assert Notification.objects.get().status == "sent"
