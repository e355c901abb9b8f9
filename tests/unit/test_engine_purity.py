"""durable_agents.engine is plain Python, and its modules form layers.

* Importing all of it pulls in no Django, Celery or ninja (checked in a fresh interpreter,
  where nothing else imported them first).
* Read as source, every import of every engine module — at module level, inside functions
  and under ``TYPE_CHECKING`` alike — points at the standard library, a declared
  third-party dependency the engine may use, or another engine module; and engine modules
  import each other without a cycle, with ``agent`` the only module outside ``commands/``
  that imports a command.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import durable_agents.engine

ENGINE = "durable_agents.engine"
ENGINE_DIR = Path(durable_agents.engine.__file__).parent
PYPROJECT = ENGINE_DIR.parents[1] / "pyproject.toml"
# The declared dependencies the engine may import (by distribution name and import name);
# the others (Django, ninja, Celery, psycopg) are the glue's.
ENGINE_THIRD_PARTY = {"pydantic": "pydantic", "cryptography": "cryptography"}


def test_engine_imports_no_framework():
    modules = [
        m.name for m in pkgutil.walk_packages(durable_agents.engine.__path__, prefix=f"{ENGINE}.")
    ]
    assert f"{ENGINE}.commands.runs" in modules and len(modules) >= 20
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'celery', 'ninja', 'kombu', 'opentelemetry'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"engine imported: {out.stdout}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ENGINE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ENGINE, *parts])


def _engine_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ENGINE_DIR.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> list[str]:
    """Every module ``path`` imports, anywhere in it, as absolute dotted names."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            # ``from . import runtime`` / ``from .commands import runs`` import a module;
            # ``from .errors import ConfigError`` imports ``errors``.
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append(submodule if submodule in known else target)
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = _engine_modules()
    known = set(modules)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    declared = {
        dep.split(">")[0].split("<")[0].split("[")[0].split("=")[0].strip().lower()
        for dep in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    }
    allowed = {module for dist, module in ENGINE_THIRD_PARTY.items() if dist in declared}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    outside: list[str] = []
    for name, path in modules.items():
        for target in _imports(name, path, known):
            top = target.split(".")[0]
            if target == ENGINE or target.startswith(f"{ENGINE}."):
                if target in known:
                    edges[name].add(target)
                elif target != ENGINE:
                    outside.append(f"{name} imports {target}, which is no engine module")
            elif top in stdlib or top in allowed:
                continue
            else:
                outside.append(f"{name} imports {target}")
    return edges, outside


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the path around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_engine_modules_import_only_the_engine_stdlib_and_declared_dependencies():
    edges, outside = _graph()
    assert f"{ENGINE}.commands.runs" in edges and len(edges) >= 20
    assert outside == []


def test_engine_imports_have_no_cycle():
    edges, _ = _graph()
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(
        c.removeprefix(f"{ENGINE}.") for c in cycle
    )


def test_only_the_facade_sits_on_the_commands():
    edges, _ = _graph()
    commands = f"{ENGINE}.commands"
    above = sorted(
        name
        for name, targets in edges.items()
        if not (name == commands or name.startswith(f"{commands}."))
        and any(t == commands or t.startswith(f"{commands}.") for t in targets)
    )
    assert above == [f"{ENGINE}.agent"]


def test_the_checks_see_function_level_and_type_checking_imports(tmp_path):
    """The checks would catch the imports a newcomer does not see at the top of a file."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .agent import Agent\n"
        "def f():\n"
        "    from .commands import runs\n"
        "    import django\n"
    )
    fake = ENGINE_DIR / "loop.py"
    known = {f"{ENGINE}.agent", f"{ENGINE}.commands", f"{ENGINE}.commands.runs"}
    probe = tmp_path / "loop.py"
    probe.write_text(source)
    # Same package position as the real loop.py: relative imports resolve alike.
    found = _imports(_module_name(fake), probe, known)
    assert set(found) >= {f"{ENGINE}.agent", f"{ENGINE}.commands.runs", "django"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _spelled_names(path: Path) -> list[str]:
    """Journal names spelled as string literals (docstrings aside) in ``path``."""
    from durable_agents.engine import names

    whole = {names.HEADER, names.RUN_START, names.RUN_COMPLETE, names.RUN_CANCELLED}
    whole.add(names.FORK_DONE)  # not "fork": that is also an action and a record kind
    prefixes = (
        names.MODEL,
        names.TOOL,
        names.ATTEMPT,
        names.NOT_STARTED,
        names.APPROVAL,
        names.STEP,
        names.USER,
        names.SPEND,
        names.LATE,
        names.DRIFT,
        names.TURN,
        names.EVENT,
        names.ANSWER,
    )
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith(prefixes):
                found.append(f"{path.name}:{node.lineno}: f{head.value!r}...")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (node.value in whole or node.value in prefixes)
        ):
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


def test_journal_names_are_spelled_only_in_names():
    spelled = [
        hit
        for name, path in _engine_modules().items()
        if name != f"{ENGINE}.names"
        for hit in _spelled_names(path)
    ]
    assert spelled == []
