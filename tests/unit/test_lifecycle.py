"""The lifecycle table (``engine/lifecycle.py``): what it allows, and that docs/guarantees.md
shows it as the code has it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from durable_agents.engine import lifecycle, names, ports
from durable_agents.engine.ports import (
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_PENDING,
    APPROVAL_STATUSES,
    APPROVAL_WITHDRAWN,
    CANCELLED,
    COMPENSATED,
    COMPENSATING,
    FINISHED,
    QUEUED,
    RUNNING,
    STATUSES,
    TERMINAL_STATUSES,
    ApprovalRequestInfo,
    RunInfo,
)
from durable_agents.testing import InMemoryStore

DOCS = Path(__file__).resolve().parents[2] / "docs" / "guarantees.md"


def test_no_move_leaves_a_terminal_status_but_a_finished_sub_runs_rollback():
    for frm in TERMINAL_STATUSES:
        for to in STATUSES:
            if to == frm:
                continue
            assert lifecycle.allowed(frm, to) == (frm == FINISHED and to == COMPENSATING), (
                frm,
                to,
            )


def test_every_move_is_from_and_to_a_known_status_by_a_known_mover():
    for move in lifecycle.MOVES:
        assert move.to in STATUSES and move.from_ <= set(STATUSES) and move.by in lifecycle.MOVERS


def test_a_move_the_table_does_not_hold_is_never_written():
    store = InMemoryStore()
    store.create_run(RunInfo(run_id="r", status=CANCELLED))
    assert not lifecycle.hand_over(store, "r", lifecycle.PERSON)
    assert store.get_run("r").status == CANCELLED
    store.create_run(RunInfo(run_id="q", status=RUNNING))
    assert lifecycle.hand_over(store, "q", lifecycle.PERSON)
    assert store.get_run("q").status == QUEUED
    # narrowed to what the caller saw: it moved on since
    assert not lifecycle.hand_over(store, "q", lifecycle.SWEEP, only_from="awaiting_input")
    with pytest.raises(ValueError):
        lifecycle.froms(COMPENSATED, lifecycle.SWEEP)


def test_the_docs_show_the_table_the_code_has():
    text = DOCS.read_text()
    table = text[text.index("## A run's lifecycle") :]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    shown = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows]
    assert shown[: len(lifecycle.MOVES)] == [m.row() for m in lifecycle.MOVES]


# -- approval requests -------------------------------------------------------------------

PACKAGE = Path(lifecycle.__file__).resolve().parents[1]
# The stores define the setter; only the lifecycle calls it.
SETTER = "set_approval_status"


def _calls_of_the_setter(path: Path) -> list[int]:
    """Where ``path`` names the store's setter: a call, or a reference to call later (a
    store's ``def`` is no mention)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if (isinstance(node, ast.Attribute) and node.attr == SETTER)
        or (isinstance(node, ast.Name) and node.id == SETTER)
    ]


def test_only_the_lifecycle_moves_a_requests_status():
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _calls_of_the_setter(path))
    }
    assert found == {"engine/lifecycle.py": found.get("engine/lifecycle.py", [])}
    assert found["engine/lifecycle.py"], "the lifecycle itself calls the store's setter"


def test_every_request_move_is_from_and_to_a_known_status_by_a_known_mover():
    for move in lifecycle.APPROVAL_MOVES:
        assert move.to in APPROVAL_STATUSES
        assert move.from_ <= set(APPROVAL_STATUSES)
        assert move.by in lifecycle.MOVERS


def test_a_request_leaves_pending_once_and_is_pending_again_only_when_asked_again():
    for frm in APPROVAL_STATUSES:
        for to in APPROVAL_STATUSES:
            if frm == to:
                continue
            expected = frm == APPROVAL_PENDING or to == APPROVAL_PENDING
            if frm in (APPROVAL_APPROVED, APPROVAL_DENIED) and to == APPROVAL_WITHDRAWN:
                expected = True  # a decision found orphaned as it was recorded
            assert lifecycle.request_allowed(frm, to) == expected, (frm, to)
    # Asking again is a drive's; nothing but a drive makes a request pending.
    assert not lifecycle.request_allowed(APPROVAL_EXPIRED, APPROVAL_PENDING, lifecycle.PERSON)
    assert lifecycle.request_allowed(None, APPROVAL_PENDING, lifecycle.DRIVER)
    assert not lifecycle.request_allowed(None, APPROVAL_APPROVED)
    # An expired request is never approved afterwards, by anyone.
    assert not lifecycle.request_allowed(APPROVAL_EXPIRED, APPROVAL_APPROVED)


def test_a_request_move_the_table_does_not_hold_is_never_written():
    store = InMemoryStore()
    store.create_run(RunInfo(run_id="r"))
    asked = ApprovalRequestInfo("r", "c1", "pay", {"cents": 5}, {"kind": "single"}, 1)
    store.save_approval_request(asked)
    assert lifecycle.move_request(store, "r", "c1", APPROVAL_EXPIRED, lifecycle.SWEEP)
    assert not lifecycle.move_request(store, "r", "c1", APPROVAL_APPROVED, lifecycle.PERSON)
    assert not lifecycle.move_request(store, "r", "c1", APPROVAL_WITHDRAWN, lifecycle.PERSON)
    assert store.get_approval_request("r", "c1").status == APPROVAL_EXPIRED
    with pytest.raises(ValueError):
        lifecycle.request_froms(APPROVAL_EXPIRED, lifecycle.RECOVERY)


def test_the_docs_show_the_request_table_the_code_has():
    text = DOCS.read_text()
    table = text[text.index("## An approval request's lifecycle") :]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    shown = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows]
    assert shown[: len(lifecycle.APPROVAL_MOVES)] == [m.row() for m in lifecycle.APPROVAL_MOVES]


# -- only the lifecycle changes a run's status ----------------------------------------------

ENGINE = PACKAGE / "engine"
# The engine's own writers of a status: the lifecycle, and the in-memory store it writes to.
WRITERS = {"engine/lifecycle.py", "engine/memstore.py"}
# Where the engine spells a status without writing a run's: views and payloads that say
# what a run's status was, and one status that is no run's (module, function: why).
NOT_A_WRITE = {
    ("engine/commands/runs.py", "pending"): "`pending()`'s view of each run",
    ("engine/commands/runs.py", "PendingRun.to_json"): "`pending()` as JSON",
    ("engine/commands/runs.py", "delete"): "a delete's action log says what it deleted",
    ("engine/commands/sessions.py", "Session.send_once"): "a delivery's action log",
    ("engine/errors.py", "ModelError.__init__"): "a provider's HTTP status",
}
# Glue may name these only to read (the database store is the one that writes them).
RUN_STATUS_NAMES = {
    name for name in dir(ports) if getattr(ports, name) in STATUSES and name.isupper()
}


def _status_writes(path: Path) -> list[tuple[str, int, str]]:
    """Where ``path`` spells a run-row status change: a ``"status"`` key, a ``status=``
    argument, ``x["status"] = ...``, ``x.status = ...``, or an ``if_status=`` condition;
    each with the function it is in."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            where = f"{where}.{node.name}" if where else node.name
        if isinstance(node, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value == "status" for k in node.keys):
                found.append((where, node.lineno, '"status": key'))
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("status", "if_status"):
                    found.append((where, node.lineno, f"{kw.arg}="))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "status"
                ) or (isinstance(t, ast.Attribute) and t.attr == "status"):
                    found.append((where, node.lineno, "status assigned"))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def _engine_status_writes() -> list[str]:
    hits = []
    for path in sorted(ENGINE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        if module in WRITERS:
            continue
        for where, line, what in _status_writes(path):
            if (module, where) not in NOT_A_WRITE:
                hits.append(f"{module}:{line} ({where}): {what}")
    return hits


def _glue_status_writes(path: Path) -> list[str]:
    """Where glue (outside the engine and the database store) writes a run's status: a
    store's row writes (``update_run``, ``run_changes=``, ``if_status=``), or ``status=``
    a run status on an ORM write or a row built by hand."""
    writes = {"update", "create", "get_or_create", "update_or_create", "Run", "RunInfo"}
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name == "update_run":
            hits.append(f"{node.lineno}: update_run")
        for kw in node.keywords:
            if kw.arg in ("run_changes", "if_status"):
                hits.append(f"{node.lineno}: {kw.arg}=")
            value = kw.value
            said = getattr(value, "id", "")  # QUEUED, or ports.QUEUED (not Notification.FAILED)
            if isinstance(value, ast.Attribute) and getattr(value.value, "id", "") == "ports":
                said = value.attr
            if kw.arg == "status" and name in writes and said in RUN_STATUS_NAMES:
                hits.append(f"{node.lineno}: {name}(status={said})")
    return hits


def test_only_the_lifecycle_changes_a_runs_status():
    assert _engine_status_writes() == []
    glue = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(ENGINE)
        and not path.is_relative_to(PACKAGE / "database")
        and (hits := _glue_status_writes(path))
    }
    assert glue == {}


def test_the_status_check_sees_every_way_to_write_one(tmp_path):
    """The check would catch a status written back by hand, and its exceptions still say
    something (each names a payload that is there)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def pause(store, driver, run):\n"
        "    store.update_run('r', {'status': 'queued'}, fence='t')\n"
        "    driver._update(status='halted')\n"
        "    changes = {}\n"
        "    changes['status'] = 'failed'\n"
        "    store.update_run('r', changes, if_status=('running',))\n"
        "    run.status = 'cancelled'\n"
        "    return RunInfo(run_id='r', status='finished')\n"
    )
    kinds = [what for _, _, what in _status_writes(probe)]
    assert sorted(kinds) == sorted(
        ['"status": key', "status=", "status assigned", "if_status=", "status assigned", "status="]
    )
    glue = tmp_path / "glue.py"
    glue.write_text(
        "def act(store, ports):\n"
        "    Run.objects.filter(pk=1).update(status=CANCELLED)\n"
        "    Run.objects.filter(status=QUEUED).update(attempts=0)\n"  # a read: not a write
        "    store.update_run('r', {})\n"
        "    store.insert('r', 'x', '{}', run_changes={})\n"
        "    return RunInfo(run_id='r', status=ports.FAILED)\n"
    )
    assert len(_glue_status_writes(glue)) == 4
    for (module, where), why in NOT_A_WRITE.items():
        assert any(w == where for w, _, _ in _status_writes(PACKAGE / module)), (module, why)


# -- records and their row changes ----------------------------------------------------------


def test_every_record_moves_a_run_as_the_table_allows():
    for name, move in lifecycle.RECORD_MOVES.items():
        assert move.name == name and move.to and set(move.to) <= set(STATUSES)
        for to in move.to:  # someone may write it
            assert any(m.to == to and m.by != lifecycle.CREATE for m in lifecycle.MOVES)


def test_a_record_is_written_with_the_row_change_the_table_gives_it():
    from durable_agents.engine.journal import Journal

    store = InMemoryStore()
    journal = Journal(store)
    store.create_run(RunInfo(run_id="r", status=RUNNING))
    lease = store.acquire_lease("r", "me", "t", 30)
    assert lease is not None
    cause = {"code": "saga.cancelled", "message": "cancelled by ann"}
    body = names.abort_body(cause, by="ann", by_id="1", reason="")
    _, inserted = lifecycle.record_in(
        journal, "r", names.SAGA_ABORT, body, lifecycle.PERSON, fence="t"
    )
    run = store.get_run("r")
    assert inserted and run.status == COMPENSATING and run.last_error == cause
    assert (
        lifecycle.row_change(names.RUN_COMPENSATED, {"failed": ["c1"]}, lifecycle.DRIVER)["status"]
        == ports.FAILED
    )
    assert (
        lifecycle.row_change(names.RUN_COMPENSATED, {"failed": []}, lifecycle.DRIVER)["status"]
        == COMPENSATED
    )
    with pytest.raises(ValueError):  # where a fork's copy stands is the writer's to say
        lifecycle.row_change(names.FORK_DONE, {}, lifecycle.PERSON)
    with pytest.raises(ValueError):  # no record finishes a run but its end
        lifecycle.row_change(names.RUN_CANCELLED, {}, lifecycle.PERSON, to=FINISHED)
    with pytest.raises(ValueError):  # a record without a row change
        lifecycle.row_change(names.RUN_START, {}, lifecycle.DRIVER)
    with pytest.raises(ValueError):  # the sweep never finishes a run
        lifecycle.hold(store, "r", FINISHED, lifecycle.SWEEP, fence="t")
    assert store.get_run("r").status == COMPENSATING
    with pytest.raises(ValueError):
        lifecycle.created(CANCELLED, run_id="x")


def test_a_stop_records_body_is_built_in_one_place():
    """``run:cancelled`` and ``saga:abort`` bodies come from ``names`` builders alone."""
    spelled = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name == "names.py" and path.parent == ENGINE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant)
                and k.value == "kind"
                and isinstance(v, ast.Constant)
                and v.value in ("cancelled", "saga_abort")
                for k, v in zip(node.keys, node.values, strict=True)
            ):
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert spelled == []


def test_run_statuses_are_the_strings_a_row_holds():
    assert list(ports.RunStatus) == list(STATUSES)
    assert [str(s) for s in STATUSES] == [
        "queued",
        "running",
        "awaiting_approval",
        "awaiting_input",
        "sleeping",
        "throttled",
        "halted",
        "compensating",
        "finished",
        "compensated",
        "failed",
        "cancelled",
    ]
    assert ports.QUEUED is ports.RunStatus.QUEUED and ports.QUEUED == "queued"
    assert f"{ports.HALTED}" == "halted" and "cancelled" in TERMINAL_STATUSES
    # A row reads back a plain string, from every store alike.
    row = RunInfo(run_id="x", status=ports.HALTED)
    assert type(row.status) is str and row.status == "halted"
