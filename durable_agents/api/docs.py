"""Who may read the interactive API docs and the OpenAPI schema the host's ``NinjaAPI``
serves: staff only, unless ``DURABLE_AGENTS["PUBLIC_API_DOCS"]`` is True.

    api = NinjaAPI(docs_decorator=staff_docs)

Swagger UI is served from ninja's own static files (add ``"ninja"`` to ``INSTALLED_APPS``),
so the page works offline and loads nothing from a CDN.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse

from ..conf import get_settings
from .errors import error_response


def staff_docs(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``docs_decorator`` for a ``NinjaAPI``: the docs page and the schema for signed-in
    active staff (403 ``auth.not_staff`` / 401 ``auth.required`` otherwise), or for anyone
    when ``PUBLIC_API_DOCS`` is set."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not get_settings().public_api_docs:
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                return error_response(
                    401,
                    "auth.required",
                    "the API docs are for staff: sign in to the admin first (or set "
                    "DURABLE_AGENTS['PUBLIC_API_DOCS'] = True to publish them)",
                )
            if not (user.is_active and user.is_staff):
                return error_response(
                    403, "auth.not_staff", "the API docs are for active staff users"
                )
        return view(request, *args, **kwargs)

    return wrapper
