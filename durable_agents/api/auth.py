"""Who may call the API: staff users, by Django session or by API key.

* **Session**: a signed-in, active staff user (the people who use the admin). Requests
  that change something need Django's CSRF token, as any session-authenticated form does.
* **API key**: header ``X-API-Key: <raw key>``. Only the key's SHA-256 (hex) is stored; it
  is found by its first 8 characters and compared in constant time. A revoked key, or one
  whose user is inactive or not staff, is refused. The key acts as its user: the same
  permissions, and the user's name on every decision and history row.

When an ``X-API-Key`` header is present it decides alone: a bad key is refused even if the
request also carries a session.

Permissions are the admin's: viewing needs ``is_staff``; each action needs its permission
(``PERMISSIONS``), checked with ``require``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models.functions import Now
from django.http import HttpRequest
from ninja.security import APIKeyCookie, APIKeyHeader

from ..models import ApiKey
from .errors import AUTH_FAILURE_ATTR, ApiError, AuthFailure

API_KEY_HEADER = "X-API-Key"
PREFIX_LENGTH = 8
MAX_KEY_LENGTH = 200

# What each action needs, beyond being staff: (permission, what it lets you do).
PERMISSIONS = {
    "start": ("durable_agents.add_run", "start a run"),
    "resume": ("durable_agents.cancel_run", "resume a run"),
    "cancel": ("durable_agents.cancel_run", "cancel a run"),
    "decide": ("durable_agents.approve_toolcall", "decide a tool call"),
    "resolve": ("durable_agents.resolve_halt", "resolve a halt"),
    "fork": ("durable_agents.fork_run", "fork a run"),
}


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def issue_api_key(user: Any, name: str) -> tuple[ApiKey, str]:
    """Create an API key for ``user``; return the row and the raw key, which is shown once
    and never stored."""
    raw = secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        user=user, name=name, prefix=raw[:PREFIX_LENGTH], key_hash=hash_key(raw)
    )
    return key, raw


def _fail(request: HttpRequest, status: int, code: str, message: str) -> None:
    setattr(request, AUTH_FAILURE_ATTR, AuthFailure(status, code, message))


def _staff(request: HttpRequest, user: Any, how: str) -> Any:
    if not user.is_active:
        _fail(request, 401, "auth.inactive", f"the user of this {how} is inactive")
        return None
    if not user.is_staff:
        _fail(
            request,
            403,
            "auth.not_staff",
            f"{user.get_username()!r} is not a staff user; the API is for staff, as the admin is",
        )
        return None
    return user


def _printable(raw: str) -> bool:
    return 0 < len(raw) <= MAX_KEY_LENGTH and raw.isascii() and raw.isprintable()


class ApiKeyAuth(APIKeyHeader):
    """``X-API-Key`` header: the key's user, if the key is live and the user is staff."""

    param_name = API_KEY_HEADER

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
        if found is None:
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
        user = _staff(request, found.user, "API key")
        if user is not None:
            ApiKey.objects.filter(pk=found.pk).update(last_used_at=Now())
        return user


class StaffSessionAuth(APIKeyCookie):
    """The Django session of an active staff user (CSRF-checked for unsafe methods)."""

    param_name = settings.SESSION_COOKIE_NAME

    @staticmethod
    def _session_user(request: HttpRequest) -> Any:
        if request.headers.get(API_KEY_HEADER) is not None:
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
        return None if user is None else _staff(request, user, "session")


api_auth = [ApiKeyAuth(), StaffSessionAuth()]


def current_user(request: HttpRequest) -> AbstractBaseUser:
    user = getattr(request, "auth", None)
    if user is None or isinstance(user, AnonymousUser):  # unreachable behind api_auth
        raise ApiError(401, "auth.required", "authentication required")
    return user  # type: ignore[no-any-return]


def actor(request: HttpRequest) -> str:
    """The name decisions, resolutions and history rows record for this caller."""
    return current_user(request).get_username()


def require(request: HttpRequest, action: str) -> str:
    """Refuse (403 ``auth.forbidden``) unless the caller holds the permission ``action``
    needs (``PERMISSIONS``); return the caller's name."""
    user = current_user(request)
    permission, what = PERMISSIONS[action]
    if not user.has_perm(permission):  # type: ignore[attr-defined]
        raise ApiError(
            403,
            "auth.forbidden",
            f"{user.get_username()!r} may not {what}: it needs the {permission!r} "
            "permission (grant it in the admin, directly or through a group)",
            permission=permission,
        )
    return user.get_username()
