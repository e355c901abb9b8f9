"""Trees three deep, and a root cancelled while a sub-run below it starts one (issue 43).

In a share of the answerer's casts (drawn from a stream of their own, ``deep:<seed>``;
``Deploy.deep``) the errand sub-agent has a sub-agent of its own, the chore: a run's errand
call starts a sub-run (``sim-errand-deep``), which mails and books, asks staff for a refund
(it pauses, and its tree with it), then calls its chore (``sim-chore``, a third level: mail,
book, and for one order in three a refund of its own). A decision on the errand's refund
drives the errand on its own, its root paused and nobody's: the only moment a sub-run starts
a sub-run of its own while its root can be cancelled.

The late canceller aims at that moment (its choices from ``deep-ops:<seed>``): as soon as a
sub-run being driven has journaled the call that starts its own sub-run
(``child:<call>``) and the sub-run's row does not exist yet, it cancels the root, plainly
or (a saga deploy) with compensation, at once (nobody moves before its record). The
sub-run's parent looked at its tree before the call; the sub-run is created after the
root's stop, and must obey it before any step of its own (``Driver._check_tree`` when its
drive begins). Three times in ten it aims earlier, as soon as the model's turn names the
call: the parent then finds the stop itself, or the sub-run does.
"""

from __future__ import annotations

import random
from typing import Any

import durable_agents as da
from durable_agents.engine.journal import Journal

from . import world as W
from .actors import Actor, Op, cancel_tree
from .agent import CHORE_TAG, DEEP_TAG, ERRAND, MODEL, TOOLS, is_agent_run, limited

ODDS = 0.5
# The deep errand's bookings: a second one at once waits, throttled, and the sweep hands the
# sub-run over when its retry is due, to be driven on its own (no person needed).
BOOK_RATE = "1/90s"
CHORE_OFFSET = 500
AFTER_CHILD = "fp after-child:"  # a chore's order: its errand's plus this (its keys are its own)


def takes_part(seed: int) -> bool:
    """Whether a cast with people and the answerer builds trees three deep (its own
    stream, so the other seeds keep their schedules)."""
    return random.Random(f"deep:{seed}").random() < ODDS


def plan_for(order: int, *, chore: bool) -> str:
    """A deep errand's plan: book, and a refund staff decide or (an odd order) a second
    booking its rate makes wait, so the sub-run pauses; then its chore. A chore's: mail and
    book, and for one order in three a refund."""
    if chore:
        plan = f"plan:notify.{order}.0|book.{order}.0"
        return plan + (f";refund.{order}.20" if order % 3 == 0 else "")
    chore_call = f"{ERRAND}.{order + CHORE_OFFSET}.0"
    if order % 2:
        # Two bookings at once under the errand's rate: the second waits, throttled.
        return f"plan:book.{order}.0|book.{order + CHORE_OFFSET // 2}.0;{chore_call}"
    return f"plan:book.{order}.0|refund.{order}.20;{chore_call}"


def _agent(name: str, book: str, below: Any = None) -> da.Agent:
    booking = TOOLS[book]
    if below is not None:  # the deep errand books under a rate (``BOOK_RATE``)
        booking = limited(booking, None, BOOK_RATE)
    tools = [TOOLS["notify"], booking, TOOLS["refund_v1"], TOOLS["confirm"]]
    if below is not None:
        tools.append(below)
    return da.Agent(
        name,
        MODEL,
        "Run the errand.",
        tools,
        max_turns=8,
        model_retry=da.ModelRetry(max_attempts=3, base_delay=1.0, max_delay=2.0),
    )


for _saga, _book in (("", "book"), ("_saga", "book_saga")):
    _chore = _agent(CHORE_TAG + _saga.replace("_", "-"), _book)
    _deep = _agent(DEEP_TAG + _saga.replace("_", "-"), _book, _chore.as_tool(name=ERRAND))
    TOOLS[f"errand{_saga}_deep"] = _deep.as_tool(name=ERRAND)


class LateCanceller(Actor):
    """Staff cancelling a root while a sub-run below it, driven on its own, starts a sub-run
    of its own (up to ``left`` times)."""

    kind = "late-canceller"

    def __init__(self, w: W.World, name: str, seed: int, left: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"deep-ops:{seed}")
        self.left = left
        self.done: set[str] = set()  # roots cancelled
        w.point_aims.append(lambda proc: self._at(w, proc))

    def _at(self, w: W.World, proc: W.Proc) -> None:
        """At a sub-run's ``fp after-child:<its sub-run>`` (its parent journaled starting
        it; its row is not made yet), in any phase: cancel the root at once, eight times in
        ten, as a process of its own run to its end before the sub-run is made."""
        if not self.left or self.proc is not None or not proc.point.startswith(AFTER_CHILD):
            return
        sub = proc.point.removeprefix(AFTER_CHILD)
        parent = w.raw.get_run(sub.rpartition("/")[0])
        if parent is None or not parent.parent_run_id or not parent.root_run_id:
            return
        root = parent.root_run_id
        top = w.raw.get_lease(root)
        if root in self.done or (top is not None and top.live) or w.raw.get_run(sub) is not None:
            return
        if any(w.raw.get(root, n) is not None for n in ("run:cancelled", "saga:abort")):
            return
        if self.rng.random() >= 0.8:
            return
        self.left -= 1
        self.done.add(root)
        compensate = bool(w.deploy.saga) and self.rng.random() < 0.5
        w.count("roots cancelled as a sub-run starts its own")
        w.run_to_end(
            w.start(
                self,
                f"cancel{' and compensate' if compensate else ''} tree {root} (as {sub} starts)",
                lambda: cancel_tree(w, root, self.name, "late", compensate),
            )
        )

    def _windows(self, w: W.World) -> list[tuple[str, str, bool]]:
        """(root, the sub-run starting one, whether its ``child:`` is journaled) for each
        sub-run being driven (its lease live) under a root nobody drives and nobody stopped,
        whose journal names a call of its errand whose sub-run has no row yet."""
        out = []
        for run_id in w.runs:
            if not is_agent_run(run_id):
                continue
            row = w.raw.get_run(run_id)
            if row is None or not row.parent_run_id or not row.root_run_id:
                continue
            if row.finished or row.inert:
                continue
            root = row.root_run_id
            if root in self.done:
                continue
            lease = w.raw.get_lease(run_id)
            if lease is None or not lease.live:
                continue
            top = w.raw.get_lease(root)
            if top is not None and top.live:
                continue
            names = {rec.name: rec for rec in Journal(w.raw).records(run_id)}
            if any(n in names for n in ("run:cancelled", "saga:abort", "run:complete")):
                continue
            for name, rec in names.items():
                if not name.startswith("model:"):
                    continue
                for call in (rec.get("message") or {}).get("tool_calls") or ():
                    call_id = str(call.get("id"))
                    if call.get("name") != ERRAND or f"tool:{call_id}" in names:
                        continue
                    if w.raw.get_run(f"{run_id}/{call_id}") is not None:
                        continue
                    out.append((root, run_id, f"child:{call_id}" in names))
        return out

    def _waiting(self, w: W.World) -> bool:
        """A deep errand waits on its rate: its retry comes with a recovery pass's sweep,
        which the world waits for (an idle world would end its main phase first)."""
        return any(
            row.agent.startswith(DEEP_TAG) and row.root_run_id not in self.done
            for row in w.raw.list_unfinished(statuses=["throttled"])
        )

    def weight(self, w: W.World) -> int:
        if not self.left:
            return 0
        if self._windows(w):
            return 40
        return 1 if self._waiting(w) else 0

    def choose(self, w: W.World) -> Op | None:
        windows = self._windows(w) if self.left else []
        journaled = [x for x in windows if x[2]]
        if journaled:
            windows = journaled
        elif self.rng.random() < 0.7:
            return None  # most wait for the sub-run's record
        if not windows:
            return None
        self.left -= 1
        root, sub, child = windows[self.rng.randrange(len(windows))]
        self.done.add(root)
        compensate = bool(w.deploy.saga) and self.rng.random() < 0.5
        w.count(
            "roots cancelled as a sub-run starts its own"
            if child
            else "roots cancelled as a sub-run asks for its own"
        )

        def op() -> Any:
            return cancel_tree(w, root, self.name, "late", compensate)

        op.exclusive = True  # type: ignore[attr-defined]  # nobody moves before its record
        return f"cancel{' and compensate' if compensate else ''} tree {root} ({sub})", op
