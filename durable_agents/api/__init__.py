"""The django-ninja API: a ``Router`` the host mounts on its own ``NinjaAPI``.

    from ninja import NinjaAPI
    from durable_agents.api import router as agents_router

    api = NinjaAPI()
    api.add_router("/agents/", agents_router)

Staff users (Django session) and API keys (``X-API-Key``) may call it; every error is JSON
``{"code", "message"}``. See docs/api.md.
"""

from ninja import Router

from . import approvals, halts, history, runs, sessions
from .auth import api_auth
from .errors import map_errors, normalize

router = Router(auth=api_auth)
router.add_decorator(map_errors, mode="operation")
router.add_decorator(normalize, mode="view")
# Approvals and halts first: their paths extend /runs/{run_id}, and run ids may hold "/".
router.add_router("", approvals.router)
router.add_router("", halts.router)
router.add_router("", history.router)
router.add_router("", sessions.router)
router.add_router("", runs.router)

__all__ = ["router"]
