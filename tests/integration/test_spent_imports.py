"""One signed decision, one firing (issue 41, item 2): an operator's own export of an approved
run, trimmed right after its ``approval:`` record with the chain recomputed, imported
``--live`` after the run was deleted in the admin or pruned, must be refused — else the
resumed run fires its gated tool again. A live import also refuses a file carrying a
decision this site spent, even where the run's id were free again. And ``import`` checks
every id in the file as a start would (item 7): a coded refusal, nothing written. Effects
are counted outside the journal (``count_effects``)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

import durable_agents as da
from durable_agents.engine.errors import DurableAgentsError
from durable_agents.models import (
    ActionLog,
    ApprovalRequest,
    Decision,
    JournalEntry,
    Run,
    RunImport,
    SpentDecision,
    SpentRunId,
)
from durable_agents.people_keys import register_approver_key
from durable_agents.transfer import import_bytes
from tests.support.agents import count_effects, gated
from tests.support.forging import rehashed, signed_approval_held
from tests.support.people import make_user
from tests.support.pruning import PRUNER, age, cutoff
from tests.support.signing import keypair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

IMPORTER = "importer"


@pytest.fixture(autouse=True)
def _people(db):
    make_user(IMPORTER, "import_runs")
    make_user(PRUNER, "delete_run")


def _signed_and_fired(run_id: str) -> str:
    """A gated run approved by a signed decision, driven: its refund fired once."""
    ops = make_user(f"ops-{run_id}", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    call_id = signed_approval_held(run_id, private, ops)
    assert gated.run(run_id, "refund order 7").answer == "refunded"
    assert count_effects(run_id) == {call_id: 1}
    return call_id


def _export(run_id: str) -> list[dict]:
    out = StringIO()
    call_command("durable_agents", "export", run_id, stdout=out)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def _trimmed_after_approval(lines: list[dict]) -> str:
    """The operator's attack: the journal cut right after the decision, the row unfinished
    again, every chain recomputed; the signed decision rows kept as they were."""
    records = [x for x in lines if x["type"] == "record"]
    cut = next(i for i, x in enumerate(records) if x["name"].startswith("approval:"))
    dropped = {id(x) for x in records[cut + 1 :]}
    kept = [x for x in lines if id(x) not in dropped]
    for item in kept:
        if item["type"] == "run":
            item["row"].update(status="queued", answer=None, finished_at=None, turns=1)
    return rehashed(kept)


def _import(text: str, *args: str) -> str:
    out = StringIO()
    call_command(
        "durable_agents", "import", "--by", IMPORTER, *args, "-", stdin=StringIO(text), stdout=out
    )
    return out.getvalue()


def _counts() -> tuple[int, ...]:
    models = (Run, JournalEntry, ApprovalRequest, Decision, ActionLog, RunImport)
    return tuple(m.objects.count() for m in models)


def _admin_delete(run_id: str) -> None:
    root = make_user(f"root-{run_id}", superuser=True)
    client = Client()
    client.force_login(root)
    url = reverse("admin:durable_agents_run_delete", args=[run_id])
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Run.objects.filter(pk=run_id).exists()


def _prune(run_id: str) -> None:
    age([run_id])
    call_command(
        "durable_agents",
        "prune",
        "--finished-before",
        cutoff(),
        "--by",
        PRUNER,
        stdout=StringIO(),
        stderr=StringIO(),
    )
    assert not Run.objects.filter(pk=run_id).exists()


@pytest.mark.parametrize(
    ("remove", "code"),
    [(_admin_delete, "run.spent"), (_prune, "run.pruned")],
    ids=["deleted", "pruned"],
)
def test_a_signed_decision_fires_once_whatever_the_operator_imports(remove, code):
    run_id = f"once-{code.split('.')[1]}"
    call_id = _signed_and_fired(run_id)
    trimmed = _trimmed_after_approval(_export(run_id))
    remove(run_id)
    assert SpentRunId.objects.get(pk=run_id).reason == code.split(".")[1].replace(
        "spent", "deleted"
    )
    assert SpentDecision.objects.filter(run_id=run_id, call_id=call_id).count() == 1
    before = _counts()
    for live in ("--live", None):  # not even as evidence: the id is spent
        with pytest.raises(CommandError, match=code.replace(".", r"\.")):
            _import(trimmed, *([live] if live else []))
        assert _counts() == before
    with pytest.raises(DurableAgentsError):
        da.resume(run_id)
    assert count_effects(run_id) == {call_id: 1}


def test_a_live_import_refuses_a_spent_decision_even_where_the_id_is_free_again():
    """Second line: the spent-id mark wiped by hand (an operator clearing tables), the file's
    decision is still known as spent here."""
    call_id = _signed_and_fired("once-wiped")
    trimmed = _trimmed_after_approval(_export("once-wiped"))
    _admin_delete("once-wiped")
    SpentRunId.objects.filter(pk="once-wiped").delete()
    before = _counts()
    with pytest.raises(CommandError, match=r"import\.decision_spent"):
        _import(trimmed, "--live")
    assert _counts() == before
    assert count_effects("once-wiped") == {call_id: 1}


@pytest.mark.parametrize(
    "bad",
    ["../../etc/passwd", "<b>x</b>", "a\nb", "x" * 500, "nul\x00id", "a//b", "a>.."],
    ids=["path", "markup", "newline", "long", "nul", "empty-part", "dot-part"],
)
def test_import_refuses_an_id_no_start_could_have_and_writes_nothing(bad):
    gated.start("refund order 7", run_id="odd-src")
    lines = _export("odd-src")
    Run.objects.filter(pk="odd-src").delete()  # as if exported by another site
    ActionLog.objects.filter(run_id="odd-src").delete()
    for item in lines:
        if item.get("run_id") == "odd-src":
            item["run_id"] = bad
        if item["type"] == "header":
            item["runs"] = [bad]
        item.pop("prev", None) if item["type"] == "action" else None
    text = rehashed([x for x in lines if x["type"] != "action"])
    before = _counts()
    with pytest.raises(DurableAgentsError) as refused:
        import_bytes(text.encode(), by=IMPORTER)
    assert refused.value.code == "config.run_id", refused.value
    assert _counts() == before


def test_an_inert_import_never_answers_a_webhook_delivery_for_its_turn():
    """An operator's file holding a finished turn at the id a delivery will use: the
    delivery is refused by name, never answered with the file's answer."""
    from tests.support.agents import echo

    echo.session("imp-chat").send_once("d-0", "warm up")  # another site's conversation
    echo.session("imp-src").send_once("d-1", "Where is order 7?")
    exported = _export("imp-src>event/d-1")
    for item in exported:
        if item.get("run_id") == "imp-src>event/d-1":
            item["run_id"] = "imp-chat>event/d-1"
        if item["type"] == "header":
            item["runs"] = ["imp-chat>event/d-1"]
        if item["type"] == "run":
            item["row"]["session_id"] = "imp-chat"
    text = rehashed([x for x in exported if x["type"] != "action"])
    import_bytes(text.encode(), by=IMPORTER)
    before = _counts()
    with pytest.raises(DurableAgentsError) as refused:
        echo.session("imp-chat").send_once("d-1", "Where is order 7?")
    assert refused.value.code == "run.imported"
    assert _counts()[0] == before[0]
