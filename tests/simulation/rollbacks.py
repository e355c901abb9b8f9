"""A run rolled back right after an approver's edit of a refund ran (issue 43), aimed at.

In the saga casts whose refunds have an undo (``agent.undo_refunds``), with people, staff
(rita) cancel-and-compensate, up to twice, a run whose refund ran as an approver edited it,
the moment its driver lets it go (the run paused on a later step; ``store:release_lease``)
and in any phase: as a process of its own, run to its end at once. Its rollback must undo
the refund with the arguments it ran with, the edit (``sagas_undo_once``). The people's own
rollback of such a run (``Person``, "compensate-edited") came first: it waited for the
person to be picked while the run was paused, and over 600 seeds it rolled back 4 runs, none
of whose undo ran in the main phase (its cancel found the run busy).
"""

from __future__ import annotations

import random

from . import world as W
from .actors import Actor, Op, _edited_and_run, cancel_tree

RELEASE = "store:release_lease "
OVER = ("cancelled", "compensated", "compensating")


class EditUndoer(Actor):
    kind = "rollback"

    def __init__(self, w: W.World, name: str, seed: int, left: int) -> None:
        super().__init__(name)
        self.rng = random.Random(f"undo-edits:{seed}")
        self.left = left
        self.released: set[str] = set()  # runs a driver was letting go
        w.point_aims.append(lambda proc: self._at(w, proc))

    def weight(self, w: W.World) -> int:
        return 0  # it acts at points only (``World.point_aims``)

    def choose(self, w: W.World) -> Op | None:
        return None

    def _at(self, w: W.World, proc: W.Proc) -> None:
        if not self.left or self.proc is not None:
            return
        if proc.point.startswith(RELEASE):
            self.released.add(proc.point.removeprefix(RELEASE))
            return
        free = [r for r in self.released if not ((lease := w.raw.get_lease(r)) and lease.live)]
        if not free:
            return
        self.released -= set(free)
        runs = [
            r
            for r in free
            if (row := w.raw.get_run(r)) is not None
            and not row.finished
            and row.status not in OVER
            and not row.inert
        ]
        edited = _edited_and_run(w, runs)
        if not edited:
            return
        self.left -= 1
        run_id = edited[self.rng.randrange(len(edited))]
        w.count("runs rolled back the moment an edited refund ran")
        w.run_to_end(
            w.start(
                self,
                f"cancel and compensate {run_id} (an edited refund ran)",
                lambda: cancel_tree(w, run_id, self.name, "edited", True),
            )
        )
