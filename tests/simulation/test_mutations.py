"""The simulator catches the engine broken on purpose: each mutation of ``mutations.py``,
applied for a seed at a time, must break an invariant in a share of CI's seeds, not in one.
A simulator that passes everything proves nothing; this is what shows it fails when the
engine is wrong. The counts are printed (``-s``) and quoted in docs/simulation.md.

``SIM_MUTATION_SEEDS=0-2999`` measures over more seeds; ``SIM_MUTATION=<name> SIM_SEED=<n>
... test_simulation.py -k replay -s`` replays one catch.
"""

from __future__ import annotations

import os

import pytest

from .mutations import MUTATIONS
from .runner import config_for, parse_seeds, replay_command
from .scenario import simulate

# CI's budget: every mutation over the same seeds. (A rare one would need more seeds, or
# a cast aimed at it: issue 43 aimed the last two, ``halts.py`` and ``rollout.py``.)
SEEDS = 600
MORE_SEEDS: dict[str, int] = {}

# The fewest seeds of CI's budget that must catch each: about half of what was measured
# (docs/simulation.md), so that an engine change moving schedules does not fail it by
# chance, while a simulator that stopped reaching the break does.
LEAST = {
    "no-halt-on-unknown-outcome": 9,
    "fork-drops-attempt-markers": 13,
    "signature-over-earlier-arguments": 6,
    "halt-min-age-zero": 8,
    "no-cancel-cascade": 7,
    "sub-run-ignores-stopped-root": 5,
    "imports-not-inert": 100,
    # Issue 43: a deploy's change meets a claim in flight.
    "drift-at-a-live-claim": 9,
    # Issue 41: only the seeds whose cast can reach the break are run (``Mutation.reaches``).
    "parent-adopts-imported-sub-run": 38,
    "sweep-skips-throttled": 3,
    "delete-does-not-spend": 16,
    "create-ignores-spent": 20,
    # Limits: only the seeds whose agent has limits are run (``Mutation.reaches``).
    "slots-ignore-limit": 47,
    "slots-outlive-leases": 4,
    "rates-never-refuse": 23,
    # Issue 43: retention in the world, and the rare paths aimed at (``Mutation.reaches``).
    "prune-judges-root-only": 4,
    "repeat-voters": 10,
    # -- stale-slot-release (issue 43, part 3) --
    "stale-slot-release": 2,
    # Issue 43: safety of what was only liveness.
    "halted-runs-re-driven": 118,
    "votes-after-close": 15,
    "token-blind-renewal": 52,
    "forks-at-unknown": 15,
    # Issue 42: approval rules; only the rules casts are run (``Mutation.reaches``).
    "edits-not-reevaluated": 7,
    "edit-lowers-need": 3,
    "deploy-lowers-pending": 16,
    "expiry-on-the-row": 22,
    "deputy-counted-twice": 4,
    "reminders-every-sweep": 22,
}


def test_every_mutation_has_a_floor():
    assert set(LEAST) == set(MUTATIONS)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_simulator_catches_the_engine_broken_on_purpose(name):
    seeds = parse_seeds(os.environ.get("SIM_MUTATION_SEEDS"), default=MORE_SEEDS.get(name, SEEDS))
    env = dict(os.environ, SIM_MUTATION=name)
    caught: dict[int, set[str]] = {}
    reaches = MUTATIONS[name].reaches
    run = 0
    for seed in seeds:
        if reaches is not None and not reaches(seed):
            continue  # this seed cannot reach the break: it runs the engine as it is
        run += 1
        world = simulate(config_for(seed, env))
        if world.violations:
            caught[seed] = {v.invariant for v in world.violations}
    invariants = sorted({i for found in caught.values() for i in found})
    example = replay_command(config_for(min(caught), env)) if caught else "(no seed caught it)"
    print(
        f"\n{name}: caught by {len(caught)} of {len(seeds)} seeds "
        f"({100 * len(caught) / len(seeds):.1f}%; {run} run), "
        f"by {', '.join(invariants) or 'nothing'}; "
        f"e.g. {example}"
    )
    floor = LEAST[name] if len(seeds) >= MORE_SEEDS.get(name, SEEDS) else 1
    assert len(caught) >= floor, (
        f"{name} ({MUTATIONS[name].breaks}) was caught by {len(caught)} of {len(seeds)} seeds; "
        f"the simulator must catch it in at least {floor}"
    )
