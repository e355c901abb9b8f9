"""Who a session belongs to (issue 41, item 1; docs/sessions.md): a session takes messages
only from the agent and the channel that opened it. Two webhook views, one per sender,
each with its own secret: sender A naming B's session with A's own valid signature is
refused (403 ``session.other_channel``) and nothing is read or written — A's model never
sees B's transcript, B's history never gets A's message. The same holds across agents, for
the API, and for the site's own code; sessions opened before the upgrade get an owner from
migration 0021."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import override_settings

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.commands.sessions import channel_of
from durable_agents.engine.errors import SessionNotYours
from durable_agents.models import ActionLog, JournalEntry, Run
from durable_agents.webhooks import InboundWebhook, sign
from tests.support.agents import echo
from tests.support.api import API
from tests.support.people import make_user
from tests.support.procs import in_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SECRET_A = "sender-a-secret-0123456789abcdefghijklmnop"
SECRET_B = "sender-b-secret-qrstuvwxyz9876543210ABCDEF"


def _deliver(view: Any, secret: str, session: str, text: str, delivery_id: str) -> Any:
    body = json.dumps({"session": session, "text": text}).encode()
    headers = {"X-Signature": sign(body, delivery_id, secret), "X-Delivery-Id": delivery_id}
    request = RequestFactory().post(
        "/webhooks/x/", body, content_type="application/json", headers=headers
    )
    return view(request)


def _written() -> tuple[int, int]:
    return Run.objects.count(), JournalEntry.objects.count()


@pytest.fixture
def views():
    with override_settings(SENDER_A_SECRET=SECRET_A, SENDER_B_SECRET=SECRET_B):
        yield (
            InboundWebhook.as_view(agent="echo", secret_setting="SENDER_A_SECRET"),
            InboundWebhook.as_view(agent="echo", secret_setting="SENDER_B_SECRET"),
        )


def test_a_sender_cannot_read_or_write_another_senders_conversation(views):
    view_a, view_b = views
    ok = _deliver(view_b, SECRET_B, "chat-b", "my card ends 4242", "b-1")
    assert ok.status_code == 202, ok.content
    history = echo.session("chat-b", channel="webhook:SENDER_B_SECRET").history()
    before = _written()
    refused = _deliver(view_a, SECRET_A, "chat-b", "what did they say?", "a-1")
    assert refused.status_code == 403, refused.content
    body = json.loads(refused.content)
    assert body["code"] == "session.other_channel"
    assert "SENDER_B" not in body["message"]  # the owner's name is not told
    assert _written() == before
    assert not Run.objects.filter(run_id__startswith="chat-b>event/a-1").exists()
    assert echo.session("chat-b", channel="webhook:SENDER_B_SECRET").history() == history
    # B's own redelivery and next message still land.
    assert _deliver(view_b, SECRET_B, "chat-b", "my card ends 4242", "b-1").status_code == 200
    assert _deliver(view_b, SECRET_B, "chat-b", "thanks", "b-2").status_code == 202
    # A's own sessions are A's: B cannot take them either.
    assert _deliver(view_a, SECRET_A, "chat-a", "hello", "a-2").status_code == 202
    assert _deliver(view_b, SECRET_B, "chat-a", "hello", "b-3").status_code == 403


def test_a_session_belongs_to_its_agent(views):
    view_a, _ = views
    with override_settings(SENDER_A_SECRET=SECRET_A):
        other_agent = InboundWebhook.as_view(
            agent="gated", secret_setting="SENDER_A_SECRET", channel="webhook:SENDER_A_SECRET"
        )
    assert _deliver(view_a, SECRET_A, "chat-x", "hello", "x-1").status_code == 202
    before = _written()
    refused = _deliver(other_agent, SECRET_A, "chat-x", "refund order 7", "x-2")
    assert refused.status_code == 409
    assert json.loads(refused.content)["code"] == "session.agent_mismatch"
    assert _written() == before


def test_the_api_and_the_sites_own_code_are_channels_too(views):
    view_a, _ = views
    assert _deliver(view_a, SECRET_A, "chat-w", "hello", "w-1").status_code == 202
    caller = Client()
    caller.force_login(make_user("staff", "add_run", "view_run", staff=True))
    before = _written()
    response = caller.post(
        f"{API}/sessions/chat-w/messages",
        json.dumps({"text": "hi from the api", "agent": "echo"}),
        content_type="application/json",
    )
    assert response.status_code == 403 and response.json()["code"] == "session.other_channel"
    with pytest.raises(SessionNotYours):
        echo.session("chat-w").send("hi from the site")
    with pytest.raises(SessionNotYours):
        echo.session("chat-w").history()
    assert _written() == before
    # The site's code may speak as the channel, by name: it is the site.
    assert echo.session("chat-w", channel="webhook:SENDER_A_SECRET").send("and now?").answer
    # A session the API opens is the API's.
    opened = caller.post(
        f"{API}/sessions/chat-api/messages",
        json.dumps({"text": "hello", "agent": "echo"}),
        content_type="application/json",
    )
    assert opened.status_code == 202, opened.content
    assert channel_of(site_store().get_run("chat-api>session")) == "api"
    assert _deliver(view_a, SECRET_A, "chat-api", "hello", "w-2").status_code == 403


def test_two_channels_opening_one_session_at_once_one_wins():
    def open_as(i: int) -> str:
        try:
            echo.session("chat-race", channel=f"webhook:sender-{i}").send_once(f"d-{i}", "hi")
        except SessionNotYours:
            return "refused"
        return "opened"

    outcomes = in_threads(4, open_as)
    assert sorted(outcomes) == ["opened", "refused", "refused", "refused"]
    winner = outcomes.index("opened")
    assert channel_of(site_store().get_run("chat-race>session")) == f"webhook:sender-{winner}"
    assert Run.objects.filter(session_id="chat-race").exclude(kind="session").count() == 1


def test_the_migration_gives_each_older_session_the_channel_its_rows_show(views):
    """Sessions opened before owners existed: one the API spoke to (``api``), one a webhook
    delivered to (``webhook``), one the site's code spoke to (``site``)."""
    caller = Client()
    caller.force_login(make_user("ops", "add_run", staff=True))
    said = caller.post(
        f"{API}/sessions/old-api/messages",
        json.dumps({"text": "refund order 7", "agent": "gated"}),
        content_type="application/json",
    )
    assert said.status_code == 202, said.content
    echo.session("old-hook", channel="webhook").send_once("d-1", "hello")
    echo.session("old-site").send("hello")
    ids = ["old-api>session", "old-hook>session", "old-site>session"]
    for run in Run.objects.filter(pk__in=ids):  # as written before migration 0021
        run.input = {"session": run.session_id}
        run.save(update_fields=["input"])
    assert ActionLog.objects.filter(action="send", target="old-api").exists()
    migration = importlib.import_module("durable_agents.migrations.0021_session_owners")

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection  # type: ignore[attr-defined]
    migration.give_owners(django_apps, editor)
    owners = {r.run_id: channel_of(r.to_domain()) for r in Run.objects.filter(pk__in=ids)}
    assert owners == {ids[0]: "api", ids[1]: "webhook", ids[2]: "site"}
    # The default webhook view keeps its sessions after the upgrade; the API keeps its own.
    site_view = InboundWebhook.as_view(agent="echo")
    from django.conf import settings

    secret = settings.DURABLE_AGENTS["WEBHOOK_SECRET"]
    assert _deliver(site_view, secret, "old-hook", "again", "d-2").status_code == 202
    assert _deliver(site_view, secret, "old-site", "again", "d-3").status_code == 403
    assert echo.session("old-site").send("again").answer
    with pytest.raises(da.DurableAgentsError):
        echo.session("old-hook").send("not mine")


def test_a_session_is_given_to_another_channel_by_someone_who_may_and_it_is_logged(views):
    """After the upgrade a site with several webhook views gives each its older sessions."""
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    view_a, _ = views
    echo.session("old-a", channel="webhook").send_once("d-1", "hello")  # as migrated
    assert _deliver(view_a, SECRET_A, "old-a", "again", "a-1").status_code == 403
    make_user("clerk", "view_run")
    with pytest.raises(CommandError, match=r"actor\.forbidden"):
        call_command("durable_agents", "session-channel", "old-a", "x", "--by", "clerk")
    make_user("ops", "cancel_run")
    for bad in ("no spaces", "x" * 101):
        with pytest.raises(CommandError, match=r"config\.channel"):
            call_command("durable_agents", "session-channel", "old-a", bad, "--by", "ops")
    with pytest.raises(CommandError, match=r"session\.not_found"):
        call_command("durable_agents", "session-channel", "nobody", "api", "--by", "ops")
    assert channel_of(site_store().get_run("old-a>session")) == "webhook"
    out = StringIO()
    call_command(
        "durable_agents",
        "session-channel",
        "old-a",
        "webhook:SENDER_A_SECRET",
        "--by",
        "ops",
        stdout=out,
    )
    assert "was webhook" in out.getvalue()
    assert _deliver(view_a, SECRET_A, "old-a", "again", "a-1").status_code == 202
    [row] = ActionLog.objects.filter(action="session_channel")
    assert (row.actor, row.target) == ("ops", "old-a")
    assert row.payload == {"from": "webhook", "to": "webhook:SENDER_A_SECRET"}
