"""The audit bundle and signed heads (docs/audit.md): a bundle of a real run, with a signed
decision, checked by the standalone script from the docs in a Python that cannot import
Django; and the same script failing a tampered bundle or another site's key."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings
from django.utils import timezone

import durable_agents as da
from durable_agents.models import ApprovalRequest, ApproverKey, Run
from tests.support.agents import gated
from tests.support.people import make_user
from tests.support.procs import ROOT
from tests.support.signing import keypair, signed_approval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _script(tmp_path: Path) -> Path:
    """The verification script exactly as docs/audit.md shows it."""
    doc = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    [code] = re.findall(r"### verify_bundle\.py\n\n```python\n(.*?)```", doc, re.S)
    path = tmp_path / "verify_bundle.py"
    path.write_text(code, encoding="utf-8")
    return path


def _sandbox(tmp_path: Path) -> Path:
    """A directory holding only cryptography and what it loads: no Django, no app."""
    import cryptography

    site = Path(cryptography.__file__).parent.parent
    box = tmp_path / "only-cryptography"
    box.mkdir()
    for name in ("cryptography", "cffi", "pycparser"):
        (box / name).symlink_to(site / name)
    for backend in site.glob("_cffi_backend*"):
        (box / backend.name).symlink_to(backend)
    return box


def _isolated(box: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -I -S`` (no site-packages, no environment, no current directory) with only
    ``box`` added to its path."""
    boot = f"import sys; sys.path.insert(0, {str(box)!r}); sys.argv = {['x', *args]!r}; " + code
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", boot],
        cwd=box,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _site_key() -> tuple[str, str]:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return pem, base64.b64encode(public).decode()


def _signed_run(run_id: str) -> None:
    """A gated run approved by a person who signed the decision with their own key."""
    gated.start("refund order 7", run_id=run_id)
    request = ApprovalRequest.objects.get(run_id=run_id)
    ops = make_user(f"ops-{run_id}", "approve_toolcall")
    private, public = keypair()
    ApproverKey.objects.create(user=ops, public_key=public, confirmed_at=timezone.now())
    signature = signed_approval(request, private, ops)
    da.approve(run_id, request.call_id, approved=True, by=ops, note="ok", signature=signature)


def _bundle(run_id: str) -> dict:
    out = StringIO()
    call_command("durable_agents", "bundle", run_id, stdout=out)
    return json.loads(out.getvalue())


def test_a_bundle_verifies_with_the_standalone_script_without_django(tmp_path):
    pem, public = _site_key()
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": pem}
    with override_settings(DURABLE_AGENTS=config):
        _signed_run("ab-1")
        bundle = _bundle("ab-1")
        out = StringIO()
        call_command("durable_agents", "export", "ab-1", stdout=out)
    [run_line] = [x for x in map(json.loads, out.getvalue().splitlines()) if x["type"] == "run"]
    assert run_line["public_key"] == public
    assert run_line["head_signature"] == bundle["head"]["signature"]  # Ed25519: deterministic
    assert bundle["format"] == "durable_agents.audit_bundle.v1"
    assert bundle["head"]["public_key"] == public and bundle["head"]["signature"]
    assert bundle["head"]["head"] == bundle["records"][-1]["hash"]
    [decision] = bundle["decisions"]
    assert decision["signature"] and decision["signed_bytes"] and decision["approver_keys"]
    assert bundle["actions"] and bundle["action_head"]

    script, box = _script(tmp_path), _sandbox(tmp_path)
    no_django = _isolated(box, "import django")
    assert no_django.returncode != 0 and "No module named 'django'" in no_django.stderr
    run = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"

    def check(data: dict, *key: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "bundle.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        return _isolated(box, run, str(path), *key)

    good = check(bundle, public)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "OK" in good.stdout

    forged = json.loads(json.dumps(bundle))
    forged["records"][3]["data"] = forged["records"][3]["data"].replace("}", ',"x":1}', 1)
    bad = check(forged, public)
    assert bad.returncode == 1 and "breaks the chain" in bad.stdout

    _, other = _site_key()
    assert "signature does not verify" in check(bundle, other).stdout

    cut = {**bundle, "records": bundle["records"][:-1]}
    assert "do not end at the head" in check(cut, public).stdout

    acted = json.loads(json.dumps(bundle))
    acted["actions"][0]["actor"] = "someone-else"
    assert "was changed" in check(acted, public).stdout

    unsigned = json.loads(json.dumps(bundle))
    unsigned["decisions"][0]["note"] = "edited"  # the signed bytes still say "ok"
    unsigned["decisions"][0]["signed_bytes"] = base64.b64encode(b"other bytes").decode()
    assert "is not signed by them" in check(unsigned, public).stdout


def test_without_a_key_the_head_is_unsigned_and_a_bad_key_is_refused(tmp_path):
    _signed_run("ab-2")
    head = _bundle("ab-2")["head"]
    assert head["signature"] is None and head["head"]
    config = {**django_settings.DURABLE_AGENTS, "AUDIT_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----"}
    with override_settings(DURABLE_AGENTS=config), pytest.raises(CommandError, match="audit_key"):
        _bundle("ab-2")
    with pytest.raises(CommandError, match=r"run\.not_found"):
        _bundle("ab-none")


def test_the_script_says_unverified_for_an_import_no_trusted_head_vouches_for(tmp_path):
    """An imported run's chain was hashed by whoever wrote the file: a bundle marked
    ``imported.trusted: false`` holds together and still proves nothing. The script says
    so and exits 1, whichever of the two marks it finds."""
    _signed_run("ab-imp")
    out = StringIO()
    call_command("durable_agents", "export", "ab-imp", stdout=out)  # unsigned: no site key
    Run.objects.filter(pk="ab-imp").delete()  # as if exported by another site: no spent id
    make_user("importer", "import_runs")
    call_command(
        "durable_agents", "import", "--by", "importer", "-", stdin=StringIO(out.getvalue()),
        stdout=StringIO(),
    )  # fmt: skip
    bundle = _bundle("ab-imp")
    assert bundle["imported"]["trusted"] is False and bundle["head"]["imported"]["trusted"] is False

    script, box = _script(tmp_path), _sandbox(tmp_path)
    run = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"

    def check(data: dict) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "bundle.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        return _isolated(box, run, str(path))

    for marked in (
        bundle,
        {**bundle, "imported": None},  # the head's own mark alone
        {**bundle, "head": {k: v for k, v in bundle["head"].items() if k != "imported"}},
    ):
        found = check(marked)
        assert found.returncode == 1, found.stdout + found.stderr
        assert "UNVERIFIED" in found.stdout and "OK" not in found.stdout
        assert "imported" in found.stdout
