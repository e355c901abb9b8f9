"""The README's demo command tells the whole story on the embedded default (SQLite, inline
dispatch, no Redis), with every side effect exactly once; a second run starts clean."""

import os
import sqlite3
import subprocess
import sys

import pytest

from tests.support.procs import ROOT

pytestmark = pytest.mark.slow


def _demo(env):
    out = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "awaiting_approval" in text and "signal 9" in text
    assert "CRM notes 1, refunds 1, receipts 1" in text
    assert "I refunded order 7 in full" in text
    # The support agent asks staff which warehouse ships the replacement (an interrupt with
    # a schema): a wrong answer is refused, the right one finishes the run, one shipment.
    assert "awaiting_input" in text and "which warehouse ships the replacement?" in text
    assert "'PAR' is refused (interrupt.invalid_answer)" in text
    assert "A replacement for order 7 is on its way" in text
    assert "shipments 1, from HAM (exactly once)" in text
    # The refund policy (issue 42): one refund allowed by a rule, one escalated to on-call
    # and decided by a lead's deputy, one that expired, one refused by a rule.
    assert "allowed by rule small (amount_cents 1500 <= 5000), nobody asked" in text
    assert "step(s) escalate: on-call (oncall) may decide too" in text
    assert "her deputy dora decides for her: approved by dora for lena" in text
    assert "request expired" in text and "refused (approval.expired)" in text
    assert "refused by rule too-big, nobody asked" in text
    assert "refunds made by the desk: 2" in text
    # The stock desk's tools are an MCP server's: its gated reservation, approved, made once.
    assert "The stock desk's tools come from an MCP server" in text
    assert "reservations made by the server: 1 (exactly once" in text


def _rows(db):
    with sqlite3.connect(db) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM durable_agents_{table}").fetchone()[0]
            for table in ("run", "journalentry", "actionlog", "approvalrequest")
        }


@pytest.mark.timeout(240)
def test_demo_runs_end_to_end_and_again_from_a_clean_slate(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DA_", "DATABASE_URL"))}
    env.update(  # as ./scripts/demo sets it up
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DURABLE_AGENTS_DEMO_DIR=str(tmp_path),
        DJANGO_DEBUG="true",
    )
    _demo(env)
    db = tmp_path / "db.sqlite3"
    first = _rows(db)
    # Approvals: the refund desk's three requests and the stock desk's reservation.
    assert first["run"] >= 7 and first["approvalrequest"] == 4
    _demo(env)  # the admin shows one story, not two
    assert _rows(db) == first
