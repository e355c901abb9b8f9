"""Running seeds: which ones (``SIM_SEEDS``, ``SIM_SEED``), with which cast
(``SIM_ACTORS``, ``SIM_FAULTS``, ``SIM_STEPS``), and how a failure is reported."""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from dataclasses import dataclass, replace

from .scenario import simulate
from .world import Config, Violation, World

DEFAULT_SEEDS = 1200
ALL_ACTORS = Config(0).actors
ALL_FAULTS = Config(0).faults


def parse_seeds(text: str | None, default: int = DEFAULT_SEEDS) -> range:
    """``"5000"``: seeds 0-4999; ``"1000-1999"``: that range, both ends included."""
    if not text:
        return range(default)
    if "-" in text:
        lo, hi = text.split("-", 1)
        return range(int(lo), int(hi) + 1)
    return range(int(text))


def _narrow(text: str | None, everything: frozenset[str], what: str) -> frozenset[str]:
    """``"driver,person"`` keeps those; ``"-stepper"`` drops one; unset keeps all."""
    if text is None:
        return everything
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = {n.lstrip("-") for n in names} - everything
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; choose from {sorted(everything)}")
    if names and all(n.startswith("-") for n in names):
        return everything - {n[1:] for n in names}
    return frozenset(names)


def config_for(seed: int, env: dict[str, str] | None = None) -> Config:
    env = dict(os.environ if env is None else env)
    return Config(
        seed=seed,
        steps=int(env.get("SIM_STEPS") or Config(0).steps),
        actors=_narrow(env.get("SIM_ACTORS"), ALL_ACTORS, "actors"),
        faults=_narrow(env.get("SIM_FAULTS"), ALL_FAULTS, "faults")
        if "SIM_FAULTS" in env
        else ALL_FAULTS,
        mutation=env.get("SIM_MUTATION", ""),
    )


def replay_command(config: Config) -> str:
    env = [f"SIM_SEED={config.seed}"]
    if config.actors != ALL_ACTORS:
        env.append(f"SIM_ACTORS={','.join(sorted(config.actors))}")
    if config.faults != ALL_FAULTS:
        env.append(f"SIM_FAULTS={','.join(sorted(config.faults)) or '-crash,-stall'}")
    if config.steps != Config(0).steps:
        env.append(f"SIM_STEPS={config.steps}")
    if config.mutation:
        env.append(f"SIM_MUTATION={config.mutation}")
    test = "test_simulation.py"
    if config.store != "memory":  # a PostgreSQL seed replays in its lane's own test
        env.insert(0, f"SIM_STORE={config.store}")
        test = "test_postgres_lane.py"
    return (
        " ".join(env) + f" .venv/bin/python -m pytest tests/simulation/{test} -k replay -s -q"
        " -p no:cacheprovider"
    )


def digest(world: World) -> str:
    """One hash over everything a schedule did: its trace, ledger and findings."""
    h = hashlib.sha256()
    for line in world.format_trace():
        h.update(line.encode())
        h.update(b"\n")
    for e in world.ledger:
        h.update(repr((e.run, e.call, e.tool, sorted(e.args.items()), e.effect, e.t)).encode())
    for v in world.violations:
        h.update(str(v).encode())
    return h.hexdigest()


def fail_if_broken(world: World, label: str = "") -> None:
    """Fail the test with a seed's violations and its replay line (nothing if it kept the
    promise)."""
    import pytest

    if world.violations:
        pytest.fail(
            f"seed {world.config.seed} broke the promise{label}:\n"
            + "\n".join(str(v) for v in world.violations)
            + f"\nreplay: {replay_command(world.config)}",
            pytrace=False,
        )


@dataclass
class Finding:
    seed: int
    config: Config
    violations: list[Violation]


def run_seeds(
    seeds: range,
    env: dict[str, str] | None = None,
    *,
    store: str = "memory",
    until: float | None = None,
) -> tuple[list[Finding], dict[str, int]]:
    """Run each seed, collecting findings and coverage; with ``until`` (a ``time.monotonic``
    reading), stop before the first seed that would start after it. ``coverage["seeds run"]``
    says how many ran."""
    findings: list[Finding] = []
    coverage: dict[str, int] = defaultdict(int)
    for seed in seeds:
        if until is not None and time.monotonic() >= until:
            break
        coverage["seeds run"] += 1
        config = replace(config_for(seed, env), store=store)
        world = simulate(config)
        for key, n in world.coverage().items():
            coverage[key] += n
        if world.violations:
            findings.append(Finding(seed, config, list(world.violations)))
    return findings, dict(coverage)


def summarize(findings: list[Finding], total: int) -> str:
    """One line per invariant and hole: how many seeds, which ones, and how to replay one."""
    groups: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        for key in sorted({(v.invariant, v.hole) for v in f.violations}):
            groups[key].append(f)
    lines = [f"{len(findings)} of {total} seeds broke the promise:"]
    for (invariant, hole), found in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        seeds = ", ".join(str(f.seed) for f in found[:8])
        example = next(v for v in found[0].violations if (v.invariant, v.hole) == (invariant, hole))
        lines.append(
            f"  {invariant} (hole {hole}): {len(found)} seeds, e.g. {seeds}\n"
            f"      {example.detail.splitlines()[0]}\n"
            f"      replay: {replay_command(found[0].config)}"
        )
    return "\n".join(lines)
