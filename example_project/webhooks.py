"""The inbound webhook: a chat platform posts each message here, at least once.

Copy this pattern. The view checks the HMAC-SHA256 signature, reads the delivery id, and
hands the message to ``session.send_once(delivery_id, text)``, which records the intake
under that id (first writer wins) and enqueues the turn after commit. It answers 202 at
once: it never holds the request while the model thinks. A redelivered webhook — twice, ten
times at once, or after a worker crash — opens one turn and fires no side effect twice.

Request: ``POST /webhooks/inbound/`` with headers ``X-Signature: sha256=<hex hmac of the
body>`` and ``X-Delivery-Id: <id>``, body ``{"session": "<chat id>", "text": "<message>"}``.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import durable_agents as da

from .agents import support


def signature_for(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"code": code, "message": message}, status=status)


@csrf_exempt
@require_POST
def inbound(request: HttpRequest) -> JsonResponse:
    expected = signature_for(request.body, settings.WEBHOOK_SECRET)
    if not hmac.compare_digest(request.headers.get("X-Signature", ""), expected):
        return _error(401, "webhook.bad_signature", "the X-Signature header does not match")
    delivery_id = request.headers.get("X-Delivery-Id", "")
    try:
        payload = json.loads(request.body)
        session_id, text = payload["session"], payload["text"]
        if not isinstance(session_id, str) or not isinstance(text, str) or not text:
            raise ValueError("session and text must be non-empty strings")
    except (ValueError, KeyError, TypeError) as exc:
        return _error(400, "webhook.bad_body", f"expected JSON {{session, text}}: {exc}")
    try:
        sent = support.session(session_id).send_once(delivery_id, text)
    except da.ConfigError as exc:
        status = 409 if exc.code == "session.key_conflict" else 400
        return _error(status, exc.code, str(exc))
    body = {"run_id": sent.run_id, "status": sent.status, "answer": sent.answer}
    return JsonResponse(body, status=200 if sent.status == "answered" else 202)
