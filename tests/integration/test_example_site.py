"""The example site is safe by default: run as a deployment would run it (``manage.py`` in
a subprocess, with the environment docker-compose.yml gives the web service)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.compose import compose_environment
from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(120)


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DA_", "DJANGO_", "DATABASE_URL", "WEBHOOK_SECRET"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "example_project.settings", **env},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )


def test_check_deploy_is_clean_under_the_compose_environment():
    env = compose_environment()
    assert env["DJANGO_DEBUG"] == "false"
    out = manage("check", "--deploy", "--fail-level", "WARNING", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_debug_is_off_unless_asked_for():
    env = compose_environment()
    del env["DJANGO_DEBUG"]
    show = "from django.conf import settings; print(settings.DEBUG, settings.SECURE_SSL_REDIRECT)"
    out = manage("shell", "-c", show, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].split() == ["False", "True"]


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "WEBHOOK_SECRET"])
def test_outside_debug_the_development_secrets_are_refused(missing):
    env = compose_environment()
    del env[missing]
    out = manage("check", **env)
    assert out.returncode != 0
    assert "ImproperlyConfigured" in out.stderr and missing in out.stderr
    assert "DJANGO_DEBUG=true" in out.stderr  # says how to run it locally instead
    # In debug (local development) the development values are fine.
    out = manage("check", **{**env, "DJANGO_DEBUG": "true"})
    assert out.returncode == 0, out.stderr
