"""Sensitive tool arguments (docs/audit.md): an export and an audit bundle show a salted
hash in place of each sensitive value (the bytes never hold it), the redacted bundle still
verifies with the standalone script in a Python without Django, and a redacted export is
refused on import."""

from __future__ import annotations

import json
import subprocess
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test.utils import override_settings
from django.utils import timezone

import durable_agents as da
from durable_agents.engine.errors import ConfigError, ProtocolError
from durable_agents.models import ApprovalRequest, ApproverKey
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from durable_agents.transfer import import_lines
from tests.integration.test_audit_bundle import _isolated, _sandbox, _script, _site_key
from tests.support.people import make_user
from tests.support.signing import keypair, signed_approval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CARD = "4111222233334444"


@da.tool(requires_approval=True, sensitive=["card_number"])
def charge(order_id: str, card_number: str, cents: int) -> dict:
    """Charge a card (staff approve first)."""
    return {"charged": cents, "receipt": f"card {card_number} charged"}


carded = da.Agent(
    "carded",
    ScriptedModel(
        [
            scripted.calls(
                scripted.call("charge", {"order_id": "7", "card_number": CARD, "cents": 500})
            ),
            scripted.text(f"charged {CARD}"),
        ]
    ),
    "Charge when asked.",
    [charge],
)


def _signed_run(run_id: str) -> None:
    carded.start("charge order 7", run_id=run_id)
    request = ApprovalRequest.objects.get(run_id=run_id)
    ops = make_user(f"ops-{run_id}", "approve_toolcall")
    private, public = keypair()
    ApproverKey.objects.create(user=ops, public_key=public, confirmed_at=timezone.now())
    signature = signed_approval(request, private, ops)
    da.approve(run_id, request.call_id, approved=True, by=ops, note="ok", signature=signature)


def _command(*args: str) -> str:
    out = StringIO()
    call_command("durable_agents", *args, stdout=out)
    return out.getvalue()


def test_a_sensitive_field_must_be_an_argument():
    with pytest.raises(ConfigError, match="card_numbr") as caught:

        @da.tool(sensitive=["card_numbr"])
        def pay(card_number: str) -> str:
            return "ok"

    assert caught.value.code == "config.tool_sensitive"
    with pytest.raises(ConfigError):
        da.tool(sensitive="card_number")(lambda card_number: card_number)
    assert charge.sensitive == ("card_number",)


def test_exports_and_bundles_hide_sensitive_values_and_still_verify(tmp_path):
    pem, public = _site_key()
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": pem}
    with override_settings(DURABLE_AGENTS=config):
        _signed_run("sv-1")
        _signed_run("sv-2")
        assert da.resume("sv-1").answer == f"charged {CARD}"  # the run itself holds it
        exported = _command("export", "sv-1")
        bundle_text = _command("bundle", "sv-1")
        other = json.loads(_command("bundle", "sv-2"))
    for text in (exported, bundle_text, json.dumps(other)):
        assert CARD not in text and CARD[-8:] not in text
    bundle = json.loads(bundle_text)
    assert bundle["redacted"] is True
    markers = {
        m for r in bundle["records"] for m in r["data"].split('"') if m.startswith("sensitive:")
    }
    others = {
        m for r in other["records"] for m in r["data"].split('"') if m.startswith("sensitive:")
    }
    assert markers and not markers & others  # equal values in two runs do not show equal
    assert any(r["redacted"] for r in bundle["records"])
    [decision] = bundle["decisions"]
    assert decision["arguments"]["card_number"].startswith("sensitive:")
    assert decision["signed_bytes"] and decision["approver_keys"]

    script, box = _script(tmp_path), _sandbox(tmp_path)
    run = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"

    def check(data: dict) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "bundle.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        return _isolated(box, run, str(path), public)

    good = check(bundle)
    assert good.returncode == 0, good.stdout + good.stderr
    forged = json.loads(bundle_text)
    redacted = next(r for r in forged["records"] if r["redacted"])
    redacted["digest"] = "0" * 64  # a digest that is not the record's breaks the chain
    assert "breaks the chain" in check(forged).stdout

    importer = make_user("sv-importer", "import_runs")
    with pytest.raises(ProtocolError) as refused:
        import_lines(exported.splitlines(), by=importer)
    assert refused.value.code == "export.redacted" and "cannot be imported" in str(refused.value)
    header = json.loads(exported.splitlines()[0])
    assert header["redacted"] is True
    unflagged = [json.dumps({k: v for k, v in header.items() if k != "redacted"})]
    with pytest.raises(ProtocolError, match="redacted"):  # a record line still says so
        import_lines(unflagged + exported.splitlines()[1:], by=importer)


def test_a_run_without_sensitive_values_exports_as_before():
    from tests.support.agents import echo

    echo.run("sv-plain", "what about order 7")
    exported = _command("export", "sv-plain")
    assert '"redacted"' not in exported and "sensitive:" not in exported


def test_the_salt_key_setting_moves_the_markers():
    from durable_agents.conf import parse
    from durable_agents.database.audit import redactor

    _signed_run("sv-key")

    def card_marker() -> str:
        hide = redactor("sv-key")
        return hide.redact("x", {"card_number": CARD})["card_number"]

    default = card_marker()
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SALT_KEY": "another secret"}
    with override_settings(DURABLE_AGENTS=config):
        assert card_marker() != default and card_marker().startswith("sensitive:")
    _, problems = parse({"AUDIT_SALT_KEY": ""})
    assert any("AUDIT_SALT_KEY" in p for p in problems)
