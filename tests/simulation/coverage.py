"""Which (record kind, fault) pairs a seed reaches, and the aim that makes rare ones come up
(issue 43).

A crash or a store failure matters where it lands relative to a journal write: before the
write (nothing of it exists), right after it (the record exists, nothing the writer meant to
do next does), or at the write itself when the store fails before its commit or after it (the
writer does not know which). So the net's coverage is counted per *record kind* (the record's
name up to its first id: ``tool``, ``approval``, ``deadline``, ``run:cancelled``…) and per
*fault*:

* ``crash before``: a process dies at the store call that would write the record;
* ``crash after``: it dies at its next point after writing it (a failpoint, a tool's body, its
  next store call), with nothing written since;
* ``store before`` / ``store after``: the store call writing it fails before its commit
  (nothing written) or after (written, and the writer hears an error).

Luck reaches a common kind's pairs and misses a rare one's: a record written in few seeds
(a saga's ``run:compensated``, a deadline's step) is seldom the record a random fault lands
next to. So each seed also **aims** (the ``cover`` fault, drawn from a stream of its own,
``cover:<seed>``): at each write a process of the main phase comes to, with odds that grow
with the rarity of the kinds it writes (``SHARES``), one of the four faults lands next to it,
up to three times a seed (and three more at the rules casts' kinds, ``RULES_KINDS``); and
two (kind, fault) pairs the seed targets, rare kinds more often, land at a write of their
kind when one comes (in the main phase, or the first drain of the quiet phase, where
recovery's workers write what the main phase seldom does). A seed without the ``cover``
fault draws nothing else differently.

The sweep's table (``table``) says in how many seeds each pair was reached; docs/simulation.md
gives it for CI's seeds.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_agents.engine import names

FAULTS = ("crash before", "crash after", "store before", "store after")

# Store calls that write journal records, and where their names are.
WRITES = frozenset({"insert", "finish_run", "finish_run_with", "start_run", "start_or_load"})

# Names whose kind is the whole name or the part before their id. ``@spend/...`` and the other
# evidence records are kinds of their own.
_WHOLE = (
    names.HEADER,
    names.RUN_START,
    names.RUN_COMPLETE,
    names.RUN_CANCELLED,
    names.RUN_COMPENSATED,
    names.SAGA_ABORT,
    names.FORK_DONE,
    names.FORK,
)

# The share of CI's seeds (0-599) whose processes write each kind in the main phase or later,
# measured (docs/simulation.md): the aim's odds at a write go with the kind's rarity. A kind
# not listed (new, or the rules casts') counts as written in one seed in twenty.
SHARES: Mapping[str, float] = {
    "run:cancelled": 0.035,
    "input": 0.063,
    "compensate": 0.087,
    "receiving": 0.10,
    "ack": 0.12,
    "step": 0.16,
    "signal": 0.17,
    "waited": 0.17,
    "message": 0.17,
    "@late": 0.20,
    "run:compensated": 0.21,
    "saga:abort": 0.24,
    "turn": 0.24,
    "answer": 0.18,  # (0.26 measured: aimed harder, its crash after is rare)
    "approval": 0.27,
    "@unknown": 0.29,
    "user": 0.30,
    "event": 0.48,
    "@spend": 0.49,
    "wait": 0.54,
    "child": 0.54,
    "fork:done": 0.58,
    "@drift": 0.58,
    "fork": 0.61,
    "run:complete": 0.72,
    "attempt": 0.79,
    "@takeover": 0.80,
    "tool": 0.91,
    "model": 0.95,
    "run:start": 1.0,
    "@journal": 1.0,
}
# The rules casts' kinds (issue 42): a rules seed writes them many times, so their odds are
# those of a kind written in one seed in three, from a budget of their own (aims at them
# never take the budget the other kinds' rare pairs need).
RULES_KINDS: Mapping[str, float] = {"rule": 0.3, "deadline": 0.3}
# Aimed faults a seed may spend, and the odds at a write of a kind every seed writes: a
# kind's odds grow with the square of its rarity (a common kind is written many times a
# seed, a rare one once or twice), up to ``MOST``.
BUDGET = 3
BASE = 0.008
MOST = 0.8
# Besides, each seed picks ``TARGETS`` pairs of its own up front, a kind drawn with odds that
# go with its rarity (a kind in one seed in ten ten times as often as one every seed writes)
# and a fault from the four, and lands that fault at a write of that kind with odds
# ``TARGET_ODDS`` each time one comes (not always at the first). Luck alone left pairs of
# common kinds at a handful of seeds in 1,200, a few at none when the world changed.
TARGETS = 2
TARGET_ODDS = 0.7


def kind(name: str) -> str:
    """A record name's kind: ``tool:c1.2`` -> ``tool``, ``@spend/model:3`` -> ``@spend``."""
    if name in _WHOLE:
        return name
    if name.startswith("@"):
        return name.split("/", 1)[0]
    head, sep, _ = name.partition(":")
    return head if sep else name


def written(store_call: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of the records a store call writes (none for a call that writes none)."""
    if store_call not in WRITES:
        return ()
    if store_call in ("insert", "finish_run"):
        return (kind(str(args[1])),) if len(args) > 1 else ()
    if store_call == "finish_run_with":
        records = args[1] if len(args) > 1 else kwargs.get("records", ())
    else:
        records = kwargs.get("records", ())
    return tuple(dict.fromkeys(kind(n) for n, _ in records))


def took(store_call: str, result: Any) -> bool:
    """Whether a write call wrote its records (a record already there, a lost fence: no)."""
    if store_call in ("insert", "finish_run"):
        return bool(result and result[1])
    if store_call in ("finish_run_with", "start_run"):
        return result is not None
    if store_call == "start_or_load":
        return bool(result and result[0] is not None)
    return False


def odds(kinds: Iterable[str]) -> float:
    """The odds that an aimed fault lands at a write of these kinds."""
    shares = {**SHARES, **RULES_KINDS}
    return min(MOST, max((BASE / shares.get(k, 0.05) ** 2 for k in kinds), default=0.0))


@dataclass
class Aim:
    """A seed's aimed faults (issue 43): at each write a process of the main phase comes to,
    with ``odds`` of its kinds, one of ``faults`` lands next to it — a crash at the write, a
    store failure before or after its commit, or a crash at the writer's next point — until
    ``left`` are spent. Its draws come from a stream of its own (``cover:<seed>``)."""

    rng: random.Random
    faults: tuple[str, ...]
    left: int = BUDGET
    left_rules: int = BUDGET
    targets: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.faults:
            return
        pool = sorted(SHARES)
        weights = [1 / SHARES[k] for k in pool]
        for _ in range(TARGETS):
            [target] = self.rng.choices(pool, weights)
            self.targets.append((target, self.rng.choice(self.faults)))

    def at_write(self, kinds: tuple[str, ...], *, targets_only: bool = False) -> str:
        """The fault aimed at this write ("" for none)."""
        for target in self.targets:
            if target[0] in kinds and self.rng.random() < TARGET_ODDS:
                self.targets.remove(target)
                return target[1]
        rules = bool(kinds) and all(k in RULES_KINDS for k in kinds)
        if targets_only or not (self.left_rules if rules else self.left):
            return ""
        if not kinds or not self.faults:
            return ""
        if self.rng.random() >= odds(kinds):
            return ""
        if rules:
            self.left_rules -= 1
        else:
            self.left -= 1
        return self.rng.choice(self.faults)


def draw(seed: int, faults: frozenset[str]) -> Aim | None:
    """The seed's aim (None without the ``cover`` fault), aiming the kinds of faults the seed
    has: crashes with ``crash``, store failures with ``store``."""
    if "cover" not in faults:
        return None
    kinds = tuple(
        f for f in FAULTS if ("store" in faults if f.startswith("store") else "crash" in faults)
    )
    return Aim(random.Random(f"cover:{seed}"), kinds)


WRITTEN = "kind written: "


def pair(kind_: str, fault: str) -> str:
    return f"cover: {kind_} / {fault}"


def table(coverage: Mapping[str, int], seeds: int) -> str:
    """The sweep's table: per kind, in how many seeds each fault landed next to it."""
    rows = sorted(
        {key.split(": ", 1)[1].rsplit(" / ", 1)[0] for key in coverage if key.startswith("cover: ")}
        | set(SHARES)
        | set(RULES_KINDS)
    )
    width = max(len(r) for r in rows)
    lines = [f"faults next to each record kind, in seeds of {seeds}:"]
    lines.append(f"  {'kind':{width}s}  " + "  ".join(f"{f:>12s}" for f in FAULTS))
    for row in rows:
        cells = [coverage.get(pair(row, f), 0) for f in FAULTS]
        lines.append(f"  {row:{width}s}  " + "  ".join(f"{c:12d}" for c in cells))
    missed = [(r, f) for r in rows for f in FAULTS if not coverage.get(pair(r, f))]
    lines.append(
        f"  {len(rows) * len(FAULTS) - len(missed)} of {len(rows) * len(FAULTS)} pairs reached"
        + (": missed " + ", ".join(f"{r} / {f}" for r, f in missed[:12]) if missed else "")
    )
    return "\n".join(lines)


def unreached(coverage: Mapping[str, int], seeds: int) -> list[str]:
    """The pairs no fault landed at, of the kinds written in at least one seed in a hundred."""
    common = [
        key[len(WRITTEN) :]
        for key, n in coverage.items()
        if key.startswith(WRITTEN) and n >= seeds / 100
    ]
    return [f"{k} / {f}" for k in sorted(common) for f in FAULTS if not coverage.get(pair(k, f))]
