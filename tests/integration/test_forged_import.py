"""The forged import (a security finding): export an approved run, give it a new id, cut it
after the approval, name as approver someone who never saw the call, recompute the unkeyed
chain (or strip it), and import it. It must stay inert evidence: no drive runs the gated
tool (its side-effect counter, outside the journal, stays at 0), ``verify`` does not say ok,
``bundle`` does not vouch for it, and its action rows do not join the site's chain. A live
import of it is refused, writing nothing. A genuine signed export imports live and runs."""

from __future__ import annotations

import base64
import json
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings

import durable_agents as da
from durable_agents.engine.approvals import decision_bytes
from durable_agents.engine.audit import ACTION_NAME, action_content, chain_hash
from durable_agents.engine.commands import runs
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.errors import RunImported
from durable_agents.models import (
    ActionLog,
    ApprovalRequest,
    ApproverKey,
    Decision,
    Halt,
    JournalEntry,
    Run,
    RunImport,
)
from durable_agents.people_keys import register_approver_key
from tests.support.agents import count_effects, gated
from tests.support.forging import rehashed, signed_approval_held
from tests.support.people import make_user
from tests.support.signing import keypair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

IMPORTER = "importer"


@pytest.fixture(autouse=True)
def _people(db):
    make_user(IMPORTER, "import_runs")
    # Someone who may approve here, and never saw the call.
    make_user("mallory", "approve_toolcall")


def _site_key() -> str:
    private = Ed25519PrivateKey.generate()
    return private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def _export(run_id: str) -> str:
    out = StringIO()
    call_command("durable_agents", "export", run_id, stdout=out)
    return out.getvalue()


def _import(text: str, *args: str) -> str:
    out = StringIO()
    call_command(
        "durable_agents", "import", "--by", IMPORTER, *args, "-", stdin=StringIO(text), stdout=out
    )
    return out.getvalue()


def _counts() -> tuple[int, ...]:
    models = (Run, JournalEntry, ApprovalRequest, Decision, Halt, ActionLog, RunImport)
    return tuple(m.objects.count() for m in models)


def _approved_and_finished(run_id: str) -> str:
    gated.start("refund order 7", run_id=run_id)
    call_id = ApprovalRequest.objects.get(run_id=run_id).call_id
    da.approve(run_id, call_id, approved=True, by=make_user("ops", "approve_toolcall"), note="ok")
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert count_effects(run_id) == {call_id: 1}
    return call_id


def _renamed(text: str, old: str, new: str) -> str:
    """``old`` as a JSON string value renamed, also inside the records' JSON text."""
    return text.replace(f'"{old}"', f'"{new}"').replace(f'\\"{old}\\"', f'\\"{new}\\"')


def _retarget(text: str, new_id: str, change=lambda item: item) -> str:
    """The file with its run under ``new_id``, each line passed through ``change``; its
    action rows (whose hashes bind the run id) left out, the end line recounted."""
    lines = [json.loads(x) for x in text.splitlines()]
    old_id = lines[0]["runs"][0]
    out = []
    for item in lines:
        if item["type"] in ("action", "end"):
            continue
        item = change(dict(item))
        if item.get("run_id") == old_id:
            item["run_id"] = new_id
        if item["type"] == "header":
            item["runs"] = [new_id]
        out.append(item)
    out.append({"type": "end", "lines": len(out)})
    return "\n".join(json.dumps(x) for x in out) + "\n"


def _forge(text: str, new_id: str, *, strip: bool = False) -> str:
    """The attack, as a careful forger writes it: a new run id, the journal cut right after
    the approval, the approver renamed to mallory, the chain recomputed (its function is
    public and unkeyed) or stripped, the end line recounted."""
    lines = [json.loads(x) for x in text.splitlines()]
    old_id = lines[0]["runs"][0]
    records = [x for x in lines if x["type"] == "record"]
    cut = next(i for i, x in enumerate(records) if x["name"].startswith("approval:"))
    dropped = {id(x) for x in records[cut + 1 :]}
    out = []
    prev = None
    for item in lines:
        if id(item) in dropped or item["type"] == "end":
            continue
        item = json.loads(_renamed(json.dumps(item), "ops", "mallory"))
        if item.get("run_id") == old_id:
            item["run_id"] = new_id
        if item["type"] == "header":
            item["runs"] = [new_id]
        elif item["type"] == "run":
            item["row"].update(status="queued", answer=None, finished_at=None, turns=1)
            item.pop("head_signature", None), item.pop("public_key", None)
        elif item["type"] == "record":
            item["hash"] = None if strip else chain_hash(prev, item["name"], item["data"])
            prev = item["hash"]
        elif item["type"] == "action":
            item["actor_id"] = "999"
            item["hash"] = (
                None if strip else chain_hash(item["prev"], ACTION_NAME, action_content(item))
            )
        out.append(item)
    [run] = [x for x in out if x["type"] == "run"]
    run["head"] = prev
    out.append({"type": "end", "lines": len(out)})
    return "\n".join(json.dumps(x) for x in out) + "\n"


@pytest.mark.parametrize("strip", [False, True], ids=["rehashed", "stripped"])
def test_a_forged_import_fires_nothing_and_vouches_for_nothing(strip):
    # The effect counter outlives a test: each variant has run ids of its own.
    src, forged_id = f"fi-src-{int(strip)}", f"fi-forged-{int(strip)}"
    call_id = _approved_and_finished(src)
    forged = _forge(_export(src), forged_id, strip=strip)
    assert '"mallory"' in forged and '"ops"' not in forged and '\\"ops\\"' not in forged

    # Imported live: refused by name, and nothing is written.
    before = _counts()
    with pytest.raises(CommandError, match=r"import\.unverified_decision: .*'mallory'"):
        _import(forged, "--live")
    assert _counts() == before

    # Imported (inert, the default): evidence.
    assert "as inert evidence" in _import(forged)
    assert Run.objects.get(run_id=forged_id).imported == "inert"
    with pytest.raises(RunImported) as refused:
        da.resume(forged_id)
    assert refused.value.code == "run.imported"
    with pytest.raises(RunImported):
        gated.run(forged_id, "refund order 7")  # the drive's own lease is refused too
    assert runs.drive_quietly(forged_id) == runs.IMPORTED_OUTCOME  # a worker's drive
    assert forged_id not in recover(interval=0)
    assert forged_id not in [r.run_id for r in da.pending()]
    assert count_effects(forged_id) == {}, "the gated tool never fired for the forgery"
    assert count_effects(src) == {call_id: 1}

    # verify does not say ok: the chain holds together, but nobody trusted vouches for it.
    out = StringIO()
    with pytest.raises(CommandError, match="unverified"):
        call_command("durable_agents", "verify", forged_id, stdout=out)
    assert f"{forged_id}: unverified (imported; no trusted signed head)" in out.getvalue()

    # The forged action rows did not join the site's chain: the site logged one row, the
    # import, by whoever imported it; the file's rows are kept as evidence beside the run.
    [logged] = ActionLog.objects.filter(run_id=forged_id)
    assert (logged.actor, logged.action, logged.channel) == (IMPORTER, "import", "command")
    assert logged.payload["runs"] == [forged_id] and logged.payload["live"] is False
    assert len(logged.payload["digest"]) == 64
    assert not ActionLog.objects.filter(actor="mallory").exists()
    assert {a["actor"] for a in RunImport.objects.get(run_id=forged_id).actions} == {"mallory"}
    out = StringIO()
    with pytest.raises(CommandError):  # the imported run is unverified; the log is fine
        call_command("durable_agents", "verify", "--all", stdout=out)
    assert "action log: ok" in out.getvalue()

    # bundle does not sign the forged head as this site's, even with a signing key set.
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": _site_key()}
    with override_settings(DURABLE_AGENTS=config):
        out, err = StringIO(), StringIO()
        call_command("durable_agents", "bundle", forged_id, stdout=out, stderr=err)
        bundle = json.loads(out.getvalue())
        assert bundle["head"]["signature"] is None and bundle["head"]["public_key"] is None
        assert bundle["head"]["imported"]["trusted"] is False
        assert bundle["imported"]["trusted"] is False
        assert "no head signed by a trusted key" in err.getvalue()
        # Nor does an export of it (which would launder it into a signed file).
        [run_line] = [
            x for x in map(json.loads, _export(forged_id).splitlines()) if x["type"] == "run"
        ]
        assert "head_signature" not in run_line


def test_a_forgery_carrying_another_keys_signed_head_is_not_trusted():
    """A forger who signs the rehashed head with a key of their own: the signature verifies,
    but this site does not trust that key."""
    from durable_agents.engine.audit import head_message

    _approved_and_finished("fi-src2")
    lines = [json.loads(x) for x in _forge(_export("fi-src2"), "fi-signed").splitlines()]
    [run] = [x for x in lines if x["type"] == "run"]
    records = [x for x in lines if x["type"] == "record"]
    forger, public = keypair()
    run["head_signature"] = base64.b64encode(
        forger.sign(head_message("fi-signed", run["head"], len(records)))
    ).decode()
    run["public_key"] = public
    _import("\n".join(json.dumps(x) for x in lines))
    out = StringIO()
    with pytest.raises(CommandError, match="unverified"):
        call_command("durable_agents", "verify", "fi-signed", stdout=out)
    # Trusting that key (and only then) vouches for the chain: the setting is the decision.
    config = {**django_settings.DURABLE_AGENTS, "TRUSTED_AUDIT_KEYS": [public]}
    with override_settings(DURABLE_AGENTS=config):
        out = StringIO()
        call_command("durable_agents", "verify", "fi-signed", stdout=out)
        assert "fi-signed: ok" in out.getvalue()
    # Trusted chain or not, an inert import is never driven.
    with pytest.raises(RunImported):
        da.resume("fi-signed")
    assert count_effects("fi-signed") == {}


def _forget(run_id: str) -> None:
    Run.objects.filter(run_id=run_id).delete()
    ActionLog.objects.filter(run_id=run_id).delete()


def test_a_genuine_signed_export_imports_live_and_is_driven():
    ops = make_user("ops", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": _site_key()}
    with override_settings(DURABLE_AGENTS=config):
        call_id = signed_approval_held("gi-1", private, ops)
        text = _export("gi-1")
        _forget("gi-1")
        assert "imported 1 run(s) live" in _import(text, "--live")
        run = Run.objects.get(run_id="gi-1")
        assert run.imported == "live" and RunImport.objects.get(run_id="gi-1").live
        out = StringIO()
        call_command("durable_agents", "verify", "gi-1", stdout=out)
        assert "gi-1: ok" in out.getvalue()  # the site's own key signed the head
        assert gated.run("gi-1", "refund order 7").answer == "refunded"
        assert count_effects("gi-1") == {call_id: 1}
        # Driven here, it goes on verifying: the imported records still lead to the signed
        # head, and what came after is this site's own.
        out = StringIO()
        call_command("durable_agents", "verify", "gi-1", stdout=out)
        assert "gi-1: ok" in out.getvalue()
    [logged] = ActionLog.objects.filter(run_id="gi-1", action="import")
    assert logged.payload["live"] is True


def test_a_live_import_refuses_a_genuine_export_whose_signature_was_moved():
    """The same genuine file, with the decision's signature kept but the run given a new id
    (the signature binds the run id): refused live, nothing written."""
    ops = make_user("ops", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    signed_approval_held("gi-2", private, ops)
    text = _retarget(_export("gi-2"), "gi-2b")
    before = _counts()
    with pytest.raises(CommandError, match=r"import\.unverified_decision: .*'ops'.*signature"):
        _import(text, "--live")
    assert _counts() == before

    # An unsigned decision is refused live too, by name.
    def unsign(item: dict) -> dict:
        return {**item, "signature": None} if item["type"] == "decision" else item

    unsigned = _retarget(_export("gi-2"), "gi-2c", unsign)
    with pytest.raises(CommandError, match="carries no signature"):
        _import(unsigned, "--live")
    assert _counts() == before


def test_a_live_import_refuses_a_decision_signed_with_a_key_its_owner_never_confirmed():
    """The two findings together: a superuser holds a key pair, registers its public key in
    the approver's name (pending until she confirms it), and brings a file whose decision
    is signed with it as hers. A pending key verifies nothing, so the live import is refused
    and nothing is written."""
    ops = make_user("ops", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    signed_approval_held("gi-7", private, ops)
    text = _export("gi-7")
    _forget("gi-7")
    # This site as the superuser leaves it: the key is ops's only through his registration.
    ApproverKey.objects.filter(public_key=public).delete()
    root = make_user("root7", superuser=True)
    pending = register_approver_key(ops, public, by=root)
    assert pending.confirmed_at is None
    before = _counts()
    with pytest.raises(CommandError, match=r"import\.unverified_decision: .*'ops'"):
        _import(text, "--live")
    assert _counts() == before
    assert not Run.objects.filter(run_id="gi-7").exists()
    assert count_effects("gi-7") == {}


def test_a_live_import_refuses_a_journaled_decision_without_its_signed_rows():
    """The decision rows left out, the journal's own decision record kept: the record is
    what a drive reads, so it must be made by verified rows."""
    ops = make_user("ops", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    signed_approval_held("gi-3", private, ops)
    lines = [json.loads(x) for x in _export("gi-3").splitlines()]
    _forget("gi-3")
    without = [x for x in lines if x["type"] != "decision"]
    before = _counts()
    with pytest.raises(CommandError, match=r"decision 'approval:.*needs 1 verified approval"):
        _import(rehashed(without), "--live")
    assert _counts() == before
    # The whole file, untouched, imports live.
    _import(_export_text(lines), "--live")
    assert Run.objects.get(run_id="gi-3").imported == "live"


def _export_text(lines: list[dict]) -> str:
    return "\n".join(json.dumps(x) for x in lines) + "\n"


def test_a_live_import_verifies_a_decision_signed_under_the_exporting_sites_user_id():
    """On the exporting site the approver's user had another primary key: the signed bytes
    name that id (read from the file), the key is the one registered here to that name."""
    ops = make_user("ops", "approve_toolcall")
    private, public = keypair()
    register_approver_key(ops, public, by=ops)
    call_id = signed_approval_held("gi-4", private, ops)
    lines = [json.loads(x) for x in _export("gi-4").splitlines()]
    _forget("gi-4")
    there = "4242"  # ops's id on the exporting site
    start = next(x for x in lines if x["type"] == "record" and x["name"] == "run:start")
    request = next(x for x in lines if x["type"] == "approval_request")
    message = decision_bytes(
        incarnation=json.loads(start["data"]).get("incarnation") or "",
        run_id="gi-4",
        call_id=call_id,
        tool_name=request["tool_name"],
        arguments=request["arguments"],
        approver_id=there,
        approved=True,
        note="ok",
    )
    for item in lines:
        if item["type"] == "decision":
            item["signature"] = base64.b64encode(private.sign(message)).decode()
        elif item["type"] == "action" and item["actor"] == "ops":
            item["actor_id"] = there
        elif item["type"] == "record" and item["name"].startswith("approval:"):
            body = json.loads(item["data"])
            body["by_id"] = there
            item["data"] = json.dumps(body, sort_keys=True, separators=(",", ":"))
    _import(rehashed(lines), "--live")
    assert gated.run("gi-4", "refund order 7").answer == "refunded"
    assert count_effects("gi-4") == {call_id: 1}
    # Renamed to another approver of this site (with a key of her own), the same signature
    # is not hers: refused, whatever id the file claims she had.
    _forget("gi-4")
    _, hers = keypair()
    mallory = make_user("mallory2", "approve_toolcall")
    register_approver_key(mallory, hers, by=mallory)
    renamed = [json.loads(_renamed(json.dumps(x), "ops", "mallory2")) for x in lines]
    before = _counts()
    with pytest.raises(CommandError, match=r"import\.unverified_decision: .*'mallory2'"):
        _import(rehashed(renamed), "--live")
    assert _counts() == before
