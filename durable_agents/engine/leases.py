"""Holding a run's lease while driving it: acquire, renew from a heartbeat, release.

The lease is liveness, not safety: it keeps two drivers from working on one run in the
normal case, and a driver that loses it stops at its next (fenced) write. What keeps a side
effect at most once is the attempt claim, which does not depend on the lease.

One heartbeat thread per process renews every lease the process holds (every ``ttl / 3``),
on its own long-lived database connection, so a worker does not open a connection per run.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from types import TracebackType
from typing import Any

from . import names
from .errors import RunBusy
from .imported import refuse_inert
from .ports import LeaseInfo, Store
from .records import encode
from .runtime import holder_name
from .telemetry import observer

log = logging.getLogger("durable_agents.lease")


class HeldLease:
    """A lease this process holds on one run, renewed by the process's heartbeat.

    ``lost`` is set when a renewal finds the lease taken, or no renewal succeeded within
    the ttl; the driver checks it between steps, and its fenced writes fail anyway.
    """

    def __init__(self, store: Store, run_id: str, ttl: float, holder: str | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.ttl = float(ttl)
        self.holder = holder or holder_name()
        self.token = uuid.uuid4().hex
        self.lost = threading.Event()
        self.last_renewed = time.monotonic()
        self.next_renewal = self.last_renewed + self.ttl / 3
        self.held = False

    def acquire(self) -> HeldLease:
        """Take the lease (``RunBusy`` if another holder holds it live). Taking it over from
        another holder is journaled (``@takeover/<nonce>``) before anything else is written, in
        a journal already opened (one whose driver died before its header has nothing to
        record beside)."""
        granted = self.store.acquire_lease(self.run_id, self.holder, self.token, self.ttl)
        if not granted:
            # The store grants no lease on an inert import: say so rather than "busy".
            refuse_inert(self.store.get_run(self.run_id), "drive it")
            lease = self.store.get_lease(self.run_id)
            who = f" by {lease.holder} until {lease.expires_at:%H:%M:%S}" if lease else ""
            raise RunBusy(
                f"run {self.run_id!r} is being driven{who}; if that driver dies it can be "
                "taken over at once on PostgreSQL (its process's connection is gone), else "
                "once its lease expires",
                run_id=self.run_id,
            )
        self.adopt()
        if granted.previous is not None:
            try:
                self._journal_takeover(granted.previous)
            except BaseException:
                self.release()
                raise
        return self

    def _journal_takeover(self, previous: LeaseInfo) -> None:
        """``previous.live``: its lease had not expired, its holder's process was gone (the
        store could tell: instant takeover on PostgreSQL)."""
        if self.store.get(self.run_id, names.HEADER) is None:
            # Its driver died before the journal was opened: nothing to record beside, and
            # the header must stay the first record.
            return
        log.info(
            "run %s: took the lease over from %s (its lease ran until %s)",
            self.run_id,
            previous.holder,
            previous.expires_at.isoformat(),
        )
        reason = "holder gone" if previous.live else "expired"
        self.store.insert(
            self.run_id,
            names.takeover(uuid.uuid4().hex[:12]),
            encode(takeover_body(previous, self.holder, reason)),
            fence=self.token,
        )
        observer().takeover(self.run_id, reason)

    def adopt(self) -> HeldLease:
        """Start renewing a lease the store gave ``token`` (by ``acquire`` or ``start_run``)."""
        self.held = True
        self.last_renewed = time.monotonic()
        self.next_renewal = self.last_renewed + self.ttl / 3
        _heartbeat.add(self)
        return self

    def lapsed(self) -> bool:
        """No renewal succeeded for a whole ttl: the lease may be another driver's by now,
        though no renewal has said so (the heartbeat starved, or died). A driver stops at its
        next step, before a call that writes nothing fenced (a retry-safe one) could run."""
        return self.held and time.monotonic() - self.last_renewed >= self.ttl

    def dropped(self) -> None:
        """The store released the lease with the driver's last write (``finish_run``):
        ``release`` has nothing left to delete."""
        self.held = False

    def renew(self) -> None:
        """Called by the heartbeat thread."""
        if not self.held:
            return  # released with the driver's last write
        try:
            if self.store.renew_lease(self.run_id, self.token, self.ttl):
                self.last_renewed = time.monotonic()
            else:
                log.warning("lease on run %s was taken; stopping this drive", self.run_id)
                self.lost.set()
        except Exception:  # a DB blip: keep trying until the lease would lapse
            log.warning("lease renewal of run %s failed", self.run_id, exc_info=True)
            reset = getattr(self.store, "close_thread_resources", None)
            if reset is not None:
                reset()  # reconnect on the next renewal
            if time.monotonic() - self.last_renewed >= self.ttl:
                self.lost.set()
        self.next_renewal = time.monotonic() + self.ttl / 3

    def release(self) -> None:
        _heartbeat.remove(self)
        if not self.held:
            return
        self.held = False
        try:
            self.store.release_lease(self.run_id, self.token)
        except Exception:  # the lease expires on its own
            log.warning("releasing the lease of run %s failed", self.run_id, exc_info=True)

    def __enter__(self) -> HeldLease:
        return self if self.held else self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def takeover_body(previous: LeaseInfo, holder: str, reason: str) -> dict[str, Any]:
    """The ``@takeover/<nonce>`` body: who held the lease, when it expired and was last
    renewed, why it could be taken (``expired``, or ``holder gone``: its process died before
    the lease expired), and who took it."""
    return {
        "kind": "takeover",
        "previous_holder": previous.holder,
        "expired_at": previous.expires_at.isoformat(),
        "renewed_at": previous.renewed_at.isoformat(),
        "reason": reason,
        "holder": holder,
    }


# How often the heartbeat thread looks again while it holds no lease.
_IDLE_CHECK = 1.0


class _Heartbeat:
    """The process's heartbeat thread, started on first use (after a fork, anew)."""

    def __init__(self) -> None:
        self._leases: set[HeldLease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        # When the thread wakes next by itself (None: it is not waiting). A lease added or
        # removed wakes it only if it needs to be there sooner: a thread switch per run
        # costs a short run a tenth of its time.
        self._wake_at: float | None = None
        # Stores whose connection this thread opened: closed as soon as it holds no lease,
        # so an idle process keeps no connection open (a test database can be dropped).
        self._used: list[Store] = []
        self.idle = threading.Event()
        self.idle.set()

    def add(self, lease: HeldLease) -> None:
        with self._lock:
            self._leases.add(lease)
            self.idle.clear()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="durable_agents-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or lease.next_renewal < self._wake_at:
                self._wake.notify()

    def remove(self, lease: HeldLease) -> None:
        with self._lock:
            self._leases.discard(lease)
            if not self._leases and (
                self._wake_at is None or self._wake_at > time.monotonic() + _IDLE_CHECK
            ):
                self._wake.notify()  # to close its connections soon, not at a renewal

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._leases and self._used:
                    used, self._used = self._used, []
                    for store in used:
                        close = getattr(store, "close_thread_resources", None)
                        if close is not None:
                            close()
                if not self._leases:
                    self.idle.set()
                now = time.monotonic()
                due = [lease for lease in self._leases if lease.next_renewal <= now]
                if not due:
                    soonest = min((lease.next_renewal for lease in self._leases), default=None)
                    timeout = max(0.01, soonest - now) if soonest else _IDLE_CHECK
                    self._wake_at = now + timeout
                    self._wake.wait(timeout=timeout)
                    self._wake_at = None
                    continue
            for lease in due:
                if not lease.lost.is_set():
                    if lease.store not in self._used:
                        self._used.append(lease.store)
                    lease.renew()


_heartbeat = _Heartbeat()


def wait_idle(timeout: float = 5.0) -> bool:
    """Wait until the heartbeat holds no lease and has closed its connections."""
    return _heartbeat.idle.wait(timeout)
