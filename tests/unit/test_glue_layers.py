"""The glue's layers: which part of ``durable_agents`` may import which.

Read as source, every import of the project's own modules — at module level, inside a
function and under ``TYPE_CHECKING`` alike — goes from a layer to itself or to a layer
below it, never across to another part of the same layer:

0. ``engine`` — plain Python (``test_engine_purity`` holds it to itself).
1. ``base`` — the top-level modules everything reads: settings, models, people,
   permissions, hints, signals, the agent loader, the OpenTelemetry wiring.
2. ``mcp``, ``providers`` — tools and models from outside.
3. ``database`` — the Store port on Django's database, and the queries the pages call.
4. ``notifications`` — the outbox, and the email and webhook deliveries.
5. ``celery`` — dispatch, the tasks, recovery and the worker's start.
6. ``services`` — top-level modules the edges call: export and import, people's keys,
   the inbound webhook view.
7. The edges, each on its own: ``admin``, ``api``, ``management``, and ``entry`` (the
   app config, the system checks, the Celery task module's old name).
8. ``templatetags`` — the admin's template tags.

The package root (``durable_agents/__init__.py``, the public API) imports only the engine,
``mcp`` and ``_moved``; any module may read it (``__version__``).

The imports that still go against the layers are listed below, each with its reason; the
list only shrinks (a test holds that too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_agents

PACKAGE = "durable_agents"
ROOT = Path(durable_agents.__file__).parent

BASE = {
    "_moved", "agent_loader", "conf", "hints", "models", "otel", "people", "permissions",
    "rule_state", "signals", "testing",
}  # fmt: skip
SERVICES = {"people_keys", "transfer", "webhooks"}
ENTRY = {"apps", "checks", "tasks"}
RANK = {
    "engine": 0,
    "base": 1,
    "mcp": 2,
    "providers": 2,
    "database": 3,
    "notifications": 4,
    "celery": 5,
    "services": 6,
    "admin": 7,
    "api": 7,
    "management": 7,
    "entry": 7,
    "templatetags": 8,
}
ROOT_MAY_IMPORT = {"engine", "mcp", "base"}

# (importing module, imported module) against the layers. Remove one once it is gone; never
# add one.
AGAINST_THE_LAYERS = {
    # The store writes the outbox's rows in the transaction of the fact they announce.
    ("database.store", "notifications.outbox"),
    # A prune exports the batch it deletes.
    ("database.retention", "transfer"),
    # An email and a webhook payload show a call's arguments as the admin does.
    ("notifications.email", "admin.readable"),
    ("notifications.payloads", "admin.readable"),
    # An outgoing webhook is signed by the scheme the inbound view checks (``webhooks``),
    # which belongs in a module of its own below both.
    ("notifications.webhook", "webhooks"),
    # The outbox hands a due delivery to the site's Celery app.
    ("notifications.outbox", "celery.site_app"),
    # The worker runs the system checks before it takes work.
    ("celery.worker_start", "checks"),
    # The keys page names the header the API reads a key from.
    ("admin.keys", "api.auth"),
}
# The list may only get shorter: 8 imports when this test came in.
AGAINST_AT_MOST = 8


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)  # relative to the package; "" is the root


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py")) if "migrations" not in p.parts}


def _layer(module: str) -> str:
    head = module.split(".")[0]
    if head in RANK and head not in ("base", "services", "entry"):
        return head
    for name, members in (("base", BASE), ("services", SERVICES), ("entry", ENTRY)):
        if head in members:
            return name
    raise AssertionError(f"durable_agents.{module} is in no layer: add it to one above")


def _imports(
    module: str, source: str, known: set[str], *, is_package: bool, typing_too: bool = True
) -> set[str]:
    """The project's modules ``source`` imports, anywhere in it, relative to the package;
    without ``typing_too``, not those under ``if TYPE_CHECKING:``."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(source, module or PACKAGE)
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if not typing_too and id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join([PACKAGE, package] if package else [PACKAGE])
                base = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            targets = [
                f"{target}.{alias.name}"
                if f"{target}.{alias.name}".removeprefix(f"{PACKAGE}.") in known
                else target
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == PACKAGE:
                found.add("")
            elif target.startswith(f"{PACKAGE}."):
                found.add(target.removeprefix(f"{PACKAGE}."))
    return found


def _imports_of(module: str, path: Path, known: set[str], *, typing_too: bool = True) -> set[str]:
    return _imports(
        module,
        path.read_text(),
        known,
        is_package=path.name == "__init__.py",
        typing_too=typing_too,
    )


def _against() -> set[tuple[str, str]]:
    modules = _modules()
    known = set(modules)
    against = set()
    for module, path in modules.items():
        if module == "" or _layer(module) == "engine":
            continue
        mine = _layer(module)
        for target in _imports_of(module, path, known):
            if target == "":
                continue  # the public API: anyone may read it
            theirs = _layer(target)
            if theirs != mine and RANK[theirs] >= RANK[mine]:
                against.add((module, target))
    return against


def test_the_root_imports_only_the_engine_mcp_and_moved():
    modules = _modules()
    layers = {_layer(t) for t in _imports_of("", modules[""], set(modules)) if t}
    assert layers <= ROOT_MAY_IMPORT


def test_every_import_goes_down_the_layers():
    found = _against()
    assert found - AGAINST_THE_LAYERS == set(), "imports against the layers"
    assert len(AGAINST_THE_LAYERS) <= AGAINST_AT_MOST


def test_the_list_of_imports_against_the_layers_only_shrinks():
    gone = AGAINST_THE_LAYERS - _against()
    assert not gone, f"gone already: remove {sorted(gone)} from AGAINST_THE_LAYERS"


def test_the_scan_sees_an_import_against_the_layers():
    source = (
        "from ..admin import readable\n"
        "def f():\n"
        "    import durable_agents.celery.tasks\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .. import transfer\n"
        "from . import store\n"
    )
    known = set(_modules())
    found = _imports("database.example", source, known, is_package=False)
    assert found == {"admin.readable", "celery.tasks", "transfer", "database.store"}
    running = _imports("database.example", source, known, is_package=False, typing_too=False)
    assert running == found - {"transfer"}


# Modules of the glue still on an import cycle (most through an import inside a function).
# Remove a module once it is on none; never add one.
ON_A_CYCLE = {
    # The store, the prune and the audit checks: the store prunes, the prune writes through
    # a store and verifies.
    "database.audit", "database.factory", "database.retention",
    "database.store", "database.tombstones", "notifications.outbox", "transfer",
    # Dispatch, the tasks and the notifications: a task delivers, a delivery is a task.
    "celery.dispatch", "celery.tasks", "notifications", "notifications.channels",
    "notifications.delivery", "notifications.email", "notifications.webhook", "webhooks",
}  # fmt: skip


def _on_a_cycle() -> set[str]:
    """The glue's modules that import themselves through others (Tarjan's components)."""
    modules = _modules()
    known = set(modules)
    edges = {
        # An import under TYPE_CHECKING never runs: it closes no cycle.
        m: {t for t in _imports_of(m, p, known, typing_too=False) if t in known and t != m}
        for m, p in modules.items()
        if not m.startswith("engine")
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in edges:
                continue  # the engine: it imports none of the glue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.update(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_new_module_is_on_an_import_cycle():
    assert _on_a_cycle() - ON_A_CYCLE == set()


def test_the_list_of_modules_on_a_cycle_only_shrinks():
    off = ON_A_CYCLE - _on_a_cycle()
    assert not off, f"on no cycle now: remove {sorted(off)} from ON_A_CYCLE"
