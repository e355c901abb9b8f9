"""The glue builds its stores in one place.

Read as source, no module of ``durable_agents`` calls ``DjangoStore(...)`` except
``database.factory.store_for`` (a store on a given alias) and ``database.store.site_store``
(the site's shared store). Tests, benchmarks and users may build their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_agents

ROOT = Path(durable_agents.__file__).parent
STORE_CLASS = "DjangoStore"
# (file relative to the package, the function that builds the store)
BUILDERS = {
    ("database/factory.py", "store_for"),
    ("database/store.py", "site_store"),
}


def _constructions(source: str, filename: str) -> list[tuple[int, str]]:
    """Each ``DjangoStore(...)`` call in ``source``: its line and its enclosing function."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name == STORE_CLASS:
                    found.append((child.lineno, function))
            visit(child, inner)

    visit(ast.parse(source, filename), "<module>")
    return found


def _sites() -> list[tuple[str, int, str]]:
    sites = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for line, function in _constructions(path.read_text(), str(path)):
            sites.append((relative, line, function))
    return sites


def test_only_the_factory_builds_a_store():
    sites = _sites()
    stray = [f"{f}:{line} in {fn}()" for f, line, fn in sites if (f, fn) not in BUILDERS]
    assert not stray, f"build stores with database.factory.store_for, not here: {stray}"
    # Both builders are still found: the scan would notice a construction if there were one.
    assert {(f, fn) for f, _, fn in sites} == BUILDERS


def test_the_scan_sees_every_spelling():
    source = (
        "from durable_agents.database import store\n"
        "x = DjangoStore()\n"
        "def f():\n"
        "    return store.DjangoStore('default')\n"
        "class C:\n"
        "    async def g(self):\n"
        "        return [DjangoStore(using=u) for u in 'ab']\n"
    )
    assert _constructions(source, "example.py") == [(2, "<module>"), (4, "f"), (7, "g")]
