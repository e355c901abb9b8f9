"""Delegations on every store (InMemoryStore, PostgreSQL, SQLite): a delegation and its
action-log row are written together; two that overlap for one approver never both stand,
also when recorded at once; "in force" is judged by the store's clock; a revocation is
written once."""

from __future__ import annotations

import uuid
from datetime import timedelta

from durable_agents.engine.ports import ActionInfo, DelegationInfo
from tests.support.procs import in_threads


def _log(who: str = "lena") -> ActionInfo:
    return ActionInfo(who, "delegate", "", payload={"why": "away"})


def _logged(store) -> list[ActionInfo]:
    return [a for a in store.list_actions() if a.target.startswith("delegation:")]


def _one(store, approver: str, deputy: str = "leo", *, start=0.0, hours=24.0, **scope):
    now = store.now()
    return DelegationInfo(
        approver=approver,
        deputy=deputy,
        starts_at=now + timedelta(hours=start),
        ends_at=now + timedelta(hours=start + hours),
        created_by=approver,
        **scope,
    )


def test_a_delegation_is_stored_with_its_log_row(store):
    me = f"lena-{uuid.uuid4().hex[:6]}"
    stored, inserted = store.save_delegation(
        _one(store, me, groups=("leads",), tools=("refund",), note="holiday"), log=_log(me)
    )
    assert inserted and stored.id is not None and stored.created_at is not None
    assert (stored.groups, stored.tools, stored.note) == (("leads",), ("refund",), "holiday")
    assert store.get_delegation(stored.id) == stored
    [row] = [a for a in _logged(store) if a.actor == me]
    assert row.target == f"delegation:{stored.id}"
    assert row.payload == {"why": "away", "delegation": stored.id}
    assert store.get_delegation(stored.id + 1000) is None


def test_an_overlapping_delegation_is_not_written(store):
    me = f"lena-{uuid.uuid4().hex[:6]}"
    first, _ = store.save_delegation(_one(store, me, groups=("leads",)), log=_log(me))
    standing, inserted = store.save_delegation(
        _one(store, me, "lara", start=12, groups=("leads", "finance")), log=_log(me)
    )
    assert not inserted and standing.id == first.id
    assert len([a for a in _logged(store) if a.actor == me]) == 1
    # Other groups, other tools, another time or another approver: no overlap.
    for other in (
        _one(store, me, groups=("finance",)),
        _one(store, me, start=24, hours=4),
        _one(store, f"{me}-2"),
    ):
        assert store.save_delegation(other, log=_log(me))[1]
    refunds = _one(store, me, "lara", start=30, tools=("refund",))
    assert store.save_delegation(refunds, log=_log(me))[1]
    assert store.save_delegation(_one(store, me, start=30, tools=("email",)), log=_log(me))[1]
    both = _one(store, me, start=40, hours=1, tools=("refund", "x"))
    assert not store.save_delegation(both, log=_log(me))[1]


def test_in_force_is_judged_by_the_store_clock(store):
    me = f"lena-{uuid.uuid4().hex[:6]}"
    deputy = f"leo-{uuid.uuid4().hex[:6]}"
    now_, _ = store.save_delegation(_one(store, me, deputy, start=-1, hours=2), log=_log(me))
    later, _ = store.save_delegation(_one(store, f"{me}-b", deputy, start=5), log=_log(me))
    past = _one(store, f"{me}-c", deputy, start=-3, hours=1)
    ended, _ = store.save_delegation(past, log=_log(me))
    gone, _ = store.save_delegation(_one(store, f"{me}-d", deputy, start=-1), log=_log(me))
    assert store.revoke_delegation(gone.id, me, log=_log(me))
    assert [d.id for d in store.list_delegations(deputy=deputy, in_force=True)] == [now_.id]
    everything = store.list_delegations(deputy=deputy)
    assert [d.id for d in everything] == [later.id, gone.id, now_.id, ended.id]  # newest start
    assert [d.id for d in store.list_delegations(approver=me)] == [now_.id]
    assert all(d.in_force(store.now()) == (d.id == now_.id) for d in everything)


def test_a_revocation_is_written_once(store):
    me = f"lena-{uuid.uuid4().hex[:6]}"
    d, _ = store.save_delegation(_one(store, me), log=_log(me))
    before = len(_logged(store))
    revoke = ActionInfo(me, "revoke-delegation", "", f"delegation:{d.id}")
    assert store.revoke_delegation(d.id, me, log=revoke) is True
    assert store.revoke_delegation(d.id, "ada", log=revoke) is False
    again = store.get_delegation(d.id)
    assert again.revoked_by == me and again.revoked_at is not None
    assert not again.in_force(store.now())
    assert len(_logged(store)) == before + 1
    # Revoked, it stands in nobody's way.
    assert store.save_delegation(_one(store, me, "lara"), log=_log(me))[1]


def test_overlapping_delegations_recorded_at_once_one_stands(store):
    me = f"lena-{uuid.uuid4().hex[:6]}"
    wanted = [_one(store, me, f"deputy-{i}", start=i * 0.1) for i in range(6)]
    results = in_threads(len(wanted), lambda i: store.save_delegation(wanted[i], log=_log(me)))
    stored = [d for d, inserted in results if inserted]
    assert len(stored) == 1
    assert {d.id for d, _ in results} == {stored[0].id}
    assert len(store.list_delegations(approver=me)) == 1
    assert len([a for a in _logged(store) if a.actor == me]) == 1
