"""Instant takeover on PostgreSQL, the store's part: a lease whose holder's connection closed
(its process died) may be taken at once, and the taker learns it replaced a live lease; a
holder whose connection is open — another thread, or this very connection — keeps its lease.
``INSTANT_TAKEOVER = False`` (poolers that cannot hold session locks) falls back to the TTL."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from durable_agents.engine.ports import RunInfo
from durable_agents.storage import DjangoStore

pytestmark = pytest.mark.django_db(transaction=True)


def _held_in_a_thread(store: DjangoStore, run_id: str, token: str):
    """Lease ``run_id`` from another thread's connection; set the returned event to make that
    thread close its connection (its process dying, as the server sees it)."""
    leased, close = threading.Event(), threading.Event()

    def holder():
        try:
            assert store.acquire_lease(run_id, "holder", token, 30)
            leased.set()
            close.wait(timeout=30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert leased.wait(timeout=30)
    return close, thread


def test_a_lease_whose_holder_connection_closed_is_taken_at_once():
    store = DjangoStore()
    store.create_run(RunInfo("live-1", agent="echo"))
    close, thread = _held_in_a_thread(store, "live-1", "tok-holder")
    assert not store.acquire_lease("live-1", "taker", "tok-taker", 30), "its holder is alive"
    close.set()
    thread.join(timeout=30)
    granted = store.acquire_lease("live-1", "taker", "tok-taker", 30)
    assert granted and granted.previous is not None
    assert (granted.previous.holder, granted.previous.live) == ("holder", True)
    store.release_lease("live-1", "tok-taker")


def test_a_lease_this_connection_holds_is_not_taken_by_it_under_another_token():
    store = DjangoStore()
    store.create_run(RunInfo("live-2", agent="echo"))
    assert store.acquire_lease("live-2", "outer", "tok-outer", 30)
    assert not store.acquire_lease("live-2", "inner", "tok-inner", 30)
    store.release_lease("live-2", "tok-outer")
    granted = store.acquire_lease("live-2", "inner", "tok-inner", 30)
    assert granted and granted.previous is None, "a released lease is free"
    store.release_lease("live-2", "tok-inner")


def test_with_instant_takeover_off_a_closed_holder_keeps_its_lease_until_it_expires():
    store = DjangoStore(instant_takeover=False)
    store.create_run(RunInfo("live-3", agent="echo"))
    close, thread = _held_in_a_thread(store, "live-3", "tok-holder")
    close.set()
    thread.join(timeout=30)
    assert not store.acquire_lease("live-3", "taker", "tok-taker", 30)
    assert store.get_lease("live-3").live
