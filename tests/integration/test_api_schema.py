"""Property-based requests against the served OpenAPI schema (schemathesis): whatever the
input, the API answers without a server error.

Each operation gets a bounded number of generated requests, sent through Django's WSGI
application with a staff API key that holds every permission, on PostgreSQL with a few
real runs (awaiting approval, halted, finished) in place, and calls awaiting approval under
approval rules with a deadline (one escalated, one an edit moved): the approvals they list
must match the schema's description of a rule and a deadline, field by field.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

import durable_agents as da
from durable_agents.api.auth import issue_api_key
from tests.support.agents import echo, gated, halting
from tests.support.people import make_user
from tests.support.rule_agents import FINANCE, LEADS
from tests.support.rule_desk import CALL, desk, escalate

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
    desk.start("refund 50000", run_id="fz-rule")
    desk.start("refund 250000", run_id="fz-escalated", by=user)
    escalate("fz-escalated")
    desk.start("refund 40000", run_id="fz-moved")
    make_user("lena", "approve_toolcall", groups=(LEADS,))
    for name in ("fay", "finn"):  # two of finance, or the moved call could never pass
        make_user(name, "approve_toolcall", groups=(FINANCE,))
    da.approve("fz-moved", CALL, True, by="lena", edit={"order_id": "7", "amount_cents": 400_000})
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


def test_approvals_under_rules_match_the_schema(staff_key):
    """What the schema says of ``rule`` and ``deadline`` is what the API answers: a rule
    with its deadline, one escalated, one an edit moved, and a gate without rules."""
    operation = schema["/api/agents/approvals"]["GET"]
    rules = {}
    for run_id in ("fz-rule", "fz-escalated", "fz-moved", "fz-gated"):
        case = operation.Case(query={"run_id": run_id})
        response = case.call_and_validate(
            headers={"X-API-Key": staff_key},
            checks=[not_a_server_error, response_schema_conformance],
        )
        items = response.json()["items"]
        assert len(items) == 1, (run_id, response.json())
        [item] = items
        rules[run_id] = (item["rule"], item["deadline"])
    assert rules["fz-rule"][0]["name"] == "lead" and rules["fz-rule"][1]["next_step"] == "remind"
    assert rules["fz-escalated"][1]["escalated_to"] == "oncall"
    assert rules["fz-moved"][0]["moved_by_edit"]["from_rule"] == "lead"
    assert rules["fz-gated"] == (None, None)
