"""Every error this API answers is JSON ``{"code", "message"}`` with the status it deserves.

The host owns the ``NinjaAPI`` (and its exception handlers), so the router maps errors
itself, with two decorators the package root installs on the router:

* ``map_errors`` (operation mode) turns an ``ApiError`` or an engine ``DurableAgentsError``
  raised by a view into its response, with the status the error's class names
  (``http_status``): a missing thing 404, a conflict with the run's state 409, bad input
  400.
* ``normalize`` (view mode) rewrites the responses ninja's own handlers produce before a
  view runs — authentication (401/403), request validation (422 ``request.invalid``), an
  unparsable body (400 ``request.invalid``) — into the same shape, keeping ninja's list of
  validation errors under ``detail``. A body over Django's upload limit becomes 413
  ``request.too_large``. Server errors (5xx) are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import register_converter

from ..engine.errors import DurableAgentsError

AUTH_FAILURE_ATTR = "_durable_agents_auth_failure"


class ApiError(Exception):
    """An error the API itself raises (not the engine): a status, a code, a message."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class AuthFailure:
    """Why authentication failed, left on the request by the auth classes for ``normalize``."""

    status: int
    code: str
    message: str


def _json_safe(details: Mapping[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = json.loads(json.dumps(dict(details), default=str))
    return safe


def error_response(
    status: int, code: str, message: str, details: Mapping[str, Any] | None = None, **extra: Any
) -> JsonResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = _json_safe(details)
    body.update(extra)
    return JsonResponse(body, status=status)


def response_for(exc: ApiError | DurableAgentsError) -> JsonResponse:
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.details)
    # The engine names the status each error deserves (``http_status``, by class): bad
    # input 400, a refusal of who acts 403, a missing run 404, a conflict with the run's
    # state 409, a provider 502, the store 503.
    return error_response(exc.http_status, exc.code, exc.message, getattr(exc, "details", None))


def map_errors(view: Callable[..., Any]) -> Callable[..., Any]:
    """Operation-mode decorator: engine and API errors become ``{code, message}`` responses."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(request, *args, **kwargs)
        except (ApiError, DurableAgentsError) as exc:
            return response_for(exc)

    return wrapper


def _validation_message(errors: list[Any]) -> str:
    parts = []
    for error in errors[:5]:
        if not isinstance(error, dict):
            continue
        loc = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg")))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return ("invalid request: " + "; ".join(parts) + more) if parts else "invalid request"


def _ninja_error(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    try:
        body = json.loads(response.content or b"null")
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return response  # one of ours already
    detail = body.get("detail") if isinstance(body, dict) else None
    status = response.status_code
    if status == 401:
        failure = getattr(request, AUTH_FAILURE_ATTR, None)
        if isinstance(failure, AuthFailure):
            return error_response(failure.status, failure.code, failure.message)
        return error_response(
            401,
            "auth.required",
            "authentication required: sign in as a staff user (session) or send an API key "
            "in the X-API-Key header",
        )
    if status == 403 and isinstance(detail, str) and "CSRF" in detail:
        return error_response(
            403,
            "auth.csrf",
            "CSRF check failed: a session-authenticated request that changes something needs "
            "the CSRF token (X-CSRFToken header); API clients should send X-API-Key instead",
        )
    if status == 422 and isinstance(detail, list):
        return error_response(422, "request.invalid", _validation_message(detail), detail=detail)
    if status == 400:
        return error_response(400, "request.invalid", str(detail or "malformed request"))
    if status == 404:
        return error_response(404, "not_found", str(detail or "not found"))
    if status == 429:
        return error_response(429, "request.throttled", str(detail or "too many requests"))
    code = "auth.forbidden" if status == 403 else "request.error"
    return error_response(status, code, str(detail or response.reason_phrase))


def too_large() -> JsonResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_response(
        413,
        "request.too_large",
        f"the request body is larger than this site accepts ({limit} bytes, Django's "
        "DATA_UPLOAD_MAX_MEMORY_SIZE); send less",
        limit=limit,
    )


class AnyPathConverter:
    """A path segment run that may hold any character, a newline too: Django's ``path``
    converter (``.+``) does not match one, and an unmatched path would get the host's HTML
    404 instead of this router's coded JSON one."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


ANY_PATH = "da_any_path"
register_converter(AnyPathConverter, ANY_PATH)


def not_found(request: HttpRequest, rest: str) -> JsonResponse:
    """No operation has this path (or this method on it)."""
    return error_response(
        404,
        "not_found",
        f"no API operation at {request.method} {request.path}; see the operations in the "
        "OpenAPI schema (docs/api.md)",
    )


def normalize(run: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """View-mode decorator: ninja's own 4xx responses (auth, validation, parsing) get a code."""

    @wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = run(request, *args, **kwargs)
        except RequestDataTooBig:
            return too_large()
        if 400 <= response.status_code < 500 and not response.streaming:
            return _ninja_error(request, response)
        return response

    return wrapper
