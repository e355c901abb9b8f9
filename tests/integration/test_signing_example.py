"""docs/api.md's standalone signer, run as written: it signs what GET /approvals returns,
with nothing but the ``cryptography`` package, and the API accepts it."""

from __future__ import annotations

import base64
import json
import re

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

import durable_agents as da
from durable_agents.api.auth import issue_api_key
from durable_agents.models import ApproverKey, JournalEntry
from tests.support.agents import count_effects, gated
from tests.support.procs import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def the_example() -> dict:
    text = (ROOT / "docs" / "api.md").read_text()
    code = re.search(r"<!-- signing-example -->\n```python\n(.*?)```", text, re.S)
    assert code, "docs/api.md lost its signing example"
    namespace: dict = {}
    exec(compile(code.group(1), "docs/api.md", "exec"), namespace)  # the docs' own code
    return namespace


def test_the_documented_signer_is_accepted_and_matches_decision_bytes():
    example = the_example()
    approver = User.objects.create_user("cat")
    approver.user_permissions.add(
        Permission.objects.get(
            codename="approve_toolcall", content_type__app_label="durable_agents"
        )
    )
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    ApproverKey.objects.create(
        user=approver, public_key=base64.b64encode(public).decode(), confirmed_at=timezone.now()
    )
    relay = User.objects.create_user("relay", is_staff=True)
    relay.user_permissions.add(Permission.objects.get(codename="view_approvalrequest"))
    _, raw = issue_api_key(relay, "relay")
    headers = {"Authorization": f"Bearer {raw}"}
    gated.start("refund order 7", run_id="doc-sign")

    [item] = Client().get("/api/agents/approvals", headers=headers).json()["items"]
    start = json.loads(JournalEntry.objects.get(run_id="doc-sign", name="run:start").data)
    assert item["incarnation"] == start["incarnation"]
    assert example["decision_bytes"](item, str(approver.pk), True, "fine") == da.decision_bytes(
        incarnation=start["incarnation"],
        run_id="doc-sign",
        call_id=item["call_id"],
        tool_name=item["tool_name"],
        arguments=item["arguments"],
        approver_id=str(approver.pk),
        approved=True,
        note="fine",
    )
    body = example["signed_decision"](private, item, "cat", str(approver.pk), True, "fine")
    response = Client().post(
        f"/api/agents/runs/doc-sign/approvals/{item['call_id']}/signed",
        json.dumps(body),
        content_type="application/json",
        headers=headers,
    )
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert count_effects("doc-sign") == {item["call_id"]: 1}
