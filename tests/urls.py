from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

from durable_agents.api import router as agents_router
from durable_agents.api.docs import staff_docs
from durable_agents.webhooks import InboundWebhook

api = NinjaAPI(urls_namespace="durable-agents-test-api", docs_decorator=staff_docs)
api.add_router("/agents/", agents_router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    # The shipped webhook as the example site mounts it, through the whole middleware stack.
    path("webhooks/inbound/", InboundWebhook.as_view(agent="support"), name="inbound-webhook"),
]
