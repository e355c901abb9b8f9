"""The django-ninja API: a ``Router`` the host mounts on its own ``NinjaAPI``.

    from ninja import NinjaAPI
    from durable_agents.api import router as agents_router

    api = NinjaAPI()
    api.add_router("/agents/", agents_router)

Staff users (Django session) and API keys (``Authorization: Bearer`` or ``X-API-Key``) may
call it, each route behind the admin's permission table; every error is JSON ``{"code",
"message"}``, a path no operation has included. See docs/api.md.
"""

from ninja import Router

from . import approvals, delegations, events, halts, history, limits, runs, sessions, waits
from .auth import api_auth
from .docs import staff_docs
from .errors import ANY_PATH, map_errors, normalize, not_found

router = Router(auth=api_auth)
router.add_decorator(map_errors, mode="operation")
router.add_decorator(normalize, mode="view")
# Approvals, halts and waits first: their paths extend /runs/{run_id}, and run ids may hold "/".
router.add_router("", approvals.router)
router.add_router("", halts.router)
router.add_router("", waits.router)
router.add_router("", history.router)
router.add_router("", events.router)
router.add_router("", sessions.router)
router.add_router("", limits.router)
router.add_router("", delegations.router)
router.add_router("", runs.router)

# Last: any other path under the router is a coded JSON 404, not the host's HTML page.
# Django's own "path" converter stops at a newline, so it has one that matches anything.
_unrouted = Router(tags=["errors"])
_unrouted.api_operation(
    ["GET", "POST", "PUT", "PATCH", "DELETE"], f"/{{{ANY_PATH}:rest}}", include_in_schema=False
)(not_found)
router.add_router("", _unrouted)

__all__ = ["router", "staff_docs"]
