"""Hand-overs go through the site's Celery app (issue 44, item 3): from a thread of a
threaded web server too (Celery's current app is per thread, and a request thread would
otherwise send to Celery's fallback broker, amqp://guest@localhost), and the system check
``durable_agents.E007`` names the README block a site left out. Each case is a fresh
process that loads its app as a site does."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import redis

from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BROKER = "redis://127.0.0.1:6379/14"
OTHER = "redis://127.0.0.1:6379/15"  # the probe's other-broker app (celery_probe)


def probe(mode: str) -> dict:
    queue = f"da-probe-{uuid.uuid4().hex[:10]}"
    env = subprocess_env(
        DA_DISPATCH="celery",
        DA_CELERY_QUEUE=queue,
        DA_BROKER_URL=BROKER,
        DJANGO_SETTINGS_MODULE="tests.support.probe_settings",
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.celery_probe", mode],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        for url in (BROKER, OTHER):
            redis.Redis.from_url(url).delete(queue)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_hand_over_from_another_thread_reaches_the_sites_broker():
    found = probe("site")
    assert found["checks"] == [] and found["deferred"] == []
    assert found["queued"] == 1


def test_no_app_of_the_sites_is_an_error_naming_the_readme_block():
    found = probe("none")
    assert found["checks"] == ["durable_agents.E007"]


def test_an_app_on_another_broker_is_an_error():
    found = probe("other-broker")
    assert found["checks"] == ["durable_agents.E007"]
    assert found["queued"] == 0  # it went to that other broker
