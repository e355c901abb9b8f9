"""The Store contract for inert imports (``RunInfo.imported``), on every store: the row
keeps the mark, no lease is granted on it (so no drive, whatever path asks), and the
listings of work (unfinished runs, the site's pending requests and open halts) leave it
out, while its own rows are still read by its run id."""

from __future__ import annotations

import uuid

import pytest

from durable_agents.engine.errors import RunImported
from durable_agents.engine.leases import HeldLease
from durable_agents.engine.ports import (
    AWAITING_APPROVAL,
    HALTED,
    IMPORTED_INERT,
    IMPORTED_LIVE,
    ApprovalRequestInfo,
    HaltInfo,
    RunInfo,
)


def _run(store, imported: str, status: str = AWAITING_APPROVAL) -> str:
    run_id = f"imp-{uuid.uuid4().hex[:12]}"
    store.create_run(RunInfo(run_id=run_id, agent="test", status=status, imported=imported))
    store.save_approval_request(
        ApprovalRequestInfo(run_id, "c1", "refund", {"cents": 5}, {"kind": "single"}, 0)
    )
    store.save_halt(HaltInfo(run_id, "c2", "wire", attempt="attempt:c2:1"))
    return run_id


def test_an_inert_import_keeps_its_mark_and_is_never_leased(store):
    inert, live, here = _run(store, IMPORTED_INERT), _run(store, IMPORTED_LIVE), _run(store, "")
    assert store.get_run(inert).imported == IMPORTED_INERT and store.get_run(inert).inert
    assert store.get_run(live).imported == IMPORTED_LIVE and not store.get_run(live).inert
    assert store.get_run(here).imported == ""
    assert store.acquire_lease(inert, "w", "t1", 30) is None
    with pytest.raises(RunImported):
        HeldLease(store, inert, 30).acquire()
    for run_id in (live, here):  # the control: any other run is leased as ever
        assert store.acquire_lease(run_id, "w", f"t-{run_id}", 30)


def test_listings_of_work_leave_an_inert_import_out(store):
    inert, live = _run(store, IMPORTED_INERT), _run(store, IMPORTED_LIVE)
    halted = _run(store, IMPORTED_INERT, status=HALTED)
    unfinished = {r.run_id for r in store.list_unfinished(limit=10_000)}
    assert live in unfinished and not {inert, halted} & unfinished
    pending = {r.run_id for r in store.list_approval_requests()}
    assert live in pending and inert not in pending
    open_halts = {h.run_id for h in store.list_halts()}
    assert live in open_halts and not {inert, halted} & open_halts
    assert [r.call_id for r in store.list_approval_requests(run_id=inert)] == ["c1"]
    assert [h.op_id for h in store.list_halts(run_id=inert)] == ["c2"]
