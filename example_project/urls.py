"""URLs of the example site: the Django admin and the durable_agents API."""

from __future__ import annotations

import importlib
import importlib.util

from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

api = NinjaAPI(title="durable_agents example", urls_namespace="example-api")

# The durable_agents router is mounted at /api/agents/ when durable_agents.api provides one.
if importlib.util.find_spec("durable_agents.api") is not None:
    _durable_agents_api = importlib.import_module("durable_agents.api")
    if hasattr(_durable_agents_api, "router"):
        api.add_router("/agents/", _durable_agents_api.router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]
