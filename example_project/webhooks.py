"""The inbound webhook: a chat platform posts each message here, at least once.

Copy this pattern. The view checks the signature, reads the delivery id, and hands the
message to ``session.send_once(delivery_id, text)``, which records the intake under that id
(first writer wins) and enqueues the turn after commit. It answers 202 at once: it never
holds the request while the model thinks. A redelivered webhook — twice, ten times at once,
or after a worker crash — opens one turn and fires no side effect twice.

Request: ``POST /webhooks/inbound/`` with headers
``X-Delivery-Id: <id>`` and ``X-Signature: t=<unix seconds>,v1=<hex>``, where ``<hex>`` is
HMAC-SHA256, keyed by the shared secret, of ``<t>.<delivery id>.<raw body bytes>``; body
``{"session": "<chat id>", "text": "<message>"}``. The signature binds the delivery id, so a
captured delivery cannot be replayed under another id, and the timestamp, so it cannot be
replayed after ``TOLERANCE`` seconds. Anything malformed is a 4xx with a code, never a 500
(a sender retries a 5xx forever). docs/sessions.md describes the scheme for senders.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import durable_agents as da

from .agents import support

SIGNATURE_HEADER = "X-Signature"
DELIVERY_HEADER = "X-Delivery-Id"
TOLERANCE = 300  # seconds a signed timestamp may differ from this server's clock
MAX_SIGNATURES = 5  # v1 values in one header (several while the sender rotates secrets)
_DELIVERY_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_HEX = re.compile(r"[0-9a-f]{64}")
MAX_DEPTH = 20  # nesting of the JSON body; ours is flat


def signed_bytes(timestamp: int, delivery_id: str, body: bytes) -> bytes:
    return f"{timestamp}.{delivery_id}.".encode() + body


def sign(body: bytes, delivery_id: str, secret: str, timestamp: int | None = None) -> str:
    """The ``X-Signature`` header a sender puts on ``body`` (what the tests and the demo
    send)."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), signed_bytes(t, delivery_id, body), hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"code": code, "message": message}, status=status)


def _parse_signature(header: str) -> tuple[int, list[bytes]] | None:
    """``t=<int>,v1=<hex>[,v1=<hex>…]`` → (t, [digests]); None if malformed. Only printable
    ASCII gets this far, so nothing here can raise on odd characters."""
    if not header or len(header) > 1000 or not header.isascii() or not header.isprintable():
        return None
    timestamp: int | None = None
    digests: list[bytes] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            return None
        if key == "t":
            if timestamp is not None or not value.isdigit() or len(value) > 12:
                return None
            timestamp = int(value)
        elif key == "v1":
            if not _HEX.fullmatch(value):
                return None
            digests.append(value.encode("ascii"))
        # other schemes (v0, a future v2) are ignored, as payment providers do
    if timestamp is None or not digests or len(digests) > MAX_SIGNATURES:
        return None
    return timestamp, digests


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, counting no further than ``limit``."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _storable(text: str) -> bool:
    """No U+0000 and no lone surrogate: PostgreSQL text holds neither."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _verify(request: HttpRequest, delivery_id: str) -> JsonResponse | None:
    parsed = _parse_signature(request.headers.get(SIGNATURE_HEADER, ""))
    if parsed is None:
        return _error(
            401,
            "webhook.bad_signature",
            f"the {SIGNATURE_HEADER} header is missing or malformed: expected t=<unix "
            "seconds>,v1=<hex HMAC-SHA256>",
        )
    timestamp, digests = parsed
    expected = hmac.new(
        settings.WEBHOOK_SECRET.encode(),
        signed_bytes(timestamp, delivery_id, request.body),
        hashlib.sha256,
    ).hexdigest()
    # Bytes against bytes, every candidate compared: the time taken says nothing about
    # which one matched, or how much of it.
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(expected.encode("ascii"), digest)
    if not matched:
        return _error(401, "webhook.bad_signature", "the signature does not match")
    if abs(time.time() - timestamp) > TOLERANCE:
        return _error(
            401,
            "webhook.stale",
            f"the signed timestamp is more than {TOLERANCE} seconds from this server's "
            "clock; a delivery is signed when it is sent (check the sender's clock)",
        )
    return None


@csrf_exempt
@require_POST
def inbound(request: HttpRequest) -> JsonResponse:
    delivery_id = request.headers.get(DELIVERY_HEADER, "")
    if not _DELIVERY_ID.fullmatch(delivery_id):
        return _error(
            400,
            "webhook.bad_delivery_id",
            f"the {DELIVERY_HEADER} header must be 1-200 characters of A-Za-z0-9_.:-",
        )
    refused = _verify(request, delivery_id)
    if refused is not None:
        return refused
    try:
        payload = json.loads(request.body)
        if not isinstance(payload, dict):
            raise ValueError("the body is not a JSON object")
        if _depth(payload, MAX_DEPTH + 1) > MAX_DEPTH:
            raise ValueError("the body is nested too deeply")
        session_id, text = payload["session"], payload["text"]
        if not isinstance(session_id, str) or not isinstance(text, str) or not text:
            raise ValueError("session and text must be non-empty strings")
        if not (_storable(session_id) and _storable(text)):
            raise ValueError("session and text may not hold U+0000 or lone surrogates")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return _error(400, "webhook.bad_body", f"expected JSON {{session, text}}: {exc}")
    try:
        sent = support.session(session_id).send_once(delivery_id, text)
    except da.ConfigError as exc:
        status = 409 if exc.code == "session.key_conflict" else 400
        return _error(status, exc.code, str(exc))
    except da.ProtocolError as exc:
        return _error(400, exc.code, str(exc))
    body = {"run_id": sent.run_id, "status": sent.status, "answer": sent.answer}
    return JsonResponse(body, status=200 if sent.status == "answered" else 202)
