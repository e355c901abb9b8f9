"""Post one signed delivery to the site's webhook view (``durable_agents.webhooks``, as
tests/urls.py mounts it) in this process (a crash test's child).
Usage: python -m tests.support.webhook_post <session> <delivery_id> <text>"""

import json
import sys

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test import RequestFactory  # noqa: E402
from django.urls import resolve  # noqa: E402

from durable_agents.webhooks import sign  # noqa: E402


def post(session: str, delivery_id: str, text: str, secret: str | None = None):
    body = json.dumps({"session": session, "text": text}).encode()
    request = RequestFactory().post(
        "/webhooks/inbound/",
        data=body,
        content_type="application/json",
        HTTP_X_SIGNATURE=sign(body, delivery_id, secret or settings.WEBHOOK_SECRET),
        HTTP_X_DELIVERY_ID=delivery_id,
    )
    return resolve("/webhooks/inbound/").func(request)


if __name__ == "__main__":
    response = post(*sys.argv[1:4])
    print(response.status_code, response.content.decode(), flush=True)
