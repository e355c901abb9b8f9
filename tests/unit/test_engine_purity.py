"""durable_agents.engine is plain Python: importing all of it pulls in no Django, Celery or
ninja (checked in a fresh interpreter, where nothing else imported them first)."""

import pkgutil
import subprocess
import sys

import durable_agents.engine


def test_engine_imports_no_framework():
    modules = [
        f"durable_agents.engine.{m.name}"
        for m in pkgutil.iter_modules(durable_agents.engine.__path__)
    ]
    assert len(modules) >= 5
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'celery', 'ninja', 'kombu'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"engine imported: {out.stdout}"
