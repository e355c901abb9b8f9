"""The mutation check (issue 43): the simulator catches the engine broken on purpose.

Each mutation of ``mutations.py``, applied for a seed at a time, must break an invariant in
a share of CI's fixed seeds (``fixed``: its floor, ``LEAST``), and fresh seeds of this run
of the suite must catch it about as often (``fresh``): a floor met on the fixed seeds alone
may be a schedule the simulator happens to know, not a break it finds. A simulator that
passes everything proves nothing; this is what shows it fails when the engine is wrong.

The mutations are split into two halves, each a test file of its own
(``test_mutations.py``, ``test_mutations_second_half.py``), so that the suite's two workers
share their time (``--dist loadfile`` runs a file on one worker). The counts are printed
(``-s``) and quoted in docs/simulation.md. ``SIM_MUTATION_SEEDS=0-2999`` measures over
more seeds; ``SIM_MUTATION=<name> SIM_SEED=<n> ... test_simulation.py -k replay -s``
replays one catch.
"""

from __future__ import annotations

import functools
import math
import os

from .mutations import MUTATIONS
from .runner import config_for, parse_seeds, replay_command
from .scenario import simulate

# CI's fixed seeds: 0-599 for each mutation, fewer for those caught so often that a
# smaller budget still expects some twenty catches (their floors are of that budget).
SEEDS = 600
BUDGET = {
    "no-halt-on-unknown-outcome": 300,
    "fork-drops-attempt-markers": 300,
    "imports-not-inert": 100,
    "parent-adopts-imported-sub-run": 150,
    "slots-ignore-limit": 150,
    "rates-never-refuse": 200,
    "halted-runs-re-driven": 100,
    "token-blind-renewal": 100,
    "no-cancel-cascade": 200,
    "sub-run-ignores-stopped-root": 150,
    "late-sub-run-under-cancel": 200,
    "halt-min-age-zero": 300,
    "expiry-on-the-row": 300,
    "votes-after-close": 300,
    "forks-at-unknown": 300,
    "mcp-lost-answer-as-not-sent": 300,
    "mcp-transport-error-as-result": 300,
    "mcp-task-sent-again": 300,
    "mcp-task-handle-after-polls": 300,
    "mcp-unknown-task-as-failed": 300,
    # Only the gated casts with the server run (about one seed in twenty): cheap.
    "mcp-approval-of-any-definition": 1200,
}

# The fewest of its budget's seeds that must catch each: about half of what was measured
# (docs/simulation.md), so that an engine change moving schedules does not fail it by
# chance, while a simulator that stopped reaching the break does.
LEAST = {
    "no-halt-on-unknown-outcome": 12,
    "fork-drops-attempt-markers": 11,
    "signature-over-earlier-arguments": 6,
    "halt-min-age-zero": 4,
    "no-cancel-cascade": 8,
    "sub-run-ignores-stopped-root": 14,
    "imports-not-inert": 14,
    # Issue 43: a deploy's change meets a claim in flight.
    "drift-at-a-live-claim": 9,
    # Issue 41: only the seeds whose cast can reach the break are run (``Mutation.reaches``).
    "parent-adopts-imported-sub-run": 12,
    "sweep-skips-throttled": 3,
    "delete-does-not-spend": 16,
    "create-ignores-spent": 20,
    # Limits: only the seeds whose agent has limits are run (``Mutation.reaches``).
    "slots-ignore-limit": 12,
    "slots-outlive-leases": 4,
    "rates-never-refuse": 9,
    # Issue 43: retention in the world, and the rare paths aimed at (``Mutation.reaches``).
    "prune-judges-root-only": 4,
    "repeat-voters": 10,
    # -- stale-slot-release (issue 43, part 3) --
    "stale-slot-release": 2,
    # Issue 43: safety of what was only liveness.
    "halted-runs-re-driven": 16,
    "votes-after-close": 7,
    "token-blind-renewal": 8,
    "forks-at-unknown": 5,
    # Issue 43: trees three deep, a root cancelled as a sub-run starts its own (``trees.py``).
    "late-sub-run-under-cancel": 15,
    # Issue 43: an approver's edit of a compensable refund, rolled back (``rollbacks.py``).
    "undo-with-model-arguments": 4,
    # Issue 42: approval rules; only the rules casts are run (``Mutation.reaches``).
    "edits-not-reevaluated": 7,
    "edit-lowers-need": 3,
    "deploy-lowers-pending": 16,
    "expiry-on-the-row": 11,
    "deputy-counted-twice": 4,
    "reminders-every-sweep": 22,
    # Issue 45: an MCP server's calls, their answers lost (``remote.py``); only the casts
    # with the server are run (``Mutation.reaches``).
    # (5 and 13 of 300 since the server's tasks share the plans' picks with its payments.)
    "mcp-lost-answer-as-not-sent": 2,
    "mcp-transport-error-as-result": 6,
    # Issue 45: an MCP server's tasks, polled across crashes (``remote.py``).
    "mcp-task-sent-again": 2,
    "mcp-task-handle-after-polls": 2,
    "mcp-unknown-task-as-failed": 3,
    # Issue 45: a decision bound to the tool's definition; only the casts that gate the
    # server's payments run (``Mutation.reaches``). 5 of 1,200 measured.
    "mcp-approval-of-any-definition": 2,
}

# Fresh seeds per mutation, each run of the suite.
FRESH = 40
# A fresh count this unlikely, were the mutation caught at the rate its floor stands for,
# says the fixed seeds' catches were luck: the test fails.
UNLIKELY = 1e-4


def budget(name: str) -> range:
    """The fixed seeds ``name`` runs over (``SIM_MUTATION_SEEDS`` overrides)."""
    return parse_seeds(os.environ.get("SIM_MUTATION_SEEDS"), default=BUDGET.get(name, SEEDS))


@functools.cache
def cost(name: str) -> float:
    """How many seeds ``name`` runs in CI: those of its budget its cast can reach
    (``Mutation.reaches``), and about as large a share of its fresh seeds."""
    reaches = MUTATIONS[name].reaches
    seeds = BUDGET.get(name, SEEDS)
    run = sum(1 for seed in range(seeds) if reaches is None or reaches(seed))
    return run * (1 + FRESH / seeds)


def half(which: int) -> list[str]:
    """Half the mutations, by name: the costliest first, each to the half with fewer seeds
    to run so far."""
    halves: tuple[list[str], list[str]] = ([], [])
    load = [0.0, 0.0]
    for name in sorted(MUTATIONS, key=lambda n: (-cost(n), n)):
        lighter = 0 if load[0] <= load[1] else 1
        halves[lighter].append(name)
        load[lighter] += cost(name)
    return sorted(halves[which])


def _caught(name: str, seeds: range) -> tuple[list[int], int]:
    """The seeds that catch ``name``, and how many ran (``Mutation.reaches`` skips the
    seeds whose cast cannot reach the break: they run the engine as it is)."""
    env = dict(os.environ, SIM_MUTATION=name)
    reaches = MUTATIONS[name].reaches
    caught, run = [], 0
    for seed in seeds:
        if reaches is not None and not reaches(seed):
            continue
        run += 1
        if simulate(config_for(seed, env)).violations:
            caught.append(seed)
    return caught, run


def _example(name: str, caught: list[int]) -> str:
    if not caught:
        return "(no seed caught it)"
    return replay_command(config_for(caught[0], dict(os.environ, SIM_MUTATION=name)))


def fixed(name: str) -> None:
    """``name`` over its budget of fixed seeds: at least its floor must catch it."""
    seeds = budget(name)
    caught, run = _caught(name, seeds)
    print(
        f"\n{name}: caught by {len(caught)} of {len(seeds)} seeds "
        f"({100 * len(caught) / len(seeds):.1f}%; {run} run); e.g. {_example(name, caught)}"
    )
    floor = LEAST[name] if len(seeds) >= BUDGET.get(name, SEEDS) else 1
    assert len(caught) >= floor, (
        f"{name} ({MUTATIONS[name].breaks}) was caught by {len(caught)} of {len(seeds)} seeds; "
        f"the simulator must catch it in at least {floor}"
    )


def at_most(caught: int, n: int, p: float) -> float:
    """The chance of ``caught`` catches or fewer in ``n`` seeds, each caught with odds ``p``."""
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(caught + 1))


def fresh(name: str) -> None:
    """``name`` over ``FRESH`` seeds of this run of the suite (``SIM_FRESH``, printed at the
    end of the run), judged by the rate its floor stands for: fresh seeds catching it far
    more rarely than that fail. A mutation whose floor expects fewer than a few catches in
    ``FRESH`` seeds cannot fail here; its catches are printed all the same."""
    from tests.conftest import FRESH_SEEDS, PG_FRESH_SEEDS

    index = sorted(MUTATIONS).index(name)
    base = int(os.environ.get("SIM_FRESH") or 1_000_000) + FRESH_SEEDS + PG_FRESH_SEEDS
    seeds = range(base + index * FRESH, base + (index + 1) * FRESH)
    caught, _ = _caught(name, seeds)
    rate = LEAST[name] / BUDGET.get(name, SEEDS)
    chance = at_most(len(caught), len(seeds), rate)
    print(
        f"\n{name}: fresh seeds {seeds.start}-{seeds.stop - 1} caught it {len(caught)} times "
        f"(its floor stands for {rate * len(seeds):.1f}); e.g. {_example(name, caught)}"
    )
    assert chance >= UNLIKELY, (
        f"{name} was caught by {len(caught)} of fresh seeds {seeds.start}-{seeds.stop - 1}, "
        f"where its floor ({LEAST[name]} of {BUDGET.get(name, SEEDS)}) stands for "
        f"{rate * len(seeds):.1f}: a chance of {chance:.1e}. The fixed seeds' catches are a "
        "schedule they know."
    )
