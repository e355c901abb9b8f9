"""URLs of the example site: the admin, the durable_agents API and the inbound webhook."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

from durable_agents.api import router as durable_agents_router
from durable_agents.api.docs import staff_docs

from . import webhooks

api = NinjaAPI(
    title="durable_agents example", urls_namespace="example-api", docs_decorator=staff_docs
)
api.add_router("/agents/", durable_agents_router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("webhooks/inbound/", webhooks.inbound, name="inbound-webhook"),
]
