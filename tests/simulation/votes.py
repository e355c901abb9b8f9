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
