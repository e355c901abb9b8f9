from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

from durable_agents.api import router as agents_router

api = NinjaAPI(urls_namespace="durable-agents-test-api")
api.add_router("/agents/", agents_router)

urlpatterns = [path("admin/", admin.site.urls), path("api/", api.urls)]
