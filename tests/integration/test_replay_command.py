"""``manage.py durable_agents replay RUN…``: a recorded run re-driven against today's code
from the command line (calling no model and no tool), exit status 1 when one diverges."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from durable_agents.models import JournalEntry
from tests.support.agents import count_effects, echo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _replay(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("durable_agents", "replay", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_an_unchanged_run_replays_identical_and_writes_nothing():
    echo.start("where is my order 7?", run_id="rc-1")
    echo.start("and order 8?", run_id="rc-2")
    records = JournalEntry.objects.count()
    code, out = _replay("rc-1", "rc-2", "--json")
    reports = json.loads(out)
    assert code == 0 and [r["identical"] for r in reports] == [True, True]
    assert JournalEntry.objects.count() == records
    assert count_effects("rc-1") == {} and count_effects("rc-2") == {}


def test_a_run_replayed_against_other_code_diverges_with_exit_status_1():
    echo.start("where is my order 7?", run_id="rc-3")
    code, out = _replay("rc-3", "--agent", "gated")
    assert code == 1
    assert "diverges at step 1" in out and "1 of 1 run(s) diverge" in out


def test_an_unknown_run_is_a_clear_error():
    code, out = _replay("rc-none")
    assert code == 1 and "run.not_found" in out
