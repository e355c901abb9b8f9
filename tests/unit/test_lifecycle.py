"""The lifecycle table (``engine/lifecycle.py``): what it allows, and that docs/guarantees.md
shows it as the code has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_agents.engine import lifecycle
from durable_agents.engine.ports import (
    CANCELLED,
    COMPENSATED,
    COMPENSATING,
    FINISHED,
    QUEUED,
    RUNNING,
    STATUSES,
    TERMINAL_STATUSES,
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
