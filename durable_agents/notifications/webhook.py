"""The built-in ``"webhook"`` channel: a signed JSON POST, the inbound webhook's scheme
turned around, so a receiver verifies it with the same code (docs/notifications.md).

Headers ``X-Delivery-Id: <the outbox row's id>`` (the same on every try: the receiver
drops repeats by it) and ``X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<delivery
id>.<raw body>">``, one ``v1`` per secret while the setting lists several (rotation); the body
is the payload as JSON (``notifications.payloads``), with ``text`` when the channel asks.

What an answer means: any 2xx is delivered. A timeout, a connection error, 408, 429 (after
its ``Retry-After``, when longer than the backoff) and 5xx are tried again. Any other answer
— a 3xx (redirects are not followed: a signed POST replayed to another address is not what
was configured) or a 4xx — is given up at once: the receiver understood the request and
refused it (a wrong URL, a secret it does not know, a body it rejects), and the same bytes
will be refused again. Fix the receiver or the setting, then Retry in the admin.

Error messages name the receiver's host, never its path or query (a Slack or Teams
incoming-webhook URL holds its credential there).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings

from ..conf import ChannelConfig, parse_webhook_secrets
from ..webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, signed_bytes
from .channels import DeliveryFailed, Notice

RETRIED = frozenset({408, 429})
USER_AGENT = "durable-agents-notify/1"
_ANSWER_SHOWN = 200  # characters of a refusal's body kept in the error


def signature(body: bytes, delivery_id: str, secrets: tuple[str, ...], timestamp: int) -> str:
    """``t=<t>,v1=<hex>[,v1=<hex>…]``: one HMAC per secret, as ``webhooks.sign`` makes one."""
    signed = signed_bytes(timestamp, delivery_id, body)
    macs = [hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets]
    return ",".join([f"t={timestamp}", *(f"v1={m}" for m in macs)])


def secrets_of(config: ChannelConfig) -> tuple[tuple[str, ...], str]:
    """The channel's signing secrets, or () and why there are none usable."""
    where = f"settings.{config.secret_setting}"
    raw = getattr(django_settings, config.secret_setting, None)
    secrets, problems = parse_webhook_secrets(raw, where)
    if problems:
        return (), problems[0]
    if not secrets:
        return (), (
            f"the notification channel {config.name!r} signs with {where}, which is not set: "
            "set it to a long random string shared with the receiver, read from the environment"
        )
    return secrets, ""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx reaches the caller as an HTTPError


_opener = urllib.request.build_opener(_NoRedirects)


class WebhookChannel:
    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self.host = urlsplit(config.url).netloc.rpartition("@")[2]

    def send(self, notice: Notice) -> None:
        secrets, problem = secrets_of(self.config)
        if problem:
            raise DeliveryFailed(problem)  # the secret may be on its way (a deploy)
        body = json.dumps(notice.payload, ensure_ascii=False, separators=(",", ":")).encode()
        request = urllib.request.Request(
            self.config.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                DELIVERY_HEADER: notice.delivery_id,
                SIGNATURE_HEADER: signature(body, notice.delivery_id, secrets, int(time.time())),
            },
        )
        try:
            with _opener.open(request, timeout=self.config.timeout) as answer:
                answer.read(65536)  # let the connection close cleanly; the body is not used
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, resets…
            reason = getattr(exc, "reason", None) or exc
            raise DeliveryFailed(
                f"{self.host} did not answer: {type(reason).__name__}: {reason}"
            ) from None

    def _refused(self, exc: urllib.error.HTTPError) -> DeliveryFailed:
        try:
            shown = exc.read(_ANSWER_SHOWN).decode("utf-8", "replace").strip()
        except OSError:
            shown = ""
        finally:
            exc.close()
        said = f"{self.host} answered {exc.code}" + (f": {shown}" if shown else "")
        if exc.code >= 500 or exc.code in RETRIED:
            return DeliveryFailed(said, retry_after=_retry_after(exc.headers))
        if 300 <= exc.code < 400:
            said += " (a redirect: redirects are not followed; configure the final URL)"
        return DeliveryFailed(
            said + " (given up: the same request would be refused again)", retry=False
        )


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if value and value.strip().isdigit():
        return float(value.strip())
    return None  # an HTTP date, or nothing: the backoff decides
