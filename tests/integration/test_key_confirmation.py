"""Issue 31: one superuser passing a 2-of-2 quorum as two other people by registering keys
in their names. A key registered (or an API key minted) for someone else is pending until
its owner confirms it in their own admin session: an approver key by signing a fresh
challenge with its private key, an API key by generating it there, shown to the owner only.
Played through the real admin (CSRF on) and API; every refusal changes nothing."""

from __future__ import annotations

import base64
import importlib
import re
import subprocess
import sys
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import durable_agents as da
from durable_agents import people_keys
from durable_agents.database.audit import bundle
from durable_agents.engine.errors import ApprovalBadSignature, ConfigError
from durable_agents.models import ActionLog, ApiKey, ApproverKey, KeyChallenge, Run
from tests.integration.test_security import (
    browser,
    form_post,
    keyed,
    post,
    sign,
    signed_path,
    state,
)
from tests.support.agents import count_effects, quorum
from tests.support.api import API, error
from tests.support.people import make_user, perm
from tests.support.procs import ROOT
from tests.support.signing import keypair, public_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ADD_APPROVER_KEY = reverse("admin:durable_agents_approverkey_add")
ADD_API_KEY = reverse("admin:durable_agents_apikey_add")


def confirm_url(model: str, pk: int) -> str:
    return reverse(f"admin:durable_agents_{model}_confirm", args=[pk])


def challenge_on(response: Any) -> tuple[str, str]:
    """The challenge text and nonce a confirm page shows."""
    text = response.context["challenge_text"]
    assert text and text in response.content.decode()
    return text, response.context["challenge"].nonce


def signature(private: Ed25519PrivateKey, text: str) -> str:
    return base64.b64encode(private.sign(text.encode())).decode()


def page_error(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.context["error"])


def key_state(key: ApiKey | ApproverKey) -> tuple:
    key.refresh_from_db()
    return key.confirmed_at, key.revoked_at, getattr(key, "key_hash", None)


def key_rows(action: str, kind: str = "approver") -> list[tuple[str, str, bool]]:
    rows = ActionLog.objects.filter(action=action, payload__key=kind).order_by("id")
    return [(r.actor, r.payload["owner"], r.payload["pending"]) for r in rows]


@pytest.fixture
def finance() -> dict[str, User]:
    group = Group.objects.create(name="finance")
    group.permissions.add(perm("approve_toolcall"))
    people = {name: make_user(name, groups=("finance",)) for name in ("ann", "bob")}
    people["root"] = make_user("root", superuser=True)
    return people


@pytest.fixture
def relay() -> dict[str, str]:
    return keyed(make_user("relay", "view_approvalrequest"))


def test_a_superuser_cannot_be_a_whole_quorum_through_keys_in_others_names(finance, relay):
    ann, bob, root = finance["ann"], finance["bob"], finance["root"]
    quorum.start("pay invoice inv-1", run_id="kq-1")
    before = state("kq-1")
    path = signed_path("kq-1")
    call_id = path.split("/")[-2]
    as_root = browser(root)

    # Root registers keys whose private halves he holds, in ann's and bob's names.
    held = {}
    for victim in (ann, bob):
        held[victim.username], public = keypair()
        response = form_post(as_root, ADD_APPROVER_KEY, {"user": victim.pk, "public_key": public})
        assert response.status_code == 302
    made = {k.user.username: k for k in ApproverKey.objects.select_related("user")}
    assert all(k.confirmed_at is None and k.created_by == root for k in made.values())
    assert key_rows("create_key") == [("root", "ann", True), ("root", "bob", True)]
    listed = as_root.get(reverse("admin:durable_agents_approverkey_changelist"))
    assert "pending: ann confirms it" in listed.content.decode()
    inbox = browser(ann).get(reverse("admin:durable_agents_inbox")).content.decode()
    assert confirm_url("approverkey", made["ann"].pk) in inbox  # her inbox says so

    # He signs both decisions: refused on each path, exactly as an unknown key is.
    stranger, _ = keypair()  # a key registered to nobody
    for victim in (ann, bob):
        body = {"approver": victim.username, "approved": True}
        refused = error(
            post(relay, path, dict(body, signature=sign(held[victim.username], "kq-1", victim.pk))),
            400,
            "approval.bad_signature",
        )
        unknown = error(
            post(relay, path, dict(body, signature=sign(stranger, "kq-1", victim.pk))),
            400,
            "approval.bad_signature",
        )
        assert refused == unknown
        with pytest.raises(ApprovalBadSignature) as python_path:
            da.approve(
                "kq-1",
                call_id,
                approved=True,
                by=victim.username,
                signature=sign(held[victim.username], "kq-1", victim.pk),
            )
        assert python_path.value.message == refused["message"]
    assert state("kq-1") == before

    # He cannot confirm them himself: his session gets no challenge, and even ann's live
    # challenge signed with the very key is refused in his session.
    assert "Only ann" in page_error(as_root.get(confirm_url("approverkey", made["ann"].pk)))
    assert not KeyChallenge.objects.exists()
    as_ann, as_bob = browser(ann), browser(bob)
    text, nonce = challenge_on(as_ann.get(confirm_url("approverkey", made["ann"].pk)))
    stolen = {"nonce": nonce, "signature": signature(held["ann"], text)}
    response = form_post(as_root, confirm_url("approverkey", made["ann"].pk), stolen)
    assert "Only 'ann', signed in as themselves" in page_error(response)
    assert made["ann"].confirmed_at is None and key_state(made["ann"])[0] is None
    assert not KeyChallenge.objects.filter(used_at__isnull=False).exists()

    # Ann does not hold root's private key, so she cannot confirm his key either: she
    # revokes it. Bob does the same.
    ann_private, ann_public = keypair()
    response = form_post(
        as_ann,
        confirm_url("approverkey", made["ann"].pk),
        {"nonce": nonce, "signature": signature(ann_private, text)},
    )
    assert "does not verify" in page_error(response)
    assert key_state(made["ann"])[0] is None
    for victim, key in (("ann", made["ann"]), ("bob", made["bob"])):
        people_keys.revoke_keys([key], User.objects.get(username=victim), channel="admin")
    assert key_rows("revoke_key") == [("ann", "ann", True), ("bob", "bob", True)]

    # The honest path: each makes a key pair and hands root only the public key; root
    # registers it for them (pending), and it counts only once they confirm it.
    own = {"ann": (ann_private, ann_public), "bob": keypair()}
    for victim in (ann, bob):
        data = {"user": victim.pk, "public_key": own[victim.username][1]}
        assert form_post(as_root, ADD_APPROVER_KEY, data).status_code == 302
    honest = {k.user.username: k for k in ApproverKey.objects.filter(revoked_at__isnull=True)}
    body = {"approver": "ann", "approved": True, "signature": sign(own["ann"][0], "kq-1", ann.pk)}
    error(post(relay, path, body), 400, "approval.bad_signature")  # pending still
    assert state("kq-1") == before

    for victim, client in ((ann, as_ann), (bob, as_bob)):
        key = honest[victim.username]
        url = confirm_url("approverkey", key.pk)
        text, nonce = challenge_on(client.get(url))
        assert text == (
            f"durable_agents.key-confirmation.v1 user={victim.pk} key={key.public_key} "
            f"nonce={nonce}"
        )
        good = {"nonce": nonce, "signature": signature(own[victim.username][0], text)}
        response = form_post(client, url, good)
        assert response.status_code == 302, page_error(response)
        assert key_state(key)[0] is not None
        # The challenge was single use, and the key is confirmed once.
        again = form_post(client, url, good)
        assert "confirmed already" in page_error(again)
    assert key_rows("confirm_key")[-2:] == [("ann", "ann", False), ("bob", "bob", False)]

    # Now their own signatures count: two people, two decisions, the payout runs once.
    for victim in (ann, bob):
        private = own[victim.username][0]
        body = {
            "approver": victim.username,
            "approved": True,
            "signature": sign(private, "kq-1", victim.pk),
        }
        assert post(relay, path, body).status_code == 200
    assert Run.objects.get(run_id="kq-1").status == "finished"
    assert count_effects("kq-1") == {call_id: 1}
    listed = {d["approver"]: d["approver_keys"] for d in bundle("kq-1")["decisions"]}
    assert listed == {"ann": [own["ann"][1]], "bob": [own["bob"][1]]}


def test_a_confirmation_refuses_a_wrong_used_or_expired_challenge(finance):
    ann, root = finance["ann"], finance["root"]
    private, public = keypair()
    key = people_keys.register_approver_key(ann, public, by=root)
    url = confirm_url("approverkey", key.pk)
    as_ann = browser(ann)

    text, nonce = challenge_on(as_ann.get(url))
    wrong_key, _ = keypair()
    cases = {
        "does not verify": {"nonce": nonce, "signature": signature(wrong_key, text)},
        "does not verify: sign": {"nonce": nonce, "signature": "not base64!"},
        "No such challenge": {"nonce": "made-up", "signature": signature(private, text)},
    }
    for said, data in cases.items():
        response = form_post(as_ann, url, data)
        assert said in page_error(response)
        assert key_state(key)[0] is None
    # A failed attempt shows the same challenge again while it can be used.
    response = form_post(as_ann, url, cases["does not verify"])
    assert challenge_on(response)[1] == nonce

    # Signed for another key or another person: another text, so it does not verify.
    other_text = text.replace(f"user={ann.pk}", f"user={root.pk}")
    response = form_post(as_ann, url, {"nonce": nonce, "signature": signature(private, other_text)})
    assert "does not verify" in page_error(response)

    KeyChallenge.objects.filter(nonce=nonce).update(expires_at=timezone.now())
    response = form_post(as_ann, url, {"nonce": nonce, "signature": signature(private, text)})
    assert "expired" in page_error(response) and key_state(key)[0] is None

    text, nonce = challenge_on(as_ann.get(url))
    KeyChallenge.objects.filter(nonce=nonce).update(used_at=timezone.now())  # as a race would
    response = form_post(as_ann, url, {"nonce": nonce, "signature": signature(private, text)})
    assert "used already" in page_error(response) and key_state(key)[0] is None

    # A revoked key is never confirmed, whatever is signed.
    text, nonce = challenge_on(as_ann.get(url))
    people_keys.revoke_keys([key], root, channel="admin")
    response = form_post(as_ann, url, {"nonce": nonce, "signature": signature(private, text)})
    assert "revoked" in page_error(response) and key_state(key)[0] is None
    assert not ActionLog.objects.filter(action="confirm_key").exists()


def test_an_api_key_minted_for_someone_else_is_theirs_alone(finance):
    root = finance["root"]
    alice = make_user("alice", "view_run")  # no key permission at all
    as_root = browser(root)

    response = form_post(as_root, ADD_API_KEY, {"user": alice.pk, "name": "for alice"})
    assert response.status_code == 302
    key = ApiKey.objects.get(name="for alice")
    assert (key.prefix, key.key_hash, key.confirmed_at) == ("", "", None)
    shown = as_root.get(response["Location"]).content.decode()
    assert confirm_url("apikey", key.pk) in shown and "pending" in shown
    assert key_rows("create_key", "api") == [("root", "alice", True)]

    # Nothing authenticates as the invitation, not even a hash forced onto its row: it is
    # refused exactly as a key nobody issued.
    raw, prefix, digest = people_keys.new_key()
    ApiKey.objects.filter(pk=key.pk).update(prefix=prefix, key_hash=digest)
    nobodys = {"X-API-Key": people_keys.new_key()[0]}
    unknown = error(Client().get(API + "/runs", headers=nobodys), 401, "auth.invalid_key")
    for header in ({"X-API-Key": raw}, {"Authorization": f"Bearer {raw}"}):
        assert (
            error(Client().get(API + "/runs", headers=header), 401, "auth.invalid_key") == unknown
        )
    ApiKey.objects.filter(pk=key.pk).update(prefix="", key_hash="")

    # Root cannot confirm it for her.
    url = confirm_url("apikey", key.pk)
    assert "Only alice" in page_error(as_root.get(url))
    assert "Only 'alice', signed in as themselves" in page_error(form_post(as_root, url, {}))
    assert key_state(key) == (None, None, "")

    # Alice, signed in as herself, confirms it: the key is generated and shown to her once.
    as_alice = browser(alice)
    assert as_alice.get(url).context["may_confirm"]
    response = form_post(as_alice, url, {})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    raw = response.context["raw_key"]
    assert Client().get(API + "/runs", headers={"X-API-Key": raw}).status_code == 200
    assert key_rows("confirm_key", "api") == [("alice", "alice", False)]
    # Once: posting again makes no second key.
    hashed = key_state(key)[2]
    assert "confirmed already" in page_error(form_post(as_alice, url, {}))
    assert key_state(key)[2] == hashed


def test_the_python_paths_follow_the_same_rule(finance):
    ann, bob, root = finance["ann"], finance["bob"], finance["root"]
    _, public = keypair()
    with pytest.raises(ConfigError) as refused:
        people_keys.register_approver_key(bob, public, by=ann)
    assert refused.value.code == "key.forbidden"
    with pytest.raises(ConfigError) as refused:
        people_keys.register_approver_key(ann, "bm90IGEga2V5", by=ann)
    assert refused.value.code == "key.invalid"
    mine = people_keys.register_approver_key(ann, public, by=ann)
    assert mine.confirmed_at is not None  # her own: in effect at once
    with pytest.raises(ConfigError) as refused:
        people_keys.register_approver_key(bob, public, by=root)
    assert refused.value.code == "key.taken"

    with pytest.raises(ConfigError) as refused:
        people_keys.issue_api_key(ann, "for ann", created_by=root)
    assert refused.value.code == "key.not_owner"
    with pytest.raises(ConfigError) as refused:
        people_keys.invite_api_key(bob, "from ann", by=ann)
    assert refused.value.code == "key.forbidden"
    invited = people_keys.invite_api_key(ann, "from root", by=root)
    with pytest.raises(ConfigError) as refused:
        people_keys.confirm_api_key(invited, root)
    assert refused.value.code == "key.not_owner"
    raw = people_keys.confirm_api_key(invited, ann)
    assert people_keys.hash_key(raw) == ApiKey.objects.get(pk=invited.pk).key_hash

    # An invitation that expired or was revoked before its owner came is never confirmed.
    late = people_keys.invite_api_key(ann, "late", by=root, expires_at=timezone.now())
    dropped = people_keys.invite_api_key(ann, "dropped", by=root)
    people_keys.revoke_keys([dropped], root, channel="python")
    for key, code in ((late, "key.expired"), (dropped, "key.revoked")):
        with pytest.raises(ConfigError) as refused:
            people_keys.confirm_api_key(key, ann)
        assert refused.value.code == code
        assert key_state(key)[0] is None and key_state(key)[2] == ""


def test_the_documented_one_liner_signs_a_challenge(finance, tmp_path):
    """docs/admin.md's signing one-liner, run as written in a shell, confirms a key."""
    ann, root = finance["ann"], finance["root"]
    private = Ed25519PrivateKey.generate()
    pem = tmp_path / "approver.pem"
    pem.write_bytes(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    key = people_keys.register_approver_key(ann, public_text(private), by=root)
    challenge = people_keys.issue_challenge(key, ann)
    text = (ROOT / "docs" / "admin.md").read_text()
    line = re.search(r"<!-- confirm-one-liner -->\n *```sh\n *(.*?)\n *```", text, re.S)
    assert line, "docs/admin.md lost its confirmation one-liner"
    command = line.group(1).replace(
        "'CHALLENGE'", "'" + people_keys.challenge_text(challenge) + "'"
    )
    done = subprocess.run(
        command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": f"{sys.exec_prefix}/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    people_keys.confirm_approver_key(key, ann, challenge.nonce, done.stdout.strip())
    assert ApproverKey.objects.get(pk=key.pk).confirmed_at is not None


def test_the_migration_confirms_the_keys_that_existed(finance):
    ann = finance["ann"]
    _, public = keypair()
    old = ApproverKey.objects.create(user=ann, public_key=public)
    old_api = ApiKey.objects.create(user=ann, name="old", prefix="p", key_hash="h")
    migration = importlib.import_module("durable_agents.migrations.0015_key_confirmation")
    migration.confirm_existing_keys(apps, None)
    for row in (old, old_api):
        row.refresh_from_db()
        assert row.confirmed_at == row.created_at
