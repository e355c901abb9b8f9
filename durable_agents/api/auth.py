"""Who may call the API: staff users, by Django session or by API key.

* **Session**: a signed-in, active staff user (the people who use the admin). Requests
  that change something need Django's CSRF token, as any session-authenticated form does.
* **API key**: ``Authorization: Bearer <raw key>`` (or, equally, ``X-API-Key: <raw key>``).
  Only the key's SHA-256 (hex) is stored; it is found by its first 8 characters and
  compared in constant time. A revoked or expired key, or one whose user is inactive or not
  staff, is refused; the check runs on every request, so a revocation takes effect at once.
  A key created for someone else is pending until its owner confirms it in their own
  session (``durable_agents.people_keys``): it holds no secret and is refused as an unknown key.
  The key acts as its user: the same permissions, and the user's name on every decision and
  history row, with the channel ``api-key:<prefix>``.

When a key is present (either header) it decides alone: a bad key is refused even if the
request also carries a session.

What each route needs is the admin's permission table (``durable_agents.permissions``),
checked with ``require``.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import APIKeyCookie, APIKeyHeader

from .. import permissions
from ..engine.identity import Actor
from ..models import ApiKey
from ..people import ActorNotStaff, actor_of, staff_refusal
from ..people_keys import PREFIX_LENGTH, hash_key
from ..people_keys import issue_api_key as issue_api_key  # where callers have always found them
from ..people_keys import new_key as new_key
from .errors import AUTH_FAILURE_ATTR, ApiError, AuthFailure

API_KEY_HEADER = "X-API-Key"
BEARER = "bearer"
MAX_KEY_LENGTH = 200
CHANNEL_ATTR = "_durable_agents_channel"
SESSION = "session"


def presented_key(request: HttpRequest) -> str | None:
    """The key a request presents: ``Authorization: Bearer <key>`` or ``X-API-Key``."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() == BEARER:
            return value.strip()
    return request.headers.get(API_KEY_HEADER)


def _fail(request: HttpRequest, status: int, code: str, message: str) -> None:
    setattr(request, AUTH_FAILURE_ATTR, AuthFailure(status, code, message))


def _staff(request: HttpRequest, user: Any, how: str) -> Any:
    if not user.is_active:
        _fail(request, 401, "auth.inactive", f"the user of this {how} is inactive")
        return None
    refused = staff_refusal(user)  # the command's ``--by`` asks the same rule
    if refused:
        _fail(request, 403, ActorNotStaff.code, refused)
        return None
    return user


def _printable(raw: str) -> bool:
    return 0 < len(raw) <= MAX_KEY_LENGTH and raw.isascii() and raw.isprintable()


class ApiKeyAuth(APIKeyHeader):
    """An API key (``Authorization: Bearer`` or ``X-API-Key``): the key's user, if the key
    is live and the user is active staff."""

    param_name = API_KEY_HEADER

    def _get_key(self, request: HttpRequest) -> str | None:
        return presented_key(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if key is None:
            return None
        if not _printable(key):
            _fail(request, 401, "auth.invalid_key", "the API key is not valid")
            return None
        digest = hash_key(key)
        candidates = ApiKey.objects.select_related("user").filter(prefix=key[:PREFIX_LENGTH])
        found = next(
            (c for c in candidates if hmac.compare_digest(c.key_hash, digest)),
            None,
        )
        # A pending key (an invitation its owner has not confirmed) has no secret to match;
        # refused here too, as an unknown key, whatever its row holds.
        if found is None or found.confirmed_at is None:
            _fail(request, 401, "auth.invalid_key", "the API key is not valid")
            return None
        if found.revoked_at is not None:
            _fail(
                request,
                401,
                "auth.key_revoked",
                f"the API key {found.name!r} was revoked; ask for a new one",
            )
            return None
        if found.expires_at is not None and found.expires_at <= timezone.now():
            _fail(
                request,
                401,
                "auth.key_expired",
                f"the API key {found.name!r} expired at {found.expires_at:%Y-%m-%d %H:%M} UTC; "
                "create a new one",
            )
            return None
        user = _staff(request, found.user, "API key")
        if user is not None:
            ApiKey.objects.filter(pk=found.pk).update(last_used_at=Now())
            setattr(request, CHANNEL_ATTR, f"api-key:{found.prefix}")
        return user


class StaffSessionAuth(APIKeyCookie):
    """The Django session of an active staff user (CSRF-checked for unsafe methods)."""

    param_name = settings.SESSION_COOKIE_NAME

    @staticmethod
    def _session_user(request: HttpRequest) -> Any:
        if presented_key(request) is not None:
            return None  # an API key decides alone
        user = getattr(request, "user", None)
        return user if user is not None and user.is_authenticated else None

    def _get_key(self, request: HttpRequest) -> str | None:
        # CSRF is checked only for a signed-in user: a caller with no session at all gets
        # 401 auth.required, not a CSRF failure.
        if self._session_user(request) is None:
            return None
        return super()._get_key(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        user = self._session_user(request)
        user = None if user is None else _staff(request, user, "session")
        if user is not None:
            setattr(request, CHANNEL_ATTR, SESSION)
        return user


api_auth = [ApiKeyAuth(), StaffSessionAuth()]


def current_user(request: HttpRequest) -> AbstractBaseUser:
    user = getattr(request, "auth", None)
    if user is None or isinstance(user, AnonymousUser):  # unreachable behind api_auth
        raise ApiError(401, "auth.required", "authentication required")
    return user  # type: ignore[no-any-return]


def actor(request: HttpRequest) -> Actor:
    """The caller as the engine's ``Actor``: who, and through which channel (``session`` or
    ``api-key:<prefix>``)."""
    return actor_of(current_user(request), str(getattr(request, CHANNEL_ATTR, SESSION)))


def check(request: HttpRequest, action: str) -> None:
    """Refuse (403 ``auth.forbidden``) unless the caller holds a permission ``action`` needs
    (``durable_agents.permissions.RULES``, the admin's table)."""
    user = current_user(request)
    if not permissions.allows(user, action):
        raise ApiError(
            403,
            "auth.forbidden",
            permissions.refusal(user, action),
            permission=" or ".join(permissions.RULES[action].any_of),
        )


def require(request: HttpRequest, action: str) -> Actor:
    """``check``, then the caller as the ``Actor`` the engine command is given."""
    check(request, action)
    return actor(request)
