"""Holding a run's lease while driving it: acquire, renew from a heartbeat thread, release.

The lease is liveness, not safety: it keeps two drivers from working on one run in the
normal case, and a driver that loses it stops at its next (fenced) write. What keeps a side
effect at most once is the attempt claim, which does not depend on the lease.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from types import TracebackType

from .errors import RunBusy
from .ports import Store
from .runtime import holder_name

log = logging.getLogger("durable_agents.lease")


class HeldLease:
    """A lease this process holds on one run, renewed every ``ttl / 3`` seconds.

    ``lost`` is set when a renewal finds the lease taken or no renewal succeeded within the
    ttl; the driver checks it before each model call and tool call.
    """

    def __init__(self, store: Store, run_id: str, ttl: float, holder: str | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.ttl = float(ttl)
        self.holder = holder or holder_name()
        self.token = uuid.uuid4().hex
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> HeldLease:
        if not self.store.acquire_lease(self.run_id, self.holder, self.token, self.ttl):
            lease = self.store.get_lease(self.run_id)
            who = f" by {lease.holder} until {lease.expires_at:%H:%M:%S}" if lease else ""
            raise RunBusy(
                f"run {self.run_id!r} is being driven{who}; it will be picked up again if that "
                "driver dies (after its lease expires)",
                run_id=self.run_id,
            )
        self._thread = threading.Thread(
            target=self._beat, name=f"lease:{self.run_id}"[:60], daemon=True
        )
        self._thread.start()
        return self

    def _beat(self) -> None:
        last_ok = time.monotonic()
        try:
            while not self._stop.wait(self.ttl / 3):
                try:
                    if self.store.renew_lease(self.run_id, self.token, self.ttl):
                        last_ok = time.monotonic()
                        continue
                    log.warning("lease on run %s was taken; stopping this drive", self.run_id)
                    self.lost.set()
                    return
                except Exception:  # a DB blip: keep trying until the lease would lapse
                    log.warning("lease renewal of run %s failed", self.run_id, exc_info=True)
                    if time.monotonic() - last_ok >= self.ttl:
                        self.lost.set()
                        return
        finally:
            close = getattr(self.store, "close_thread_resources", None)
            if close is not None:
                close()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
        try:
            self.store.release_lease(self.run_id, self.token)
        except Exception:  # the lease expires on its own
            log.warning("releasing the lease of run %s failed", self.run_id, exc_info=True)

    def __enter__(self) -> HeldLease:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
