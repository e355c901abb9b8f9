"""URLs of the example site: the admin, the durable_agents API (docs for staff only), the
inbound webhook and a health check. Static files are WhiteNoise's (settings.py)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path
from ninja import NinjaAPI

from durable_agents.api import router as durable_agents_router
from durable_agents.api.docs import staff_docs
from durable_agents.webhooks import InboundWebhook

api = NinjaAPI(
    title="durable_agents example", urls_namespace="example-api", docs_decorator=staff_docs
)
api.add_router("/agents/", durable_agents_router)


def healthz(request: HttpRequest) -> HttpResponse:
    """The container healthcheck: the web process answers (nothing else is checked)."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    # The signed inbound webhook (docs/sessions.md): each delivery is one send_once.
    path("webhooks/inbound/", InboundWebhook.as_view(agent="support"), name="inbound-webhook"),
    path("healthz", healthz, name="healthz"),
]
