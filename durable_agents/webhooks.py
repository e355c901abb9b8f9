"""The inbound webhook view: a chat platform (or any sender) posts each message here, at least
once, signed with a shared secret; each delivery becomes ``session.send_once(delivery_id,
text)``, so a redelivery — twice, ten times at once, after a worker crash — opens one turn.

Mount it with the agent it talks to::

    from durable_agents.webhooks import InboundWebhook

    urlpatterns += [path("webhooks/inbound/", InboundWebhook.as_view(agent="support"))]

The secret is ``DURABLE_AGENTS["WEBHOOK_SECRET"]`` (or the Django setting ``secret_setting``
names). A missing, short or weak one is the system check ``durable_agents.E008`` (``check``,
``runserver``, a worker's start), and deliveries get a 503 the sender retries meanwhile.
The view answers 202 at once (200 with the answer when the delivery was already answered);
it never holds the request while the model thinks.

The sender's scheme (docs/sessions.md): headers ``X-Delivery-Id: <id>`` and ``X-Signature:
t=<unix seconds>,v1=<hex>``, ``<hex>`` the HMAC-SHA256 of ``<t>.<delivery id>.<raw body>``;
body ``{"session": "<chat id>", "text": "<message>"}``. The signature binds the delivery id,
so a captured delivery cannot be replayed under another id, and the timestamp, so it cannot
be replayed after ``tolerance`` seconds. Where the delivery id, the session and the text come
from can be changed (``delivery_id``, ``session_key``, ``text``); the signing scheme cannot.

Every refusal is a 4xx JSON ``{code, message}`` (a sender retries a 5xx for ever) that
records nothing, and is logged on ``durable_agents.webhooks`` at WARNING with its code and
the delivery id — never the secret or the body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from typing import Any, cast

from django.conf import settings as django_settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import RawPostDataException, UnreadablePostError
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from .celery.dispatch import deferred
from .conf import DOCS_URL, get_settings, parse_webhook_secrets
from .engine import names
from .engine.commands.sessions import Session
from .engine.definition import AgentDefinition
from .engine.errors import AgentPathError, ConfigError, DurableAgentsError
from .engine.registry import get_agent

__all__ = ["DELIVERY_HEADER", "SIGNATURE_HEADER", "InboundWebhook", "sign"]

log = logging.getLogger("durable_agents.webhooks")

SIGNATURE_HEADER = "X-Signature"
DELIVERY_HEADER = "X-Delivery-Id"
MAX_SIGNATURES = 5  # v1 values in one header (several while the sender rotates secrets)
_DELIVERY_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_HEX = re.compile(r"[0-9a-f]{64}")


def signed_bytes(timestamp: int, delivery_id: str, body: bytes) -> bytes:
    """The bytes a signature covers: ``<t>.<delivery id>.<raw body>``."""
    return f"{timestamp}.{delivery_id}.".encode() + body


def sign(body: bytes, delivery_id: str, secret: str, timestamp: int | None = None) -> str:
    """The ``X-Signature`` header a sender puts on ``body`` (now, unless ``timestamp``)."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), signed_bytes(t, delivery_id, body), hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


class Refused(Exception):
    """A delivery the view refuses: the status, the code and the message it answers."""

    def __init__(self, status: int, code: str, message: str, *, logged: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        # What the log says instead of ``message`` when that may quote the body.
        self.logged = logged


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


def _loggable(value: str) -> str:
    """A header as the log may show it: an attacker chooses it, so quoted and cut short."""
    return repr(value[:80])


# A sender has no CSRF token: the signature is what authenticates a delivery.
@method_decorator(csrf_exempt, name="dispatch")
class InboundWebhook(View):
    """A signed, timestamped webhook that hands each delivery to ``send_once``.

    Configure it with ``as_view(...)`` keywords (checked there, so a mistake is a
    ``ConfigError`` at startup):

    * ``agent`` — the agent's registry name, or the ``Agent`` itself (it must be listed in
      ``DURABLE_AGENTS["AGENTS"]`` too: workers find it by name). Required.
    * ``secret_setting`` — the name of a Django setting holding this webhook's secret (or a
      list of them); default ``DURABLE_AGENTS["WEBHOOK_SECRET"]``.
    * ``channel`` — the name the sessions this view opens belong to (docs/sessions.md, "Who
      a session belongs to"); default ``"webhook"`` for the default secret and
      ``"webhook:<secret_setting>"`` for a secret of its own, so each sender's sessions are
      its own. A delivery naming a session another channel opened is refused (403).
    * ``tolerance`` — seconds a signed timestamp may differ from this server's clock (300).
    * ``max_depth`` — nesting of the JSON body allowed (20).
    * ``delivery_id(request)``, ``session_key(request, payload)``, ``text(request,
      payload)`` — where the delivery id, the session and the message come from; pass
      functions of those arguments, or override the methods in a subclass.

    It does not promise more than ``send_once`` does: a delivery refused here records
    nothing; one accepted is journaled once under its delivery id, whatever the retries.
    """

    agent: Any = None
    secret_setting: str | None = None
    channel: str | None = None
    tolerance: float = 300.0
    max_depth: int = 20
    http_method_names = ["post"]

    # -- where a delivery's parts come from (overridable) ------------------------------

    def delivery_id(self, request: HttpRequest) -> str:
        """The delivery id the signature binds and ``send_once`` dedupes by."""
        return request.headers.get(DELIVERY_HEADER, "")

    def session_key(self, request: HttpRequest, payload: dict[str, Any]) -> Any:
        """The session (conversation) a delivery belongs to."""
        return payload["session"]

    def text(self, request: HttpRequest, payload: dict[str, Any]) -> Any:
        """The message a delivery carries."""
        return payload["text"]

    # -- building ----------------------------------------------------------------------

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        """The view, its configuration checked now: a ``ConfigError`` says what to fix."""
        for key in initkwargs:
            if not hasattr(cls, key) or hasattr(View, key) or key in cls.http_method_names:
                raise ConfigError(
                    f"{cls.__name__}.as_view() got {key!r}; it takes agent, secret_setting, "
                    "channel, tolerance, max_depth, delivery_id, session_key and text",
                    code="config.webhook",
                )
        # A DURABLE_AGENTS the system check refuses (E001) is left to the check: urls are
        # imported while the checks run, and a traceback from here would hide the check
        # that says what to fix. Deliveries meanwhile get a 503 the sender retries.
        try:
            get_settings()
            settings_valid = True
        except ConfigError:
            settings_valid = False
        initkwargs["agent"] = _resolve_agent(initkwargs.get("agent", cls.agent), settings_valid)
        tolerance = initkwargs.get("tolerance", cls.tolerance)
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance <= 0:
            raise ConfigError(
                f"tolerance must be a positive number of seconds, not {tolerance!r}",
                code="config.webhook",
            )
        depth = initkwargs.get("max_depth", cls.max_depth)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(
                f"max_depth must be an int >= 1, not {depth!r}", code="config.webhook"
            )
        secret_setting = initkwargs.get("secret_setting", cls.secret_setting)
        initkwargs["channel"] = names.validate_session_channel(
            initkwargs.get("channel", cls.channel) or default_channel(secret_setting)
        )
        # A missing, short or weak secret is the system check's (durable_agents.E008), not
        # a traceback from urls.py that would stop every command, migrate included: secrets
        # often reach a deploy after its migrations. Deliveries get a 503 meanwhile.
        return super().as_view(**initkwargs)

    # -- handling ----------------------------------------------------------------------

    def http_method_not_allowed(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        response = _answer(
            request,
            Refused(405, "webhook.method", f"a delivery is a POST, not {request.method}"),
            None,
        )
        response["Allow"] = "POST"
        return response

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        delivery_id: str | None = None
        try:
            body = _read_body(request)
            delivery_id = self._delivery_id(request)
            self._verify(request, delivery_id, body)
            session_id, text = self._message(request, body)
            session = Session(self._agent(), session_id, channel=str(self.channel))
            with deferred() as late:
                sent = session.send_once(delivery_id, text)
        except Refused as refused:
            return _answer(request, refused, delivery_id)
        except DurableAgentsError as exc:
            # A bad session id, a key sent before with another message (409), the store
            # down (503): the engine names the status. Its message may quote the body, so
            # the log keeps only the code.
            status = exc.http_status if 400 <= exc.http_status < 600 else 500
            engine = Refused(status, exc.code, str(exc), logged=type(exc).__name__)
            return _answer(request, engine, delivery_id)
        log.info(
            "webhook delivery %s → %s (%s)",
            delivery_id,
            sent.run_id,
            sent.status,
            extra={"delivery_id": delivery_id, "run_id": sent.run_id},
        )
        body_out = {"run_id": sent.run_id, "status": sent.status, "answer": sent.answer}
        if late:
            # Intake and turn are committed: the delivery is accepted, and recovery hands the
            # turn over. A retry by the sender would change nothing.
            body_out["handover"] = "deferred"
            body_out["note"] = str(late[0])
        return JsonResponse(body_out, status=200 if sent.status == "answered" else 202)

    def _agent(self) -> AgentDefinition:
        """The agent, resolved now if the site's settings or ``AGENTS`` were broken when the
        view was built: still broken is the site's fault, not the sender's, so a 503 the
        sender retries (a 4xx would tell it to give the delivery up)."""
        try:
            get_settings()  # read once per settings; invalid ones are the check's E001
            if not isinstance(self.agent, str):
                agent: AgentDefinition = self.agent
                return agent
            return get_agent(self.agent)
        except ConfigError as exc:
            raise Refused(
                503,
                "webhook.agent_unavailable",
                f"the webhook's agent cannot be loaded here ({exc.code}); retry later",
            ) from None

    def _delivery_id(self, request: HttpRequest) -> str:
        try:
            delivery_id = self.delivery_id(request)
        except (KeyError, ValueError, TypeError) as exc:
            raise Refused(
                400, "webhook.bad_delivery_id", f"no delivery id: {exc}", logged="no delivery id"
            ) from None
        if not isinstance(delivery_id, str) or not _DELIVERY_ID.fullmatch(delivery_id):
            shown = _loggable(delivery_id) if isinstance(delivery_id, str) else "not a string"
            raise Refused(
                400,
                "webhook.bad_delivery_id",
                f"the delivery id ({DELIVERY_HEADER}) must be 1-200 characters of A-Za-z0-9_.:-",
                logged=f"delivery id {shown} is not 1-200 characters of A-Za-z0-9_.:-",
            )
        return delivery_id

    def _verify(self, request: HttpRequest, delivery_id: str, body: bytes) -> None:
        parsed = _parse_signature(request.headers.get(SIGNATURE_HEADER, ""))
        if parsed is None:
            raise Refused(
                401,
                "webhook.bad_signature",
                f"the {SIGNATURE_HEADER} header is missing or malformed: expected t=<unix "
                "seconds>,v1=<hex HMAC-SHA256>",
            )
        timestamp, digests = parsed
        signed = signed_bytes(timestamp, delivery_id, body)
        # Bytes against bytes, every secret against every candidate: the time taken says
        # nothing about which one matched, or how much of it.
        try:
            secrets = _secrets(self.secret_setting)
        except ConfigError as exc:  # the setting changed since the view was built
            log.error("webhook %s cannot verify deliveries: %s", request.path, exc)
            raise Refused(
                503, "webhook.unconfigured", "this webhook has no usable secret; see the log"
            ) from None
        matched = False
        for secret in secrets:
            expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest().encode()
            for digest in digests:
                matched |= hmac.compare_digest(expected, digest)
        if not matched:
            raise Refused(401, "webhook.bad_signature", "the signature does not match")
        skew = time.time() - timestamp
        if abs(skew) > self.tolerance:
            raise Refused(
                401,
                "webhook.stale",
                f"the signed timestamp is more than {self.tolerance:g} seconds from this "
                "server's clock; a delivery is signed when it is sent (check the sender's "
                "clock)",
                logged=f"the signed timestamp is {skew:+.0f} seconds off this server's clock",
            )

    def _message(self, request: HttpRequest, body: bytes) -> tuple[str, str]:
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise ValueError("the body is not a JSON object")
            if _depth(payload, self.max_depth + 1) > self.max_depth:
                raise ValueError("the body is nested too deeply")
            session_id, text = self.session_key(request, payload), self.text(request, payload)
            if not isinstance(session_id, str) or not isinstance(text, str) or not text:
                raise ValueError("session and text must be non-empty strings")
            if not (_storable(session_id) and _storable(text)):
                raise ValueError("session and text may not hold U+0000 or lone surrogates")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise Refused(
                400,
                "webhook.bad_body",
                f"expected JSON {{session, text}}: {exc}",
                logged=f"the body is not a message ({type(exc).__name__})",
            ) from None
        return session_id, text


def default_channel(secret_setting: str | None) -> str:
    """The channel of a view given no ``channel=``: one per secret, since a secret is what
    tells one sender from another."""
    return "webhook" if secret_setting is None else f"webhook:{secret_setting}"


def _read_body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        # Django refuses before reading (by Content-Length), so nothing was buffered.
        raise Refused(
            413,
            "webhook.too_large",
            "the body is larger than this site accepts (DATA_UPLOAD_MAX_MEMORY_SIZE, "
            f"{django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes)",
        ) from None
    except (RawPostDataException, UnreadablePostError) as exc:
        raise Refused(400, "webhook.bad_body", f"the body could not be read: {exc}") from None


def _answer(request: HttpRequest, refused: Refused, delivery_id: str | None) -> JsonResponse:
    log.warning(
        "webhook refused %s %s: %s (%s; delivery %s)",
        request.method,
        request.path,
        refused.code,
        refused.logged or refused.message,
        delivery_id or "unknown",
        extra={"code": refused.code, "delivery_id": delivery_id, "status": refused.status},
    )
    return JsonResponse({"code": refused.code, "message": refused.message}, status=refused.status)


def _resolve_agent(agent: Any, load: bool = True) -> AgentDefinition | str:
    """The agent a webhook talks to, by name or as an object; a worker must find it by
    name, so either way it must be one the site's ``AGENTS`` load.

    When ``AGENTS`` itself names a module that does not import (or ``load`` is false: the
    settings are invalid), the name is kept and resolved per delivery: urls are imported
    while Django's checks run, and a traceback from here would hide the check
    (durable_agents.E002) that says what to fix."""
    if agent is None:
        raise ConfigError(
            "InboundWebhook.as_view() needs agent=: the name of the agent the deliveries "
            "talk to (listed in DURABLE_AGENTS['AGENTS'])",
            code="config.webhook",
        )
    name = agent if isinstance(agent, str) else getattr(agent, "name", None)
    if not isinstance(name, str):
        raise ConfigError(
            f"agent= must be an agent's name or an Agent, not {type(agent).__name__}",
            code="config.webhook",
        )
    if not load:
        return name if isinstance(agent, str) else cast(AgentDefinition, agent)
    try:
        found = get_agent(name)
    except AgentPathError:
        return name
    except ConfigError as exc:
        if exc.code != "config.agent_missing":
            raise
        raise ConfigError(
            f"the webhook's agent {name!r} is not loaded: list the module defining it in "
            "DURABLE_AGENTS['AGENTS'] (workers find agents by name)",
            code="config.agent_missing",
        ) from None
    return found


def secret_problem(view: Any) -> str:
    """Why a built webhook view (its ``as_view()`` function) cannot verify deliveries with
    the settings as they are now; "" when it can. For the system check."""
    try:
        _secrets(view.view_initkwargs.get("secret_setting", view.view_class.secret_setting))
    except ConfigError as exc:
        return str(exc)
    return ""


def _secrets(setting: str | None) -> tuple[str, ...]:
    """The webhook's secrets; ``ConfigError`` naming the setting if none is usable."""
    if setting is None:
        settings = get_settings()
        if settings.webhook_secret_problem:
            raise ConfigError(settings.webhook_secret_problem, code="config.webhook_secret")
        secrets = settings.webhook_secrets
        where = "DURABLE_AGENTS['WEBHOOK_SECRET']"
    else:
        where = f"settings.{setting}"
        secrets, problems = parse_webhook_secrets(getattr(django_settings, setting, None), where)
        if problems:
            raise ConfigError(problems[0], code="config.webhook_secret")
    if not secrets:
        raise ConfigError(
            f"a webhook needs a secret: set {where} to a long random string shared with the "
            f"sender, read from the environment ({DOCS_URL}sessions.md#the-webhook-view)",
            code="config.webhook_secret",
        )
    return secrets
