"""The lifecycle table (``engine/lifecycle.py``): what it allows, and that docs/guarantees.md
shows it as the code has it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from durable_agents.engine import lifecycle
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
