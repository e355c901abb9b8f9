"""Issue 14, see what happened: the run page's timeline numbers records within the run,
styles internal records as such, keeps raw JSON behind a toggle, and shows halts, their
resolution and a fenced-out driver's late result as entries of their own."""

from __future__ import annotations

import html
import re
import time

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.journal import Journal, header
from durable_agents.engine.ports import RunInfo
from durable_agents.models import JournalEntry
from tests.support.agents import echo, gated, halting
from tests.support.doubles import hooks_at_points
from tests.support.people import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _page(run_id: str) -> str:
    client = Client()
    root = User.objects.filter(username="root").first() or make_user("root", superuser=True)
    client.force_login(root)
    url = reverse("admin:durable_agents_run_change", args=[quote(run_id)])
    response = client.get(url)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def _journal_html(page: str) -> str:
    return page[page.index('class="da-timeline"') :]


def _entries(page: str) -> list[str]:
    return re.findall(r'<li class="da-entry.*?</li>', _journal_html(page), re.S)


def test_records_are_numbered_within_the_run_and_raw_json_is_behind_a_toggle():
    echo.start("where is order 7?", run_id="tl-a")
    echo.start("where is order 7?", run_id="tl-b")  # pushes tl-b's seqs past tl-a's
    page = _page("tl-b")
    numbers = re.findall(r'<span class="da-seq" title="journal seq (\d+)">(\d+)</span>', page)
    seqs = list(JournalEntry.objects.filter(run_id="tl-b").values_list("seq", flat=True))
    assert [int(n) for _, n in numbers] == list(range(1, len(seqs) + 1))
    assert [int(s) for s, _ in numbers] == seqs and seqs[0] > 1
    entries = _entries(page)
    assert all('<details class="da-raw"><summary>Raw record</summary>' in e for e in entries)
    # The journal header is internal, and says so.
    header = next(e for e in entries if "Journal opened" in e)
    assert "da-internal" in header and ">internal<" in header


def test_an_approval_shows_who_decided_without_a_raw_tally_block():
    root = make_user("ann", "approve_toolcall")
    with pytest.raises(da.ApprovalPending):
        gated.run("tl-gated", "refund order 7")
    da.approve("tl-gated", "call_1_1", True, by=root, edit={"order_id": "7", "cents": 250})
    approval = next(e for e in _entries(_page("tl-gated")) if "approved by ann" in e)
    visible = approval.split('<details class="da-raw">')[0]
    assert "tally" not in visible and "arguments edited by ann" in visible
    assert '"cents": 250' in visible  # what runs
    assert '"tally"' in approval.split('<details class="da-raw">')[1]  # behind the toggle


def test_a_fork_done_record_is_internal():
    echo.start("where is order 7?", run_id="tl-src")
    fork_id = da.fork("tl-src", from_step=1, new_run_id="tl-fork")
    done = next(e for e in _entries(_page(fork_id)) if "fork:done" in e)
    assert "da-internal" in done and "Fork completely copied" in done


def test_a_halt_and_its_resolution_are_entries_of_their_own():
    with pytest.raises(da.OutcomeUnknown):
        halting.run("tl-halt", "charge it")
    entries = _entries(_page("tl-halt"))
    titles = [re.search(r'<strong class="da-title">(.*?)</strong>', e).group(1) for e in entries]
    claimed = titles.index("Attempt 1 of call call_1_1 claimed")
    # What the tool said, from the journal, then the halt.
    said = "Call call_1_1 (charge) could not tell whether its effect happened"
    assert titles[claimed + 1] == said
    assert "ToolOutcomeUnknown: the gateway timed out after the request was sent" in html.unescape(
        entries[claimed + 1]
    )
    assert titles[claimed + 2] == "Run halted: the outcome of call call_1_1 (charge) is unknown"
    halted = html.unescape(entries[claimed + 2])
    assert "da-halt" in halted and "the tool said it could not tell" in halted

    make_user("ops", "resolve_halt")
    with override_settings(DURABLE_AGENTS={**settings.DURABLE_AGENTS, "HALT_MIN_AGE": 0}):
        da.resolve_halt("tl-halt", "call_1_1", {"charged": True}, by="ops")
    entries = _entries(_page("tl-halt"))
    titles = [re.search(r'<strong class="da-title">(.*?)</strong>', e).group(1) for e in entries]
    resolved = titles.index("Halt on call call_1_1 (charge) resolved by ops; the run continues")
    assert titles.index("Run halted: the outcome of call call_1_1 (charge) is unknown") < resolved
    assert titles[-1] == "Run finished"


def test_a_late_result_is_shown_as_a_takeover():
    echo.start("where is order 7?", run_id="tl-late")
    Journal(DjangoStore()).write(
        "tl-late",
        names.late("call_1_1", 1),
        {
            "kind": "late",
            "call_id": "call_1_1",
            "tool": "lookup",
            "outcome": "ok",
            "result": {"status": "shipped"},
            "attempt": 1,
            "holder": "worker-a:42",
        },
    )
    late = next(e for e in _entries(_page("tl-late")) if "@late/" in e)
    assert "da-takeover" in late
    assert "settled after its driver lost the run to another" in late
    assert "driver worker-a:42" in late


def test_a_takeover_of_an_expired_lease_is_an_entry_of_its_own():
    """A driver died holding the run: the next driver journals that it took the run over."""
    store = DjangoStore()
    store.create_run(RunInfo("tl-take", agent=echo.name))
    store.insert("tl-take", *header())
    assert store.acquire_lease("tl-take", "worker-dead@host:41", "dead-token", 0.2)
    deadline = time.monotonic() + 10
    while store.get_lease("tl-take").live and time.monotonic() < deadline:
        time.sleep(0.05)
    echo.run("tl-take", "where is order 7?")
    [takeover] = [e for e in _entries(_page("tl-take")) if "took the run over" in e]
    assert "from worker-dead@host:41" in takeover and "its lease had expired" in takeover
    assert "da-takeover" in takeover and "da-internal" not in takeover


def test_a_quorum_vote_that_approved_other_arguments_shows_as_not_counted(monkeypatch):
    """Two approvers of group finance at the same moment: alice as asked, bob with an
    edit. Both are recorded; bob's counts for nothing, alice's alone is no quorum, so the
    call is denied. The timeline says whose vote did not count and why."""
    from tests.support.agents import quorum

    alice = make_user("alice", "approve_toolcall", groups=("finance",))
    bob = make_user("bob", "approve_toolcall", groups=("finance",))
    with pytest.raises(da.ApprovalPending):
        quorum.run("tl-quorum", "pay invoice inv-1")
    store = DjangoStore()
    hooks_at_points(monkeypatch)(  # past bob's checks, before his vote is saved
        "before-decision:call_1_1", lambda: da.approve("tl-quorum", "call_1_1", True, by=alice)
    )
    edit = {"invoice": "inv-1", "cents": 100}
    out = da.approve("tl-quorum", "call_1_1", True, by=bob, edit=edit)
    assert out.status == "denied" and out.tally["disagreed_by"] == ["bob"]
    assert Journal(store).get("tl-quorum", "tool:call_1_1").get("result")["error"] == "denied"
    decision = next(e for e in _entries(_page("tl-quorum")) if "approved by alice" in e)
    visible = decision.split('<details class="da-raw">')[0]
    assert "not counted (approved other arguments) bob" in visible


def test_a_handed_off_call_and_its_progress_notes_have_entries_of_their_own():
    from durable_agents.engine.handles import handle_body, progress_body

    echo.start("where is order 7?", run_id="tl-task")
    journal = Journal(DjangoStore())
    task = {"kind": "mcp-task", "task_id": "t-42", "server": "ledger"}
    journal.write(
        "tl-task", names.handle("call_1_1"), handle_body("call_1_1", "ledger__transfer", task)
    )
    note = progress_body("call_1_1", "ledger__transfer", {"progress": 3, "total": 10})
    journal.write("tl-task", names.progress("call_1_1", "ab", 1), note)
    entries = _entries(_page("tl-task"))
    handed = next(e for e in entries if "handle:call_1_1" in e)
    assert "handed off MCP task t-42 on server ledger" in handed
    progress = next(e for e in entries if "@progress/" in e)
    assert "da-internal" in progress and "in progress: 3 of 10" in progress
