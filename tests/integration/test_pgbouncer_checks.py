"""``manage.py check`` says which takeover is in force behind PgBouncer in transaction
pooling mode (a real one, ``tests/support/pgbouncer.py``), and catches a pooler the settings
do not mention: ``durable_agents.I001``, ``W004``, ``E005``, ``E006`` (docs/pgbouncer.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from durable_agents import conf
from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.pgbouncer]


def check(*args: str, **env: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_behind_the_pooler_with_a_direct_alias_check_says_instant_takeover_is_in_force(
    pgbouncer,
):
    code, out = check("--database", "default", "--database", "direct", **pgbouncer.env(direct=True))
    assert code == 0, out
    assert "durable_agents.I001" in out, out
    assert "instant takeover and live events use the direct connection" in out, out
    assert "DIRECT_DATABASE 'direct'" in out and "prepared statements off" in out, out
    assert "durable_agents.W004" not in out and "durable_agents.E005" not in out, out


@pytest.mark.timeout(120)
def test_behind_the_pooler_without_a_direct_alias_check_warns_of_lease_expiry(pgbouncer):
    code, out = check("--database", "default", DA_LEASE_TTL="12", **pgbouncer.env(direct=False))
    assert code == 0, out
    assert "durable_agents.W004" in out, out
    assert "taken over only when their lease expires (LEASE_TTL = 12 s)" in out, out
    assert "live events poll" in out and "durable_agents.I001" not in out, out


@pytest.mark.timeout(120)
def test_a_pooler_the_settings_do_not_mention_is_caught(pgbouncer):
    env = pgbouncer.env(direct=False)
    env["DA_POOLING"] = "0"
    code, out = check("--database", "default", **env)
    assert code != 0, out
    assert "durable_agents.E005" in out, out
    assert "reaches PostgreSQL through a transaction pooler" in out, out
    assert "TRANSACTION_POOLING'] is off" in out, out


@pytest.mark.timeout(120)
def test_a_direct_alias_that_goes_through_the_pooler_too_is_caught(pgbouncer):
    env = pgbouncer.env(direct=True)
    env["DA_PG_DIRECT_PORT"] = str(pgbouncer.port)
    code, out = check("--database", "default", "--database", "direct", **env)
    assert code != 0, out
    assert "DURABLE_AGENTS['DIRECT_DATABASE'] 'direct' reaches PostgreSQL through" in out, out


@pytest.mark.timeout(120)
def test_a_direct_connection_is_never_taken_for_a_pooler():
    """No false alarm: the suite's own settings, on PostgreSQL itself, several times (the
    probe must not depend on luck)."""
    from durable_agents.checks import _pooled

    assert [_pooled("default") for _ in range(5)] == [False] * 5
    assert _pooled("sqlite") is False  # not probed: no pooler speaks SQLite


def test_psycopg_prepare_threshold_behind_the_pooler_is_an_error(settings, monkeypatch):
    from django.conf import settings as django_settings

    from durable_agents.checks import check_settings

    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "TRANSACTION_POOLING": True}
    # In place (and put back): overriding DATABASES itself is not supported by Django.
    options = django_settings.DATABASES["default"].setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "prepare_threshold", 5)
    found = {m.id: m.msg for m in check_settings()}
    assert "durable_agents.E006" in found and "durable_agents.W004" in found, found
    assert "sets prepare_threshold 5" in found["durable_agents.E006"]


@pytest.mark.parametrize(
    "direct,message",
    [
        ("nowhere", "'nowhere', which is not in DATABASES"),
        ("default", "the DATABASE alias itself"),
        ("sqlite", "not a PostgreSQL database"),
        (3, "must be the alias of a database in DATABASES"),
    ],
)
def test_a_wrong_direct_database_is_a_settings_error(direct, message):
    settings, problems = conf.parse({"TRANSACTION_POOLING": True, "DIRECT_DATABASE": direct})
    assert settings.direct_database is None
    assert any(message in p for p in problems), problems
    # Without it, the run falls back to lease expiry rather than lock on a wrong connection.
    assert not settings.use_instant_takeover


def test_the_pooler_turns_prepared_statements_and_driver_locks_off_unless_told():
    plain, _ = conf.parse({})
    assert plain.use_prepared and plain.use_instant_takeover
    pooled, _ = conf.parse({"TRANSACTION_POOLING": True})
    assert not pooled.use_prepared and not pooled.use_instant_takeover
    told, problems = conf.parse({"TRANSACTION_POOLING": True, "PREPARED_STATEMENTS": True})
    assert told.use_prepared and not problems  # PgBouncer >= 1.21, max_prepared_statements
    _, problems = conf.parse({"TRANSACTION_POOLING": "yes"})
    assert problems == ["DURABLE_AGENTS['TRANSACTION_POOLING'] must be True or False"]
