"""An undo whose outcome is unknown halts its saga for a person (seed 13241): the halted run
waits on something real, a person can resolve it, and the rollback then ends. A directed
schedule (``directed``), checked against every invariant while halted and once settled."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.agent import get_agent

from .actors import Driver, Person, drive_like_a_worker
from .agent import AGENT
from .directed import deploy, directed_world, run, settle_and_check
from .invariants import check_all


def _fail(w) -> None:
    if w.violations:
        pytest.fail("\n".join(w.format_trace() + [str(v) for v in w.violations]), pytrace=False)


def test_a_halt_on_an_undo_is_resolvable_and_the_rollback_ends():
    with directed_world() as w:
        deploy(w, saga=True)
        client, driver, ann = Driver("client"), Driver("driver1"), Person("ann", forks=0, cancels=1)
        run(
            w,
            client,
            "start r1",
            lambda: get_agent(AGENT).start(
                "plan:charge.1.20;refund.2.20", run_id="r1", store=w.store
            ),
        )
        w.queue.clear()
        run(w, driver, "drive r1", lambda: drive_like_a_worker(w, "r1"))  # awaits the refund
        assert w.raw.get_run("r1").status == "awaiting_approval"
        run(
            w,
            ann,
            "cancel and compensate r1",
            lambda: da.cancel("r1", by="ann", compensate=True, store=w.store),
        )
        w.queue.clear()
        undoing = run(
            w,
            driver,
            "drive r1",
            lambda: drive_like_a_worker(w, "r1"),
            until="tool uncharge * done",
        )
        w.crash(undoing)  # the refund went out; its outcome was never recorded
        w.queue.clear()
        w.advance_by(2 * w.config.ttl + 1)
        run(w, driver, "drive r1", lambda: drive_like_a_worker(w, "r1"))
        assert w.raw.get_run("r1").status == "halted"
        [halt] = w.raw.list_halts(run_id="r1")
        assert halt.op_id.startswith("compensate:")
        check_all(w)  # halted on its undo: that is something left to resolve
        _fail(w)
        label, op = ann._resolve(w, "r1", halt.op_id)
        run(w, ann, label, op)
        settle_and_check(w)
        _fail(w)
        assert w.raw.get_run("r1").status == "compensated"
        assert sum(e.effect for e in w.ledger if e.tool == "uncharge") == 1
