"""The permission table (``durable_agents.permissions``) is the one the site runs on: the
Run model's custom permissions are the table's, and every permission a rule names exists."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from durable_agents import permissions
from durable_agents.engine import identity
from durable_agents.models import Run

pytestmark = pytest.mark.django_db


def test_the_run_model_declares_the_tables_custom_permissions():
    assert list(Run._meta.permissions) == permissions.MODEL_PERMISSIONS
    engine_names = {
        identity.APPROVE_TOOLCALL,
        identity.RESOLVE_HALT,
        identity.FORK_RUN,
        identity.OPERATE_RUNS,
        identity.DELEGATE_APPROVALS,
    }
    # Importing is the glue's (``transfer``): no engine command checks it.
    assert {p for p, _ in permissions.CUSTOM} == engine_names | {permissions.IMPORT_RUNS}


def test_every_permission_a_rule_names_exists():
    rows = Permission.objects.filter(content_type__app_label="durable_agents")
    existing = {
        f"durable_agents.{codename}" for codename in rows.values_list("codename", flat=True)
    }
    named = {p for rule in permissions.RULES.values() for p in rule.any_of}
    assert named <= existing, named - existing
    described = dict(rows.values_list("codename", "name"))
    for codename, what in permissions.MODEL_PERMISSIONS:
        assert described[codename] == what


def test_a_refusal_names_what_to_grant():
    assert permissions.needs("view_runs") == (
        "'durable_agents.view_run' or 'durable_agents.cancel_run' or 'durable_agents.fork_run'"
    )
    assert permissions.refusal(None, "fork") == (
        "'this caller' may not fork a run: it needs the 'durable_agents.fork_run' permission "
        "(grant it in the admin, directly or through a group)"
    )
