"""Trees of sub-agents (``agent.as_tool()``) on PostgreSQL, driven by processes of their own:
a three-level tree whose bottom call awaits approval, decided through the management command
(the decision drives the leaf, whose end hands the middle over, then the root); and drivers
SIGKILLed at each boundary of a parent<->child hand-over, a fresh process going on. Side
effects are counted outside the journal (``test_effects``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from durable_agents.database.store import site_store
from durable_agents.engine import names
from durable_agents.engine.commands.recovery import recover
from durable_agents.models import ApprovalRequest, Run
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CALL = "call_1_1"


def ids(run_id: str) -> tuple[str, str, str]:
    middle = f"{run_id}/{CALL}"
    return run_id, middle, f"{middle}/{CALL}"


def child(*args: str, **env: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=subprocess_env(DA_LEASE_TTL="1", **env),
        capture_output=True,
        text=True,
        timeout=90,
    )
    if proc.returncode == -9:
        return -9, ""
    assert proc.returncode == 0, proc.stderr
    return 0, proc.stdout.strip().splitlines()[-1]


def drive(agent: str, run_id: str, text: str | None = None, **env: str) -> tuple[int, dict]:
    args = ["-m", "tests.support.drive", agent, run_id] + ([text] if text else [])
    code, out = child(*args, **env)
    return code, json.loads(out) if out else {}


def assert_tree_agrees_with_journals(run_id: str) -> None:
    """Each sub-run's row names the parent and root its ``run:start`` records, and its
    parent journaled starting it; each model turn of each run was generated once."""
    store = site_store()
    root, middle, leaf = ids(run_id)
    for parent, sub in ((root, middle), (middle, leaf)):
        row = Run.objects.get(run_id=sub)
        start = json.loads(store.get(sub, names.RUN_START).data)
        assert (row.parent_run_id, row.root_run_id) == (parent, root)
        assert (start["parent"], start["root"]) == (parent, root)
        assert json.loads(store.get(parent, names.child(CALL)).data)["run_id"] == sub
    for run in (root, middle, leaf):
        turns = [e.name for e in store.load(run) if e.name.startswith(names.MODEL)]
        assert turns == [names.model(1), names.model(2)]


def test_an_approval_at_the_bottom_of_three_levels_decided_by_the_command():
    make_user("boss", "approve_toolcall")
    root, middle, leaf = ids("g-1")
    assert drive("gtree-root", root, "go")[1] == {"status": "awaiting_approval", "calls": [CALL]}
    statuses = dict(
        Run.objects.filter(run_id__in=(root, middle, leaf)).values_list("run_id", "status")
    )
    assert statuses == {
        root: "awaiting_approval",
        middle: "awaiting_approval",
        leaf: "awaiting_approval",
    }
    request = ApprovalRequest.objects.get()
    assert (request.run_id, request.run.root_run_id) == (leaf, root)
    assert count_effects(leaf) == {}
    code, out = child("manage.py", "durable_agents", "approve", leaf, CALL, "--by", "boss")
    assert code == 0 and "approved" in out
    # The decision drove the leaf (inline dispatch), whose end handed over the middle, and
    # the middle's end the root.
    rows = Run.objects.filter(run_id__in=(root, middle, leaf))
    assert {r.run_id: r.status for r in rows} == dict.fromkeys((root, middle, leaf), "finished")
    assert Run.objects.get(run_id=root).answer == "root done"
    assert count_effects(leaf) == {CALL: 1}
    assert_tree_agrees_with_journals(root)


@pytest.mark.parametrize(
    "point",
    [
        "after-child:{middle}",  # the root journaled the middle's start; nothing driven yet
        "after-child:{leaf}",  # the middle journaled the leaf's start
        f"after-attempt:{CALL}",  # the leaf claimed its side effect (first hit: the leaf's)
        "after-complete:{leaf}",  # the leaf finished; its parent's call has no result yet
        "after-complete:{middle}",  # the middle finished; the root's call has no result yet
        f"after-result:{CALL}",  # the leaf's side effect is recorded (first hit: the leaf's)
    ],
)
def test_a_driver_killed_at_a_hand_over_boundary_resumes_the_tree(point):
    root, middle, leaf = ids("k-" + re.sub(r"[^a-z0-9_]+", "-", point).strip("-"))
    at = point.format(middle=middle, leaf=leaf)
    code, _ = drive("stree-root", root, "go", DURABLE_AGENTS_CRASH_AT=at)
    assert code == -9
    code, out = drive("stree-root", root)
    if at == f"after-attempt:{CALL}":
        # The leaf's effect was claimed and never recorded: the leaf halts, and so the tree.
        assert out == {"status": "halted", "halts": [CALL]}
        assert Run.objects.get(run_id=leaf).status == "halted"
        assert Run.objects.get(run_id=root).status == "halted"
        assert count_effects(leaf) == {}  # killed before it ran; only a person may say
        return
    assert out == {"status": "finished", "answer": "root done"}
    assert count_effects(leaf) == {CALL: 1}
    assert_tree_agrees_with_journals(root)


def test_a_decision_killed_between_the_leafs_end_and_its_parents_hand_over():
    make_user("boss", "approve_toolcall")
    root, middle, leaf = ids("g-2")
    assert drive("gtree-root", root, "go")[1]["status"] == "awaiting_approval"
    code, _ = child(
        "manage.py",
        "durable_agents",
        "approve",
        leaf,
        CALL,
        "--by",
        "boss",
        DURABLE_AGENTS_CRASH_AT=f"after-complete:{leaf}",
    )
    assert code == -9  # the leaf finished; its parent was queued, never handed over
    assert Run.objects.get(run_id=leaf).status == "finished"
    assert Run.objects.get(run_id=middle).status == "queued"
    assert Run.objects.get(run_id=root).status == "awaiting_approval"
    # Recovery hands the queued parent over; its end hands the root over.
    assert recover(interval=0) == [middle]
    assert Run.objects.get(run_id=root).status == "finished"
    assert count_effects(leaf) == {CALL: 1}
    assert_tree_agrees_with_journals(root)
