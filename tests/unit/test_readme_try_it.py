"""The README's "Try it without an API key" block runs as written (issue 31): taken from
README.md itself, so the docs and this test cannot drift, and run with plain Python in a
fresh process with no Django settings, as a new user would run ``python try_it.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import durable_agents.providers as providers
import durable_agents.providers.scripted as scripted

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Try it without an API key"


def try_it_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section has one Python block"
    return blocks[0]


@pytest.mark.timeout(60)
def test_the_readme_block_runs_as_written(tmp_path: Path):
    script = tmp_path / "try_it.py"
    script.write_text(try_it_block(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env["PYTHONPATH"] = str(ROOT)  # the package under test, as if installed
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "Order 7 was delivered.",
        "2",
        "Order 7 was delivered.",
        "2",
    ]


def test_the_scripted_helpers_are_importable_from_providers():
    for name in ("ScriptedModel", "text", "call", "calls", "error"):
        assert getattr(providers, name) is getattr(scripted, name)
        assert name in providers.__all__
