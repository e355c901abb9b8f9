"""Queue health (issue 17): runs queued for several recovery intervals with no driver show
as a warning on the admin index, in ``manage.py durable_agents runs`` and as the system
check ``durable_agents.W003``, naming the queue nobody seems to consume. One query function
(``queue_health.stalled_runs``) feeds all three."""

from __future__ import annotations

import html
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from durable_agents.celery.queue_health import STALLED_AFTER_INTERVALS, stalled_runs
from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo
from durable_agents.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

QUEUE = "orders-queue"
WARNING = "queued for more than"


@pytest.fixture
def celery_settings():
    # Dispatch through Celery to a named queue; nothing is sent in these tests.
    with override_settings(
        DURABLE_AGENTS={**settings.DURABLE_AGENTS, "DISPATCH": "celery", "CELERY_QUEUE": QUEUE}
    ):
        yield


def _run(run_id: str, status: str = "queued", age: float = 0.0) -> None:
    store = DjangoStore()
    store.create_run(RunInfo(run_id=run_id, agent="echo", input="hi"))
    if status != "queued":
        store.update_run(run_id, {"status": status})
    Run.objects.filter(run_id=run_id).update(updated_at=Now() - timedelta(seconds=age))


@pytest.fixture
def stalled(celery_settings):
    """One stalled run among runs that are not: fresh, driven, or not queued."""
    old = STALLED_AFTER_INTERVALS * 15 + 60  # the suite's RECOVERY_INTERVAL is 15 s
    _run("qh-stalled", age=old)
    _run("qh-fresh", age=5)
    _run("qh-driven", age=old)
    DjangoStore().acquire_lease("qh-driven", "worker-1", "tok", 30)
    _run("qh-running", status="running", age=old)
    _run("qh-paused", status="awaiting_approval", age=old)
    return "qh-stalled"


def test_one_query_finds_the_stalled_runs_and_says_why(stalled):
    with CaptureQueriesContext(connection) as queries:
        health = stalled_runs()
    assert len(queries) == 1
    assert health.stalled == 1 and [r for r, _ in health.oldest] == [stalled]
    text = health.message()
    assert "1 run(s) have been queued for more than 60s with no driver" in text
    assert f"no Celery worker is consuming the queue {QUEUE!r}" in text
    assert f"worker -Q {QUEUE}" in text and stalled in text


def test_the_oldest_are_named_and_the_rest_counted(celery_settings):
    for i in range(4):
        _run(f"qh-many-{i}", age=600 - i)
    health = stalled_runs(limit=2)
    assert health.stalled == 4
    assert [r for r, _ in health.oldest] == ["qh-many-0", "qh-many-1"]
    assert "and 2 more" in health.message()


def test_a_healthy_queue_says_nothing(celery_settings):
    _run("qh-fresh", age=5)
    assert not stalled_runs()
    assert [m for m in run_checks(databases=["default"]) if m.id == "durable_agents.W003"] == []
    err = StringIO()
    call_command("durable_agents", "runs", stdout=StringIO(), stderr=err)
    assert err.getvalue() == ""
    root = User.objects.create_user("root", is_staff=True, is_superuser=True)
    assert WARNING not in _index(root)


def test_inline_dispatch_names_its_own_cause():
    _run("qh-inline", age=3600)
    assert "DISPATCH is 'inline'" in stalled_runs().message()


# -- the three surfaces ---------------------------------------------------------------------


def test_the_system_check_warns_with_a_stable_id(stalled):
    [warning] = [m for m in run_checks(databases=["default"]) if m.id.startswith("durable_")]
    assert warning.id == "durable_agents.W003"
    assert stalled in warning.msg and f"queue {QUEUE!r}" in warning.msg
    assert "durable_agents runs --stalled" in warning.hint
    # Without database checks (runserver, plain `check`), it does not query.
    assert [m for m in run_checks() if m.id == "durable_agents.W003"] == []


def test_the_runs_command_warns_and_lists_the_stalled_runs(stalled):
    out, err = StringIO(), StringIO()
    call_command("durable_agents", "runs", stdout=out, stderr=err)
    assert err.getvalue().startswith("warning: 1 run(s) have been queued")
    assert f"queue {QUEUE!r}" in err.getvalue()
    assert "qh-fresh" in out.getvalue() and stalled in out.getvalue()
    out, err = StringIO(), StringIO()
    call_command("durable_agents", "runs", "--stalled", stdout=out, stderr=err)
    assert out.getvalue().split()[0] == stalled and "qh-fresh" not in out.getvalue()
    out = StringIO()
    call_command("durable_agents", "runs", "--json", stdout=out, stderr=StringIO())
    assert out.getvalue().lstrip().startswith("[")  # the warning stays off the document


def _index(user: User) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_the_admin_index_warns_staff_who_see_runs(stalled):
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="durable_agents", codename="view_run")
    )
    page = _index(User.objects.get(pk=viewer.pk))
    assert page.count(WARNING) == 1, "once, however often the index asks about the app"
    assert "Durable agents: 1 run(s) have been queued" in page
    assert f"no Celery worker is consuming the queue {QUEUE!r}" in page and stalled in page
    # Staff who cannot see runs are not told about them; other admin pages stay quiet.
    assert WARNING not in _index(User.objects.create_user("other", is_staff=True))
    client = Client()
    client.force_login(viewer)
    changelist = client.get(reverse("admin:durable_agents_run_changelist"))
    assert WARNING not in changelist.content.decode()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_it_reads_sqlite_too():
    store = DjangoStore(using="sqlite")
    for run_id in ("qh-sqlite-old", "qh-sqlite-new"):
        store.create_run(RunInfo(run_id=run_id, agent="echo"))
    Run.objects.using("sqlite").filter(run_id="qh-sqlite-old").update(
        updated_at=Now() - timedelta(hours=1)
    )
    with override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "DATABASE": "sqlite"}):
        health = stalled_runs()
    assert [r for r, _ in health.oldest] == ["qh-sqlite-old"] and health.stalled == 1
