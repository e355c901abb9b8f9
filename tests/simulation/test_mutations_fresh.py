"""Each mutation of ``mutations.py`` over seeds nobody ran before, each run of the suite
(issue 43): a floor met on CI's fixed seeds (``test_mutations.py``) may be a schedule the
simulator happens to know, not a break it finds. A file of its own, so that the suite's two
workers share the mutations' time.
"""

from __future__ import annotations

import math
import os

import pytest

from .mutations import MUTATIONS
from .runner import config_for, replay_command
from .scenario import simulate
from .test_mutations import LEAST, MORE_SEEDS, SEEDS

FRESH = 80
# A fresh count this unlikely, were the mutation caught at the rate its floor stands for,
# says the fixed seeds' catches were luck: the test fails.
UNLIKELY = 1e-4


def at_most(caught: int, n: int, p: float) -> float:
    """The chance of ``caught`` catches or fewer in ``n`` seeds, each caught with odds ``p``."""
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(caught + 1))


@pytest.mark.parametrize("name", sorted(n for n in MUTATIONS if n not in MORE_SEEDS))
def test_fresh_seeds_catch_it_too(name):
    """Each mutation over seeds of this run of the suite (``SIM_FRESH``, printed at the end of
    the run), judged by the rate its floor stands for (``LEAST`` of CI's seeds: half the
    measured catches): fresh seeds catching it far more rarely than that fail the test. A
    mutation whose floor expects fewer than a few catches in ``FRESH`` seeds cannot fail
    here; its catches are printed all the same."""
    from tests.conftest import FRESH_SEEDS, PG_FRESH_SEEDS

    index = sorted(MUTATIONS).index(name)
    base = int(os.environ.get("SIM_FRESH") or 1_000_000) + FRESH_SEEDS + PG_FRESH_SEEDS
    seeds = range(base + index * FRESH, base + (index + 1) * FRESH)
    env = dict(os.environ, SIM_MUTATION=name)
    reaches = MUTATIONS[name].reaches
    caught = [
        seed
        for seed in seeds
        if (reaches is None or reaches(seed)) and simulate(config_for(seed, env)).violations
    ]
    rate = LEAST[name] / SEEDS
    chance = at_most(len(caught), len(seeds), rate)
    example = replay_command(config_for(caught[0], env)) if caught else "(no seed caught it)"
    print(
        f"\n{name}: fresh seeds {seeds.start}-{seeds.stop - 1} caught it {len(caught)} times "
        f"(its floor stands for {rate * len(seeds):.1f}); e.g. {example}"
    )
    assert chance >= UNLIKELY, (
        f"{name} was caught by {len(caught)} of fresh seeds {seeds.start}-{seeds.stop - 1}, "
        f"where its floor ({LEAST[name]} of {SEEDS}) stands for {rate * len(seeds):.1f}: "
        f"a chance of {chance:.1e}. The fixed seeds' catches are a schedule they know."
    )
