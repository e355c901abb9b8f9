"""Property-based requests against the served OpenAPI schema (schemathesis): whatever the
input, the API answers without a server error.

Each operation gets a bounded number of generated requests, sent through Django's WSGI
application with a staff API key that holds every permission, on PostgreSQL with a few
real runs (awaiting approval, halted, finished) in place.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from durable_agents.api.auth import issue_api_key
from tests.support.agents import echo, gated, halting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# The schema is for staff; published for this load only (the fuzzed calls carry a key).
with override_settings(DURABLE_AGENTS={**django_settings.DURABLE_AGENTS, "PUBLIC_API_DOCS": True}):
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())


@pytest.fixture
def staff_key() -> str:
    user = User.objects.create_user("fuzzer", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="durable_agents"))
    _, raw = issue_api_key(user, "schemathesis")
    echo.start("where is order 7?", run_id="fz-echo")
    gated.start("refund order 7", run_id="fz-gated")
    halting.start("charge card c-1", run_id="fz-halt")
    return raw


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_server_errors(case, staff_key):
    case.call_and_validate(headers={"X-API-Key": staff_key}, checks=[not_a_server_error])
