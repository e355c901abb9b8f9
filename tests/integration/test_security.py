"""Issue 11's attacks, played against the real views as an attacker with a staff account
would: the admin (CSRF on) and the API (session and API key), and the example webhook. Each
is refused with a coded 4xx (or a form error in the admin), and nothing changes: rows are
counted, the journal read, the side-effect table checked.

1. key minting for someone else        5. webhook: oracle, replay, malformed → 500
2. one person, a whole quorum          6. unsafe example defaults (test_example_site.py)
3. signed decisions from nobody        7. the smaller ones: reads, attribution, 413, 404,
4. replay onto a new run with an old id   docs, the key header
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents import webhooks
from durable_agents.api.auth import issue_api_key
from durable_agents.engine.records import encode
from durable_agents.models import (
    ActionLog,
    ApiKey,
    ApprovalRequest,
    ApproverKey,
    Decision,
    JournalEntry,
    Run,
    SpentRunId,
)
from tests.support.admin_pages import shown
from tests.support.agents import count_effects, gated, quorum
from tests.support.api import API, error
from tests.support.people import make_user, perm
from tests.support.signing import keypair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SECRET = "tests-webhook-secret-not-for-production"  # tests/settings.py


# -- helpers ------------------------------------------------------------------------


def browser(user: User) -> Client:
    """A signed-in browser that must send the CSRF token, as a real one does."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def form_post(client: Client, url: str, data: dict[str, Any]) -> Any:
    """Open the form (which sets the CSRF cookie), then submit it with the token."""
    client.get(url)
    token = client.cookies["csrftoken"].value
    return client.post(url, {**data, "csrfmiddlewaretoken": token})


def keyed(user: User) -> dict[str, str]:
    _, raw = issue_api_key(user, "attack")
    return {"Authorization": f"Bearer {raw}"}


def post(headers: dict[str, str], path: str, body: Any) -> Any:
    return Client().post(
        API + path, json.dumps(body), content_type="application/json", headers=headers
    )


def incarnation(run_id: str) -> str:
    return json.loads(JournalEntry.objects.get(run_id=run_id, name="run:start").data)["incarnation"]


def sign(
    private: Ed25519PrivateKey,
    run_id: str,
    approver_id: Any,
    approved: bool = True,
    note: str = "",
    *,
    incarnation_: str | None = None,
) -> str:
    request = ApprovalRequest.objects.get(run_id=run_id)
    message = da.decision_bytes(
        incarnation=incarnation(run_id) if incarnation_ is None else incarnation_,
        run_id=run_id,
        call_id=request.call_id,
        tool_name=request.tool_name,
        arguments=request.arguments,
        approver_id=str(approver_id),
        approved=approved,
        note=note,
    )
    return base64.b64encode(private.sign(message)).decode()


def signed_path(run_id: str) -> str:
    call_id = ApprovalRequest.objects.get(run_id=run_id).call_id
    return f"/runs/{run_id}/approvals/{call_id}/signed"


def state(run_id: str) -> tuple:
    """Everything an attack could change about a run: rows, journal, side effects."""
    return (
        Run.objects.filter(run_id=run_id).values_list("status", flat=True).first(),
        list(JournalEntry.objects.filter(run_id=run_id).values_list("name", flat=True)),
        Decision.objects.filter(request__run_id=run_id).count(),
        ActionLog.objects.filter(run_id=run_id).count(),
        count_effects(run_id),
    )


@pytest.fixture
def relay() -> dict[str, str]:
    """A relay service's key: staff who may read approvals, nothing more."""
    return keyed(make_user("relay", "view_approvalrequest"))


# -- 1. key minting for someone else ------------------------------------------------


def test_1_staff_cannot_mint_an_api_key_for_another_user():
    root = make_user("root", superuser=True)
    mallory = make_user("mallory", "add_apikey", "view_apikey", "change_apikey")
    client = browser(mallory)
    add = reverse("admin:durable_agents_apikey_add")

    response = form_post(client, add, {"user": root.pk, "name": "root's key"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ApiKey.objects.exists()

    # For herself it works, and the key acts only as her.
    response = form_post(client, add, {"user": mallory.pk, "name": "mine"})
    assert response.status_code == 200 and response.context["raw_key"]
    key = ApiKey.objects.get()
    assert (key.user, key.created_by) == (mallory, mallory)

    # She neither sees nor revokes anyone else's key.
    other, _ = issue_api_key(root, "root's")
    changelist = reverse("admin:durable_agents_apikey_changelist")
    assert "root&#x27;s" not in client.get(changelist).content.decode()
    form_post(client, changelist, {"action": "revoke", "_selected_action": [other.pk]})
    assert ApiKey.objects.get(pk=other.pk).revoked_at is None

    # A superuser may create one for someone else: a pending invitation with no secret (she
    # never sees a key; test_key_confirmation.py has the rest); the key and the logs say who.
    alice = make_user("alice")
    response = form_post(browser(root), add, {"user": alice.pk, "name": "for alice"})
    assert response.status_code == 302
    made = ApiKey.objects.get(name="for alice")
    assert (made.user, made.created_by, made.confirmed_at, made.key_hash) == (alice, root, None, "")
    entry = LogEntry.objects.get(object_id=str(made.pk))
    assert entry.user == root and "Created for alice by root" in entry.get_change_message()


def test_1_keys_expire_and_revocation_is_immediate():
    user = make_user("robot", "view_run")
    key, raw = issue_api_key(user, "ci", expires_at=timezone.now() + timezone.timedelta(hours=1))
    for header in ({"Authorization": f"Bearer {raw}"}, {"X-API-Key": raw}):
        assert Client().get(API + "/runs", headers=header).status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now())
    error(Client().get(API + "/runs", headers={"X-API-Key": raw}), 401, "auth.key_expired")
    ApiKey.objects.filter(pk=key.pk).update(expires_at=None, revoked_at=timezone.now())
    error(
        Client().get(API + "/runs", headers={"Authorization": f"Bearer {raw}"}),
        401,
        "auth.key_revoked",
    )


# -- 2. one person, a whole quorum --------------------------------------------------


@pytest.fixture
def finance():
    group = Group.objects.create(name="finance")
    group.permissions.add(perm("approve_toolcall"))
    people = {name: make_user(name, groups=("finance",)) for name in ("ann", "bob")}
    people["mallory"] = make_user(
        "mallory",
        "add_approverkey",
        "view_approverkey",
        "view_approvalrequest",
        groups=("finance",),
    )
    return people


def test_2_one_person_cannot_be_a_whole_quorum(finance, relay):
    mallory, ann, bob = finance["mallory"], finance["ann"], finance["bob"]
    quorum.start("pay invoice inv-1", run_id="quorum-1")
    before = state("quorum-1")
    client = browser(mallory)
    add = reverse("admin:durable_agents_approverkey_add")
    private, public = keypair()

    # Her key under the approvers' names: a form error, nothing registered.
    for victim in (ann, bob):
        response = form_post(client, add, {"user": victim.pk, "public_key": public})
        assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ApproverKey.objects.exists()

    # Under her own name it is hers; the same public key cannot be registered again, for
    # anyone, not even by a superuser.
    assert form_post(client, add, {"user": mallory.pk, "public_key": public}).status_code == 302
    again = form_post(client, add, {"user": mallory.pk, "public_key": public})
    assert "already registered" in again.content.decode()
    root = browser(make_user("root", superuser=True))
    stolen = form_post(root, add, {"user": bob.pk, "public_key": public})
    assert stolen.status_code == 200 and "already registered" in stolen.content.decode()
    assert list(ApproverKey.objects.values_list("user__username", flat=True)) == ["mallory"]

    # Her signature claimed for ann: refused.
    path = signed_path("quorum-1")
    forged = {"approver": "ann", "approved": True, "signature": sign(private, "quorum-1", ann.pk)}
    error(post(relay, path, forged), 400, "approval.bad_signature")
    as_her = sign(private, "quorum-1", mallory.pk)
    error(post(relay, path, dict(forged, signature=as_her)), 400, "approval.bad_signature")
    assert state("quorum-1") == before

    # Her own signature counts once, however many keys and channels she uses.
    second, public2 = keypair()
    assert form_post(client, add, {"user": mallory.pk, "public_key": public2}).status_code == 302
    mine = {"approver": "mallory", "approved": True}
    for key in (private, second):
        response = post(relay, path, dict(mine, signature=sign(key, "quorum-1", mallory.pk)))
        assert response.status_code == 200 and response.json()["status"] == "pending"
    mallory.user_permissions.add(perm("view_run"))
    call_id = path.split("/")[-2]
    response = post(keyed(mallory), f"/runs/quorum-1/approvals/{call_id}", {"approved": True})
    assert response.status_code == 200 and response.json()["status"] == "pending"
    assert response.json()["tally"]["approved_by"] == ["mallory"]
    assert Decision.objects.filter(request__run_id="quorum-1").count() == 1
    assert Run.objects.get(run_id="quorum-1").status == "awaiting_approval"
    assert count_effects("quorum-1") == {}  # the payout did not run


# -- 3. signed decisions from nobody ------------------------------------------------


def test_3_a_signed_decision_needs_an_active_user_who_may_approve(relay):
    gated.start("refund order 7", run_id="nobody-1")
    path = signed_path("nobody-1")
    gone = make_user("gone", "approve_toolcall", staff=False)
    norights = make_user("norights", staff=False)
    keys = {}
    for user in (gone, norights):
        keys[user.username], public = keypair()
        ApproverKey.objects.create(user=user, public_key=public, confirmed_at=timezone.now())
    User.objects.filter(pk=gone.pk).update(is_active=False)
    private = keys["gone"]
    before = state("nobody-1")

    body = {"approver": "ghost", "approved": True, "signature": sign(private, "nobody-1", 999)}
    assert (
        "names no user" in error(post(relay, path, body), 403, "approval.not_eligible")["message"]
    )
    for name, user in (("gone", gone), ("norights", norights)):
        body = {
            "approver": name,
            "approved": True,
            "signature": sign(keys[name], "nobody-1", user.pk),
        }
        error(post(relay, path, body), 403, "approval.not_eligible")
    assert state("nobody-1") == before

    # The control: an active approver's signature decides.
    ok_private, ok_public = keypair()
    ext = make_user("ext", "approve_toolcall", staff=False)
    ApproverKey.objects.create(user=ext, public_key=ok_public, confirmed_at=timezone.now())
    body = {"approver": "ext", "approved": True, "signature": sign(ok_private, "nobody-1", ext.pk)}
    assert post(relay, path, body).json()["status"] == "approved"
    assert count_effects("nobody-1") == {"call_1_1": 1}


# -- 4. replay onto a new run with an old id ----------------------------------------


def test_4_an_old_signature_does_not_approve_a_new_start_of_the_run(relay):
    root = make_user("root", superuser=True)
    ext = make_user("ext", "approve_toolcall", staff=False)
    private, public = keypair()
    ApproverKey.objects.create(user=ext, public_key=public, confirmed_at=timezone.now())
    gated.start("refund order 7", run_id="replay-1")
    old = sign(private, "replay-1", ext.pk, note="one refund, ok")

    # The run is cancelled and deleted, then started again under the same id and input.
    assert post(keyed(root), "/runs/replay-1/cancel", {"reason": "x"}).status_code == 200
    delete = reverse("admin:durable_agents_run_delete", args=["replay-1"])
    assert form_post(browser(root), delete, {"post": "yes"}).status_code == 302
    assert not Run.objects.filter(run_id="replay-1").exists()
    restart = {"agent": "gated", "input": "refund order 7", "run_id": "replay-1"}
    # A deleted run's id is spent: the restart is refused, and writes nothing.
    error(post(keyed(root), "/runs", restart), 409, "run.spent")
    assert not Run.objects.filter(run_id="replay-1").exists()
    # Second line: even with the spent mark wiped (an operator clearing tables by hand), a
    # new start of the run is another incarnation, which an old signature does not bind.
    SpentRunId.objects.filter(run_id="replay-1").delete()
    assert post(keyed(root), "/runs", restart).status_code == 202
    before = state("replay-1")

    body = {"approver": "ext", "approved": True, "note": "one refund, ok", "signature": old}
    error(post(relay, signed_path("replay-1"), body), 400, "approval.bad_signature")
    # The note is signed: a relay cannot change it.
    fresh = sign(private, "replay-1", ext.pk, note="one refund, ok")
    changed = dict(body, signature=fresh, note="refund everything")
    error(post(relay, signed_path("replay-1"), changed), 400, "approval.bad_signature")
    # A signature over the retired format (no incarnation, no note) is refused by name.
    request = ApprovalRequest.objects.get(run_id="replay-1")

    def f(text: str) -> bytes:
        return struct.pack(">I", len(text.encode())) + text.encode()

    v1 = (
        b"durable_agents.approval.v1\n"
        + f("replay-1")
        + f(request.call_id)
        + f(request.tool_name)
        + hashlib.sha256(encode(request.arguments).encode()).digest()
        + f("ext")
        + b"\x01"
    )
    retired = dict(body, signature=base64.b64encode(private.sign(v1)).decode())
    error(post(relay, signed_path("replay-1"), retired), 400, "approval.signature_format")
    assert state("replay-1") == before and count_effects("replay-1") == {}

    # The signature over this start, verdict and note is accepted; the log names the
    # approver and the relay.
    response = post(relay, signed_path("replay-1"), dict(body, signature=fresh))
    assert response.json()["status"] == "approved"
    assert count_effects("replay-1") == {"call_1_1": 1}
    log = ActionLog.objects.get(run_id="replay-1", action="approve")
    assert (log.actor, log.actor_id) == ("ext", str(ext.pk))
    assert log.channel.startswith("signature via relay (api-key:")


# -- 5. the webhook -----------------------------------------------------------------


def deliver(body: bytes, delivery_id: str = "d-1", signature: str | None = None, **headers):
    signature = signature or webhooks.sign(body, delivery_id, SECRET)
    return Client().post(
        "/webhooks/inbound/",
        body,
        content_type="application/json",
        headers={"X-Signature": signature, "X-Delivery-Id": delivery_id, **headers},
    )


def test_5_webhook_refuses_forgeries_replays_and_malformed_input_with_4xx():
    body = json.dumps({"session": "s-wh", "text": "My order 7 is late."}).encode()
    good = webhooks.sign(body, "d-1", SECRET)
    _, digest = good.split(",")
    refusals = [
        # A non-ASCII signature used to make compare_digest raise (a 500 and, with DEBUG, a
        # page that showed the expected signature).
        (deliver(body, signature="t=1,v1=é" + "0" * 63), 401, "webhook.bad_signature"),
        (deliver(body, signature=good + "\x00"), 401, "webhook.bad_signature"),
        (deliver(body, signature="sha256=" + "0" * 64), 401, "webhook.bad_signature"),
        (deliver(body, signature=f"t=abc,{digest}"), 401, "webhook.bad_signature"),
        # The captured delivery, replayed under a new delivery id.
        (deliver(body, "d-2", signature=good), 401, "webhook.bad_signature"),
        # A correctly signed delivery from 6 minutes ago.
        (
            deliver(
                body,
                signature=webhooks.sign(body, "d-1", SECRET, int(time.time()) - 360),
            ),
            401,
            "webhook.stale",
        ),
        (deliver(body, "bad id!"), 400, "webhook.bad_delivery_id"),
    ]
    malformed = [
        b'{"session": "s-wh", "text": "a\\u0000b"}',
        b'{"session": "s-wh", "text": "\\ud800"}',
        b'{"session": "s\\u0000", "text": "hi"}',
        b'{"session": "s-wh", "text": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"session": "s-wh", "text": "hi", "x": ' + b"[" * 30 + b"]" * 30 + b"}",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"session": "' + b"x" * 300 + b'", "text": "hi"}',
    ]
    for i, raw in enumerate(malformed):
        response = deliver(raw, f"m-{i}")  # correctly signed
        assert 400 <= response.status_code < 500, (raw[:60], response.content)
        assert response.json()["code"], response.content
    for response, status, code in refusals:
        assert response.status_code == status and response.json()["code"] == code, response.content
    assert not Run.objects.exists()
    # The genuine delivery opens one turn; its redelivery (same id) opens none.
    assert deliver(body, signature=good).status_code in (200, 202)
    assert deliver(body, signature=good).status_code in (200, 202)
    turns = Run.objects.filter(session_id="s-wh").exclude(run_id__endswith=">session")
    assert list(turns.values_list("run_id", flat=True)) == ["s-wh>event/d-1"]


# -- 7. the smaller ones ------------------------------------------------------------


def test_7_api_reads_need_the_admins_view_permissions():
    gated.start("refund order 7", run_id="read-1")
    nosy = keyed(make_user("nosy"))  # staff, no permission at all
    for path in (
        "/runs",
        "/runs/read-1",
        "/runs/read-1/journal",
        "/runs/read-1/history",
        "/runs/compare?a=read-1&b=read-1",
        "/approvals",
        "/halts",
    ):
        error(Client().get(API + path, headers=nosy), 403, "auth.forbidden")
    approver = keyed(make_user("approver", "approve_toolcall"))
    assert Client().get(API + "/approvals", headers=approver).status_code == 200
    error(Client().get(API + "/runs/read-1", headers=approver), 403, "auth.forbidden")
    reader = keyed(make_user("reader", "view_run"))
    assert Client().get(API + "/runs/read-1", headers=reader).json()["input"] == "refund order 7"


def test_7_every_write_is_attributed_with_its_channel():
    user = make_user("writer", "add_run", "view_run")
    headers = keyed(user)
    prefix = ApiKey.objects.get(user=user).prefix
    body = {"text": "My order 7 is late.", "agent": "echo"}
    put = Client().put(
        API + "/sessions/s-log/messages/k-1",
        json.dumps(body),
        content_type="application/json",
        headers=headers,
    )
    assert put.status_code in (200, 202)
    log = ActionLog.objects.get(action="send_once")
    assert (log.actor, log.actor_id, log.channel) == ("writer", str(user.pk), f"api-key:{prefix}")
    assert log.payload["key"] == "k-1"

    # Session, CSRF on: the channel says so.
    client = browser(user)
    client.get(reverse("admin:index"))  # sets the CSRF cookie
    start = client.post(
        API + "/runs",
        json.dumps({"agent": "echo", "input": "hi", "run_id": "by-session"}),
        content_type="application/json",
        headers={"X-CSRFToken": client.cookies["csrftoken"].value},
    )
    assert start.status_code == 202
    assert ActionLog.objects.get(action="start").channel == "session"

    # The admin: the channel is "admin".
    approver = make_user("approver", "approve_toolcall")
    gated.start("refund order 7", run_id="by-admin")
    request = ApprovalRequest.objects.get(run_id="by-admin")
    url = reverse("admin:durable_agents_approvalrequest_decide", args=[request.pk])
    detail = reverse("admin:durable_agents_approvalrequest_change", args=[request.pk])
    client = browser(approver)
    client.get(detail)
    client.post(
        url,
        {
            "decision": "approve",
            "shown": shown(request),
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value,
        },
    )
    log = ActionLog.objects.get(action="approve", run_id="by-admin")
    assert (log.actor, log.channel) == ("approver", "admin")


def test_7_an_oversize_body_is_a_coded_413(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    headers = keyed(make_user("big", "add_run"))
    body = {"agent": "echo", "input": "x" * 5000, "run_id": "too-big"}
    error(post(headers, "/runs", body), 413, "request.too_large")
    assert not Run.objects.exists()


def test_7_unroutable_paths_are_coded_json_404s():
    headers = keyed(make_user("lost", "view_run", "add_run"))
    for method, path in (
        ("get", "/sessions/a/b"),
        ("get", "/nothing-here"),
        ("get", "/approvals/x"),
        ("put", "/sessions/s/messages/a/b"),
        ("delete", "/runs"),
    ):
        response = getattr(Client(), method)(API + path, headers=headers)
        assert response.status_code in (404, 405), (path, response.content)
        if response.status_code == 404:
            assert response.json()["code"] == "not_found"
    error(Client().get(API + "/sessions/a/b"), 401, "auth.required")


def test_7_the_key_created_page_names_a_header_the_api_takes():
    root = make_user("root", superuser=True)
    response = form_post(
        browser(root), reverse("admin:durable_agents_apikey_add"), {"user": root.pk, "name": "k"}
    )
    page = response.content.decode()
    raw = response.context["raw_key"]
    assert "Authorization: Bearer &lt;key&gt;" in page and "X-API-Key: &lt;key&gt;" in page
    assert (
        Client().get(API + "/runs", headers={"Authorization": f"Bearer {raw}"}).status_code == 200
    )


def test_by_takes_a_user_object_read_again_when_the_command_runs():
    """``by=`` a user object or a username: either way one active user, checked when the
    command runs (a user object deactivated since is refused)."""
    approver = make_user("approver", "approve_toolcall")
    gated.start("refund order 7", run_id="by-object")
    call_id = ApprovalRequest.objects.get(run_id="by-object").call_id
    User.objects.filter(pk=approver.pk).update(is_active=False)  # `approver` is now stale
    before = state("by-object")
    with pytest.raises(da.ApproverNotEligible, match="inactive"):
        da.approve("by-object", call_id, True, by=approver)
    assert state("by-object") == before
    User.objects.filter(pk=approver.pk).update(is_active=True)
    assert da.approve("by-object", call_id, True, by=approver).status == "approved"
    log = ActionLog.objects.get(run_id="by-object", action="approve")
    assert (log.actor, log.actor_id, log.channel) == ("approver", str(approver.pk), "python")
