"""docker-compose.yml as this machine can run it (no Docker engine here): a service's
environment as compose expands it, and its command as a list of arguments, read from the file
so a test runs what the file says."""

from __future__ import annotations

import json
import re
import secrets
import shlex
from typing import Any

import yaml

from tests.support.procs import ROOT

_VAR = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def required_secrets() -> dict[str, str]:
    """What the operator must export (``${VAR:?…}``), made as docker-compose.yml says."""
    return {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "WEBHOOK_SECRET": secrets.token_urlsafe(32),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(32),
    }


def compose_environment(name: str = "web", given: dict[str, str] | None = None) -> dict[str, str]:
    """A service's environment from docker-compose.yml, as compose expands it when the
    operator set only the variables it requires (``${VAR:?…}``): the secrets."""
    given = required_secrets() if given is None else given
    env: dict[str, str] = {}
    for var_name, value in service(name)["environment"].items():
        if value is None:
            continue  # passed through from the shell if set (provider keys)

        def expand(match: re.Match[str]) -> str:
            var, kind, default = match.groups()
            if var in given:
                return given[var]
            assert kind == "-", f"{var} is required by docker-compose.yml; give it here"
            return default

        env[var_name] = _VAR.sub(expand, str(value))
    return env


def command(name: str) -> list[str]:
    """A service's command as its arguments (compose splits a string as a shell would)."""
    value = service(name)["command"]
    return list(value) if isinstance(value, list) else shlex.split(value)


def dockerfile_cmd() -> list[str]:
    """The Dockerfile's ``CMD``, in its exec (JSON) form."""
    [line] = [
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")
    ]
    return list(json.loads(line[len("CMD ") :]))
