"""A person voting twice before anyone else has voted (issue 43), aimed at.

In the quorum casts, six in ten (drawn from a stream of their own, ``repeat-votes:<seed>``),
the first member of the group has a second browser tab: as soon as a quorum call is pending
with no vote recorded, both tabs approve it, as asked, each as that person (a double click,
two requests racing). Each tab reads the request, finds no vote of theirs, and submits: one
vote must count, whichever is recorded (``quorums_need_people``: the call runs only after two
distinct members approved it). Before, the people's own repeats came one after the other,
and the command's check refused the second before it reached the store.
"""

from __future__ import annotations

import random

from . import world as W
from .actors import Op, Person

ODDS = 0.6


def takes_part(seed: int) -> bool:
    """Whether a quorum cast has the second tab (``scenario.build``), from its own stream."""
    return random.Random(f"repeat-votes:{seed}").random() < ODDS


class Tab(Person):
    """One of a person's two tabs: approves quorum calls nobody has voted on yet."""

    def __init__(self, name: str, tab: int) -> None:
        super().__init__(name, 0, 0)
        self.tab = tab
        self.voted: set[tuple[str, str]] = set()

    def _unvoted(self, w: W.World) -> list[tuple[str, str]]:
        return [
            (r.run_id, r.call_id)
            for r in w.raw.list_approval_requests()
            if r.policy.get("kind") == "quorum"
            and (r.run_id, r.call_id) not in self.voted
            and not w.raw.list_decisions(r.run_id, r.call_id)
        ]

    def weight(self, w: W.World) -> int:
        return 8 if self._unvoted(w) else 0

    def choose(self, w: W.World) -> Op | None:
        unvoted = self._unvoted(w)
        if not unvoted:
            return None
        run_id, call_id = unvoted[0]  # both tabs show the oldest first
        self.voted.add((run_id, call_id))
        w.count(f"quorum calls approved from a second tab (tab {self.tab})")
        return self._decide(w, run_id, call_id, True)


# -- a page left open (issue 43, ``decisions_after_close``) ------------------------------------

STALE_ODDS = 0.6


def stale_pages(seed: int) -> bool:
    """Whether a cast with people has a person deciding from pages left open (``scenario.build``),
    from a stream of its own."""
    return random.Random(f"stale-page:{seed}").random() < STALE_ODDS


class StalePage(Person):
    """A person who opened requests' pages while they were pending and decides from them
    after the request closed (its run cancelled or rolled back, the call settled otherwise,
    the request decided by someone else): up to ``left`` times, approving or denying what
    the page shows. Twice at most, they cancel the run of a request whose page they keep
    open (two tabs). The engine must refuse each decision, or give back the standing one;
    no vote may be saved on a closed request, nor a decision count one
    (``decisions_after_close``)."""

    def __init__(self, name: str, seed: int, left: int) -> None:
        super().__init__(name, 0, 0)
        self.rng = random.Random(f"stale-page-ops:{seed}")
        self.left = left
        self.cancels = 2
        self.pages: dict[tuple[str, str], str] = {}  # (run, call) -> the request's start seq

    def _closed(self, w: W.World) -> list[tuple[str, str]]:
        for r in w.raw.list_approval_requests():
            self.pages.setdefault((r.run_id, r.call_id), r.status)
        withdrawn, decided = [], []
        for run_id, call_id in self.pages:
            now = w.raw.get_approval_request(run_id, call_id)
            if now is not None and now.status != "pending":
                # A withdrawn request (its run stopped, its call settled otherwise) first:
                # nothing stands on it that a repeat could be answered with.
                (withdrawn if now.status == "withdrawn" else decided).append((run_id, call_id))
        return withdrawn or decided

    def _open(self, w: W.World) -> list[tuple[str, str]]:
        """Pages of pending requests whose run waits on them, nobody driving it."""
        out = []
        for r in w.raw.list_approval_requests():
            self.pages.setdefault((r.run_id, r.call_id), r.status)
            row = w.raw.get_run(r.run_id)
            lease = w.raw.get_lease(r.run_id)
            if row is not None and row.status == "awaiting_approval" and not (lease and lease.live):
                out.append((r.run_id, r.call_id))
        return out

    def weight(self, w: W.World) -> int:
        if not self.left:
            return 0
        if self.cancels and self._open(w):
            return 8
        closed = self._closed(w)
        if not closed:
            return 0
        first = w.raw.get_approval_request(*closed[0])
        return 8 if first is not None and first.status == "withdrawn" else 1

    def choose(self, w: W.World) -> Op | None:
        closed = self._closed(w)
        pending = self._open(w)
        if self.cancels and pending and (not closed or self.rng.random() < 0.5):
            # One tab cancels the run (the admin's cancel); the page of its request stays
            # open in the other.
            from .actors import cancel_tree

            self.cancels -= 1
            run_id = pending[self.rng.randrange(len(pending))][0]
            w.count("runs cancelled with a request's page left open")
            return f"cancel {run_id} (a page of its request left open)", lambda: cancel_tree(
                w, run_id, self.name, "sim", False
            )
        if not self.left or not closed:
            return None
        self.left -= 1
        run_id, call_id = closed[self.rng.randrange(len(closed))]
        del self.pages[(run_id, call_id)]
        request = w.raw.get_approval_request(run_id, call_id)
        w.count(f"decisions from a page left open ({request.status if request else 'gone'})")
        return self._decide(w, run_id, call_id, self.rng.random() < 0.7)
