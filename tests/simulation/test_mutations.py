"""The mutation check's first half (``mutation_check.py`` says what it checks and why it
is split): each mutation over CI's fixed seeds, then over fresh seeds of this run."""

from __future__ import annotations

import pytest

from . import mutation_check as check
from .mutations import MUTATIONS


def test_every_mutation_has_a_floor_and_a_half():
    assert set(check.LEAST) == set(MUTATIONS)
    assert sorted(check.half(0) + check.half(1)) == sorted(MUTATIONS)


@pytest.mark.parametrize("name", check.half(0))
def test_the_simulator_catches_the_engine_broken_on_purpose(name):
    check.fixed(name)


@pytest.mark.parametrize("name", check.half(0))
def test_fresh_seeds_catch_it_too(name):
    check.fresh(name)
