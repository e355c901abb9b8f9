"""The admin and the API read runs through one reader, not around the engine.

Read as source, no module of ``durable_agents/admin`` or ``durable_agents/api`` imports —
at module level, inside a function or under ``TYPE_CHECKING`` alike — the journal's row
(``models.JournalEntry``), the journal's vocabulary (``engine.names``, ``engine.records``)
or the database glue's internals (any ``durable_agents.database`` module but ``reads``, the
query module the list pages call). They read through ``engine.views`` (typed read models
built by one decoder per record kind) and ``database.reads``.

The files not moved yet are listed below; the list only shrinks (a test holds that too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_agents

PACKAGE = "durable_agents"
ROOT = Path(durable_agents.__file__).parent
GLUE = ("admin", "api")

FORBIDDEN_MODULES = (f"{PACKAGE}.engine.names", f"{PACKAGE}.engine.records")
DATABASE = f"{PACKAGE}.database"
# The one door into the database glue for pages and endpoints.
READER = f"{PACKAGE}.database.reads"
FORBIDDEN_NAMES = {f"{PACKAGE}.models": {"JournalEntry"}}

# Files that still go around the reader. Remove a file once it reads through the reader;
# never add one.
NOT_MOVED_YET: set[str] = set()
# The list may only get shorter: 21 files when this test came in, none once the limits
# pages moved too.
NOT_MOVED_AT_MOST = 0


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _forbidden(target: str, imported: str | None) -> str | None:
    """Why importing ``imported`` from ``target`` (or ``target`` itself) goes around the reader."""
    whole = f"{target}.{imported}" if imported else target
    for module in FORBIDDEN_MODULES:
        if whole == module or whole.startswith(f"{module}."):
            return module
    if whole.startswith(f"{DATABASE}.") and not (whole == READER or whole.startswith(f"{READER}.")):
        return whole if imported is None or target == DATABASE else target
    if imported in FORBIDDEN_NAMES.get(target, ()):
        return whole
    return None


def _bypasses(path: Path, source: str | None = None) -> list[str]:
    """Every import in ``path`` that goes around the reader, as ``line: what``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                why = _forbidden(alias.name, None)
                if why:
                    found.append(f"{node.lineno}: {why}")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                why = _forbidden(target, alias.name)
                if why:
                    found.append(f"{node.lineno}: {why}")
    return found


def _glue_files() -> dict[str, Path]:
    return {
        str(p.relative_to(ROOT)): p for part in GLUE for p in sorted((ROOT / part).rglob("*.py"))
    }


def test_admin_and_api_read_through_the_reader():
    files = _glue_files()
    assert "api/runs.py" in files and "admin/timeline.py" in files
    bypassing = {
        rel: hits
        for rel, path in files.items()
        if (hits := _bypasses(path)) and rel not in NOT_MOVED_YET
    }
    assert bypassing == {}, (
        "read runs through durable_agents.engine.views and durable_agents.database.reads: "
        f"{bypassing}"
    )


def test_the_list_of_files_not_moved_only_shrinks():
    files = _glue_files()
    # A file that moved (or went away) leaves the list, so the list cannot hide a new bypass.
    stale = sorted(rel for rel in NOT_MOVED_YET if rel not in files or not _bypasses(files[rel]))
    assert stale == [], f"these read through the reader now; take them off NOT_MOVED_YET: {stale}"
    assert len(NOT_MOVED_YET) <= NOT_MOVED_AT_MOST


def test_the_check_sees_every_way_around_the_reader():
    """Each spelling of a bypass is caught; the reader and the engine's views are not."""
    probe = ROOT / "admin" / "probe.py"
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ..models import JournalEntry, Run\n"  # 2
        "from ..engine import names\n"  # 3
        "from ..engine.records import Record\n"  # 4
        "import durable_agents.engine.names\n"  # 5
        "from ..database.store import site_store\n"  # 6
        "from ..database import audit\n"  # 7
        "from durable_agents.models import JournalEntry as J\n"  # 8
        "if TYPE_CHECKING:\n"
        "    from ..engine.records import Record\n"  # 10
        "def f():\n"
        "    from ..database.events import sse_response\n"  # 12
        "from ..database.reads import run_view\n"
        "from ..database import reads\n"
        "from ..engine import views\n"
        "from ..engine.views import RunView\n"
    )
    lines = [int(hit.split(":")[0]) for hit in _bypasses(probe, source)]
    assert sorted(lines) == [2, 3, 4, 5, 6, 7, 8, 10, 12]


def test_the_timeline_describes_each_kind_the_engine_reads():
    """Every describer is keyed by a kind ``engine.views`` decodes (a misspelt kind would
    quietly show its records by name), and every kind of the run's story has one."""
    from durable_agents.admin.timeline import DESCRIBERS
    from durable_agents.engine.views import KINDS

    assert set(DESCRIBERS) <= KINDS
    # Kinds shown by name only: the rule log's, and the waits' and channels' bookkeeping.
    by_name = {"rule", "deadline", "wait", "input", "signal", "waited", "message", "ack"}
    assert KINDS - set(DESCRIBERS) == by_name | {"receiving", "other"}


def test_admin_and_api_spell_no_journal_name():
    """Nor do they spell a journal name themselves (``"@late/{call}/"``): the engine's
    views decode names, the same check the engine's own modules are held to."""
    from .test_engine_purity import _spelled_names

    spelled = [
        hit
        for rel, path in _glue_files().items()
        if rel not in NOT_MOVED_YET
        for hit in _spelled_names(path)
    ]
    assert spelled == []
