"""The shipped webhook view (``durable_agents.webhooks.InboundWebhook``) on PostgreSQL: how
it is built and refuses to be built, every refusal coded and logged with its reason, the
upload limit, rotation of secrets, and where a delivery's parts are taken from."""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import Client, RequestFactory
from django.test.utils import override_settings
from django.urls import reverse

import durable_agents as da
from durable_agents.conf import parse_webhook_secrets
from durable_agents.models import JournalEntry, Run
from durable_agents.webhooks import InboundWebhook, sign
from tests.support.agents import echo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SECRET = "tests-webhook-secret-not-for-production"  # tests/settings.py
OLD_SECRET = "the-secret-the-sender-used-until-last-week"
URL = "/webhooks/inbound/"


def _message(session: str = "s-view", text: str = "Where is order 7?") -> bytes:
    return json.dumps({"session": session, "text": text}).encode()


def deliver(
    body: bytes,
    delivery_id: str = "d-1",
    *,
    secret: str = SECRET,
    signature: str | None = None,
    timestamp: int | None = None,
    **headers: str,
) -> Any:
    """A delivery through the site's URL and its whole middleware stack (CSRF included)."""
    headers = {
        "X-Signature": signature or sign(body, delivery_id, secret, timestamp),
        "X-Delivery-Id": delivery_id,
        **headers,
    }
    return Client(enforce_csrf_checks=True).post(
        URL, body, content_type="application/json", headers=headers
    )


def call(view: Any, body: bytes, headers: dict[str, str]) -> Any:
    """A request straight to a view built in the test (not mounted on a URL)."""
    request = RequestFactory().post(URL, body, content_type="application/json", headers=headers)
    return view(request)


def data(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response.content)
    return body


def coded(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response.content
    body = data(response)
    assert body["code"] == code and body["message"], body
    return body


def nothing_recorded() -> None:
    assert not Run.objects.exists() and not JournalEntry.objects.exists()


def turns(session: str) -> list[str]:
    runs = Run.objects.filter(session_id=session).exclude(run_id__endswith=">session")
    return sorted(runs.values_list("run_id", flat=True))


# -- refusals ---------------------------------------------------------------------------


def test_every_refusal_is_a_coded_4xx_that_records_nothing():
    body = _message()
    good = sign(body, "d-1", SECRET)
    unsigned = Client().post(
        URL, body, content_type="application/json", headers={"X-Delivery-Id": "d-1"}
    )
    coded(unsigned, 401, "webhook.bad_signature")
    coded(deliver(body, signature="t=1,v1=zz"), 401, "webhook.bad_signature")
    coded(deliver(body, secret="x" * 40), 401, "webhook.bad_signature")
    coded(deliver(body, "d-2", signature=good), 401, "webhook.bad_signature")
    coded(deliver(body, timestamp=int(time.time()) - 301), 401, "webhook.stale")
    coded(deliver(body, timestamp=int(time.time()) + 400), 401, "webhook.stale")
    no_id = Client().post(URL, body, content_type="application/json", headers={"X-Signature": good})
    coded(no_id, 400, "webhook.bad_delivery_id")
    coded(deliver(body, "id with spaces"), 400, "webhook.bad_delivery_id")
    coded(deliver(body, "x" * 201), 400, "webhook.bad_delivery_id")
    coded(deliver(b"not json", "d-3"), 400, "webhook.bad_body")
    coded(deliver(b'{"session": "s-view"}', "d-4"), 400, "webhook.bad_body")
    coded(deliver(b'{"session": "s-view", "text": 7}', "d-5"), 400, "webhook.bad_body")
    coded(deliver(_message(session="not a session id!"), "d-6"), 400, "config.session_id")
    nothing_recorded()


def test_a_body_over_the_upload_limit_is_a_coded_413(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = _message(text="x" * 5000)  # correctly signed
    coded(deliver(body), 413, "webhook.too_large")
    nothing_recorded()
    # Just under the limit is taken.
    assert deliver(_message(text="y" * 500), "d-2").status_code in (200, 202)


def test_other_methods_are_a_coded_405_naming_post():
    client = Client()
    for method in ("get", "put", "delete", "patch", "options"):
        response = getattr(client, method)(URL)
        coded(response, 405, "webhook.method")
        assert response["Allow"] == "POST"
    nothing_recorded()


def test_a_refusal_logs_its_reason_code_and_delivery_but_no_secret_or_body(caplog):
    body = _message(text="my card is 4111 1111 1111 1111")
    with caplog.at_level(logging.WARNING, logger="durable_agents.webhooks"):
        deliver(body, "d-forged", secret="y" * 40)
        deliver(body, "d-old", timestamp=int(time.time()) - 3600)
        deliver(b"[1, 2]", "d-list")
        deliver(body, "bad id\nFAKE LOG LINE")
    records = [r for r in caplog.records if r.name == "durable_agents.webhooks"]
    assert [(r.levelno, r.code, r.delivery_id) for r in records] == [  # type: ignore[attr-defined]
        (logging.WARNING, "webhook.bad_signature", "d-forged"),
        (logging.WARNING, "webhook.stale", "d-old"),
        (logging.WARNING, "webhook.bad_body", "d-list"),
        (logging.WARNING, "webhook.bad_delivery_id", None),
    ]
    text = "\n".join(r.getMessage() for r in records)
    assert "webhook.bad_signature" in text and "webhook.stale" in text
    assert "seconds off this server's clock" in text
    assert SECRET not in text and "4111" not in text and "[1, 2]" not in text
    assert "FAKE LOG LINE" not in text.replace("\\nFAKE LOG LINE", "")  # quoted, one line


def test_a_redelivery_opens_one_turn_and_gets_its_answer():
    view = InboundWebhook.as_view(agent="echo")  # answers at once (inline dispatch)
    body = _message(session="s-again")

    def delivery() -> Any:  # signed anew each time, as a sender's retry is
        return call(view, body, {"X-Delivery-Id": "d-1", "X-Signature": sign(body, "d-1", SECRET)})

    first = delivery()
    assert first.status_code in (200, 202)
    run_id = data(first)["run_id"]
    assert run_id == "s-again>event/d-1"
    again = delivery()
    assert again.status_code == 200 and data(again) == {
        "run_id": run_id,
        "status": "answered",
        "answer": "order 7 shipped",
    }
    assert turns("s-again") == [run_id]
    other = _message(session="s-again", text="other")
    conflict = call(
        view, other, {"X-Delivery-Id": "d-1", "X-Signature": sign(other, "d-1", SECRET)}
    )
    coded(conflict, 409, "session.key_conflict")


# -- building ---------------------------------------------------------------------------


def test_the_view_is_checked_when_built():
    with pytest.raises(da.ConfigError, match="needs agent="):
        InboundWebhook.as_view()
    with pytest.raises(da.ConfigError, match="'nobody' is not loaded") as missing:
        InboundWebhook.as_view(agent="nobody")
    assert missing.value.code == "config.agent_missing"
    with pytest.raises(da.ConfigError, match="got 'secret'"):
        InboundWebhook.as_view(agent="echo", secret="x" * 40)
    with pytest.raises(da.ConfigError, match="got 'dispatch'"):
        InboundWebhook.as_view(agent="echo", dispatch=None)
    with pytest.raises(da.ConfigError, match="tolerance must be a positive"):
        InboundWebhook.as_view(agent="echo", tolerance=0)
    with pytest.raises(da.ConfigError, match="max_depth"):
        InboundWebhook.as_view(agent="echo", max_depth="20")
    # The Agent object itself works too (workers still find it by name).
    assert InboundWebhook.as_view(agent=echo).view_initkwargs["agent"] is echo


def test_a_broken_agents_list_is_left_to_the_check_and_deliveries_get_a_503(settings):
    """An ``AGENTS`` entry that does not import is the system check's to report (E002):
    building the view must not raise over it (urls.py loads while the checks run), and a
    delivery meanwhile is a 503 the sender retries, recording nothing."""
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "AGENTS": [*settings.DURABLE_AGENTS["AGENTS"], "tests.support.no_such_module.agent"],
    }
    view = InboundWebhook.as_view(agent="echo")
    assert view.view_initkwargs["agent"] == "echo"
    assert any(e.id == "durable_agents.E002" for e in run_checks())
    body = _message()
    headers = {"X-Signature": sign(body, "d-9", SECRET), "X-Delivery-Id": "d-9"}
    coded(call(view, body, headers), 503, "webhook.agent_unavailable")
    nothing_recorded()


def test_invalid_settings_are_left_to_the_check_and_deliveries_get_a_503(settings):
    """A DURABLE_AGENTS the check refuses (E001): building the view (as ``urls.py`` does
    while the checks run) must not raise over it, and a delivery meanwhile is a 503."""
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "DISPATCH": "rabbit"}
    view = InboundWebhook.as_view(agent="echo")
    assert [e.id for e in run_checks() if e.id.startswith("durable_agents.")] == [
        "durable_agents.E001"
    ]  # and not E008 too: the settings come first
    body = _message()
    headers = {"X-Signature": sign(body, "d-8", SECRET), "X-Delivery-Id": "d-8"}
    coded(call(view, body, headers), 503, "webhook.unconfigured")
    custom = InboundWebhook.as_view(agent=echo, secret_setting="DA_TEST_WEBHOOK_SECRET")
    settings.DA_TEST_WEBHOOK_SECRET = SECRET
    coded(call(custom, body, headers), 503, "webhook.agent_unavailable")
    nothing_recorded()


def test_a_missing_or_short_secret_is_a_check_error_and_deliveries_get_a_503(settings):
    """Issue 44, item 6: building the view never raises over its secret (urls.py loads in
    every command, migrate included); the check says what to fix, the view answers 503."""
    reverse("inbound-webhook")  # the URLconf's own view, built with the tests' secret
    settings.DURABLE_AGENTS = {
        k: v for k, v in settings.DURABLE_AGENTS.items() if k != "WEBHOOK_SECRET"
    }
    view = InboundWebhook.as_view(agent="echo")
    [missing] = [m for m in run_checks() if m.id == "durable_agents.E008"]
    assert "set DURABLE_AGENTS['WEBHOOK_SECRET']" in missing.msg
    assert "/webhooks/inbound/ answers 503" in missing.msg
    body = _message()
    headers = {"X-Signature": sign(body, "d-7", SECRET), "X-Delivery-Id": "d-7"}
    coded(call(view, body, headers), 503, "webhook.unconfigured")
    custom = InboundWebhook.as_view(agent="echo", secret_setting="SHOP_WEBHOOK_SECRET")
    coded(call(custom, body, headers), 503, "webhook.unconfigured")
    settings.SHOP_WEBHOOK_SECRET = "short"
    coded(call(custom, body, headers), 503, "webhook.unconfigured")
    nothing_recorded()
    # While migrate runs (checks given a database), the same is a warning: it migrates.
    [warned] = [m for m in run_checks(databases=["default"]) if "WEBHOOK_SECRET" in m.msg]
    assert warned.id == "durable_agents.W008" and not warned.is_serious()


def test_migrate_runs_without_the_webhook_secret():
    """Before, a missing secret raised from urls.py: a 49-line traceback, nothing migrated."""
    import subprocess
    import sys

    from tests.support.procs import ROOT, subprocess_env

    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.support.no_secret_settings")
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "durable_agents.W008" in done.stderr
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode != 0 and "Traceback" not in checked.stderr
    assert "(durable_agents.E008)" in checked.stderr, checked.stderr


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("too-short", "is too short"),
        ([SECRET, "tiny"], "(entry 1) is too short"),
        ([], "must be a secret string"),
        (12345, "must be a secret string"),
    ],
)
def test_a_bad_secret_setting_is_a_system_check_error(value, problem):
    raw = {"AGENTS": ["tests.support.agents"], "DISPATCH": "inline", "WEBHOOK_SECRET": value}
    with override_settings(DURABLE_AGENTS=raw):
        found = [m for m in run_checks() if m.id.startswith("durable_agents.")]
    assert [m.id for m in found] == ["durable_agents.E008"], found
    assert "WEBHOOK_SECRET" in found[0].msg and problem in found[0].msg


# -- configuration ----------------------------------------------------------------------


def test_rotation_accepts_any_listed_secret(settings):
    settings.SHOP_WEBHOOK_SECRET = ["the-new-secret-the-sender-moves-to-now", OLD_SECRET]
    view = InboundWebhook.as_view(agent="echo", secret_setting="SHOP_WEBHOOK_SECRET")
    body = _message(session="s-rot")

    def headers(delivery_id: str, signature: str) -> dict[str, str]:
        return {"X-Delivery-Id": delivery_id, "X-Signature": signature}

    assert call(view, body, headers("d-old", sign(body, "d-old", OLD_SECRET))).status_code in (
        200,
        202,
    )
    # A sender mid-rotation signs with both (two v1 values); either matching is enough.
    t = int(time.time())
    new = sign(body, "d-both", "the-new-secret-the-sender-moves-to-now", t)
    stale_secret = sign(body, "d-both", "z" * 40, t)
    both = f"{stale_secret},v1={new.split('v1=')[1]}"
    assert call(view, body, headers("d-both", both)).status_code in (200, 202)
    refused = call(view, body, headers("d-gone", sign(body, "d-gone", SECRET)))
    coded(refused, 401, "webhook.bad_signature")
    assert turns("s-rot") == ["s-rot>event/d-both", "s-rot>event/d-old"]


def test_a_tolerance_of_its_own():
    view = InboundWebhook.as_view(agent="echo", tolerance=30)
    body = _message(session="s-tol")
    late = sign(body, "d-1", SECRET, int(time.time()) - 60)
    coded(call(view, body, {"X-Delivery-Id": "d-1", "X-Signature": late}), 401, "webhook.stale")
    nothing_recorded()


def _chat_body(channel: str = "C42", event: str = "Ev1", text: str = "Order 7?") -> bytes:
    return json.dumps(
        {"event_id": event, "event": {"channel": channel, "text": text, "user": "U1"}}
    ).encode()


def test_custom_extractors_as_view_keywords():
    view = InboundWebhook.as_view(
        agent="echo",
        delivery_id=lambda request: json.loads(request.body)["event_id"],
        session_key=lambda request, payload: f"chat-{payload['event']['channel']}",
        text=lambda request, payload: payload["event"]["text"],
    )
    body = _chat_body()
    response = call(view, body, {"X-Signature": sign(body, "Ev1", SECRET)})
    assert response.status_code in (200, 202), response.content
    assert data(response)["run_id"] == "chat-C42>event/Ev1"
    # What a hook cannot find is the sender's mistake: a coded 400, nothing recorded.
    odd = json.dumps({"event_id": "Ev2", "event": {"text": "hi"}}).encode()
    coded(call(view, odd, {"X-Signature": sign(odd, "Ev2", SECRET)}), 400, "webhook.bad_body")
    no_id = b'{"event": {}}'
    coded(
        call(view, no_id, {"X-Signature": sign(no_id, "x", SECRET)}),
        400,
        "webhook.bad_delivery_id",
    )
    assert turns("chat-C42") == ["chat-C42>event/Ev1"]
    assert turns("chat-None") == []


class ChatWebhook(InboundWebhook):
    """A subclass with the platform's own headers and body shape."""

    agent = "echo"

    def delivery_id(self, request):
        return request.headers.get("X-Chat-Event", "")

    def session_key(self, request, payload):
        return f"chat-{payload['event']['channel']}"

    def text(self, request, payload):
        return payload["event"]["text"]


def test_custom_extractors_in_a_subclass():
    view = ChatWebhook.as_view()
    body = _chat_body(channel="D7", event="E-1")
    headers = {"X-Chat-Event": "E-1", "X-Signature": sign(body, "E-1", SECRET)}
    assert call(view, body, headers).status_code in (200, 202)
    assert data(call(view, body, headers))["status"] == "answered"  # the redelivery
    assert turns("chat-D7") == ["chat-D7>event/E-1"]


def test_the_senders_recipe_in_the_docs_signs_as_the_view_checks():
    """docs/sessions.md's Python recipe for senders, run as written, agrees with ``sign``."""
    from tests.support.procs import ROOT

    text = (ROOT / "docs" / "sessions.md").read_text()
    section = text[text.index("### Signing a delivery") :]
    recipe = re.search(r"```python\n(.*?)```", section, re.S)
    assert recipe, "docs/sessions.md lost the sender's recipe"
    body = _message(session="s-docs")
    namespace: dict[str, Any] = {"secret": SECRET, "delivery_id": "d-docs", "body": body}
    exec(compile(recipe.group(1), "docs/sessions.md", "exec"), namespace)  # the docs' code
    t = int(namespace["t"])
    assert namespace["headers"]["X-Signature"] == sign(body, "d-docs", SECRET, t)
    assert deliver(body, "d-docs", signature=namespace["headers"]["X-Signature"]).status_code == 202


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("a" * 32, "has only 1 distinct character"),
        ("ab" * 20, "has only 2 distinct characters"),
        ("0123456789" * 4, "repeats a pattern of 10 characters"),
        ("changeme-" * 4, "repeats a pattern of 9 characters"),
        ([SECRET, "x" * 64], "(entry 1) is too weak"),
    ],
)
def test_a_low_entropy_secret_is_refused_by_the_check_and_the_view(settings, value, problem):
    # The URLconf builds its view once, with the tests' secret: loaded before, not under this.
    reverse("inbound-webhook")
    raw = {"AGENTS": ["tests.support.agents"], "DISPATCH": "inline", "WEBHOOK_SECRET": value}
    with override_settings(DURABLE_AGENTS=raw):
        errors = [m for m in run_checks() if m.id == "durable_agents.E008"]
    assert [e.msg for e in errors if "WEBHOOK_SECRET" in e.msg and problem in e.msg], errors
    settings.SHOP_WEBHOOK_SECRET = value
    view = InboundWebhook.as_view(agent="echo", secret_setting="SHOP_WEBHOOK_SECRET")
    from durable_agents.webhooks import secret_problem

    weak = secret_problem(view)
    assert "too weak" in weak
    secret = value if isinstance(value, str) else value[1]
    assert secret not in weak  # never echoes the secret
    body = _message()
    headers = {"X-Signature": sign(body, "d-6", secret), "X-Delivery-Id": "d-6"}
    coded(call(view, body, headers), 503, "webhook.unconfigured")


def test_generated_secrets_are_never_refused(settings):
    """What the docs tell people to run, and the usual hex form, pass the rule every time
    (2,000 of each: a refusal is a chance below 1e-7 per secret by construction)."""
    for make in (
        lambda: secrets.token_urlsafe(32),
        lambda: secrets.token_hex(16),
        lambda: secrets.token_hex(32),
    ):
        for _ in range(2000):
            secret = make()
            assert parse_webhook_secrets(secret, "S") == ((secret,), []), secret
    settings.SHOP_WEBHOOK_SECRET = secrets.token_urlsafe(32)
    InboundWebhook.as_view(agent="echo", secret_setting="SHOP_WEBHOOK_SECRET")
    # Passphrases and the like pass too: the rule is about patterns, not about alphabets.
    for fine in (SECRET, OLD_SECRET, "correct horse battery staple 2024 !"):
        assert parse_webhook_secrets(fine, "S")[1] == [], fine
