"""A drive's side of the limits (``engine.limits``): take the run's slot, a tool's slot and
rate permits right before the work they limit, give the slots back when the drive ends, and
throttle the run when a limit is full.

The order is the one that wastes nothing: slots before permits (a refused slot consumes no
permit), and all of it before a call's attempt claim (a throttled call was provably never
started, so its retry is its first attempt and never a halt).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any, NoReturn

from . import failpoints, lifecycle, runtime
from .errors import Throttled
from .limits import Rate, Refusal, agent_key, model_key, model_names, slot_retry, tool_key
from .ports import RUNNING, THROTTLED, Store, ThrottleInfo

log = logging.getLogger("durable_agents.limits")


class OwnSlotsFull(Exception):
    """Every slot of a tool this drive may get is held by its own calls in flight: the
    call waits for one of them, in this drive (not a throttle)."""


class DriveLimits:
    """The limits one drive holds. Cheap when nothing is limited: every check is an
    attribute test before any store call."""

    def __init__(self, store: Store, run_id: str, agent: Any, fence: str) -> None:
        self.store = store
        self.run_id = run_id
        self.agent = agent
        self.fence = fence
        self._run_slot: str | None = None  # the key of the agent slot held, once taken
        self._held: dict[str, str] = {}  # tool slots held: holder -> key

    # -- before the work ----------------------------------------------------------------

    def before_model(self) -> None:
        self._take_run_slot()
        for name in model_names(self.agent.model):
            rate = runtime.model_rate(name)
            if rate is not None:
                self._permit(model_key(name), rate)
                return

    def before_tool(self, tool: Any, call_id: str) -> str | None:
        """Take what ``tool`` needs to run call ``call_id``; the tool slot's holder (give it
        back with ``after_tool``), or None."""
        self._take_run_slot()
        holder = None
        if tool.max_concurrent is not None:
            holder = f"{self.run_id}#{call_id}"
            key = tool_key(tool.name)
            if not self.store.claim_slot(key, holder, self.run_id, self.fence, tool.max_concurrent):
                if key in self._held.values():
                    raise OwnSlotsFull(key)  # one of this drive's own calls gives one back
                self._refuse_slot(key, f"{tool.max_concurrent} at once")
            self._held[holder] = key
        if tool.rate is not None:
            self._permit(tool_key(tool.name), tool.rate)
        return holder

    def after_tool(self, holder: str | None) -> None:
        if holder is not None and holder in self._held:
            key = self._held.pop(holder)
            _hand_over(self.store, self.store.release_slot(key, holder, self.fence))

    # -- at the end of the drive ---------------------------------------------------------

    def release(self) -> None:
        """Give back every slot this drive holds and hand each one's oldest waiter over."""
        waiting = [self.store.release_slot(key, h, self.fence) for h, key in self._held.items()]
        self._held.clear()
        if self._run_slot is not None:
            waiting.append(self.store.release_slot(self._run_slot, self.run_id, self.fence))
            self._run_slot = None
        for run_id in waiting:
            _hand_over(self.store, run_id)

    # -- inside ----------------------------------------------------------------------

    def _take_run_slot(self) -> None:
        limit = self.agent.max_concurrent_runs
        if limit is None or self._run_slot is not None:
            return
        key = agent_key(self.agent.name)
        if not self.store.claim_slot(key, self.run_id, self.run_id, self.fence, limit):
            self._refuse_slot(key, f"{limit} at once")
        self._run_slot = key

    def _refuse_slot(self, key: str, limit: str) -> NoReturn:
        now = self.store.now()
        self._throttle(Refusal(key, slot_retry(now, 0), "slots", limit), now)

    def _permit(self, key: str, rate: Rate) -> None:
        wait = self.store.take_permit(key, rate.count, rate.period)
        if wait > 0:
            now = self.store.now()
            refusal = Refusal(key, now + timedelta(seconds=wait), "rate", rate.text)
            self._throttle(refusal, now)

    def settle(self, throttled: Throttled) -> None:
        """The drive ends throttled, its calls in flight settled: give every slot back,
        then say ``throttled`` (fenced). The throttle row was written first: a crash between
        them leaves a running run with no driver, which recovery hands over; never a
        throttled run without a row saying when it tries again."""
        self.release()
        failpoints.hit(f"before-throttle:{self.run_id}")
        lifecycle.move(
            self.store,
            self.run_id,
            THROTTLED,
            lifecycle.DRIVER,
            changes={"attempts": 0, "last_error": None},
            only_from=(RUNNING,),
            fence=self.fence,
        )

    def _throttle(self, refusal: Refusal, now: Any) -> NoReturn:
        """Record why the run waits and stop the drive (``Driver.drive`` settles it once
        the calls in flight are done: their slots are held until then)."""
        info = ThrottleInfo(
            self.run_id,
            self.agent.name,
            refusal.key,
            refusal.reason,
            refusal.limit,
            refusal.retry_at,
            now,
        )
        tries = self.store.throttle(info)
        retry_at = refusal.retry_at
        if refusal.reason == "slots" and tries > 1:
            retry_at = slot_retry(now, tries - 1)
            self.store.throttle(replace(info, retry_at=retry_at))
        what = "a slot" if refusal.reason == "slots" else "a permit"
        raise Throttled(
            f"run {self.run_id!r} waits for {what} of {refusal.key} ({refusal.limit}); it "
            f"tries again at {retry_at.isoformat()}",
            run_id=self.run_id,
            key=refusal.key,
            reason=refusal.reason,
            limit=refusal.limit,
            retry_at=retry_at.isoformat(),
            wake_ms=int(retry_at.timestamp() * 1000),
        )


# The runs this thread is handing over, while it does (``_hand_over``).
_handing = threading.local()


def _hand_over(store: Store, run_id: str | None) -> None:
    """A slot was given back and ``run_id`` has waited longest for one (``release_slot``
    says which): hand it over. An inline dispatcher drives it right here, and its drive
    gives its own slot back: that hand-over joins this loop instead of nesting (the stack
    stays flat however many wait)."""
    if run_id is None or not runtime.has_dispatcher():
        return  # nobody waits; or the sweep hands it over at its retry time
    queued: list[str] | None = getattr(_handing, "runs", None)
    if queued is not None:
        queued.append(run_id)
        return
    _handing.runs = queued = [run_id]
    try:
        while queued:
            waiting = queued.pop(0)
            if lifecycle.hand_over(store, waiting, lifecycle.SWEEP, only_from=THROTTLED):
                runtime.dispatch(waiting)
    finally:
        _handing.runs = None
