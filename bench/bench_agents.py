"""Agents the benchmarks' worker processes drive (loaded through DA_EXTRA_AGENTS)."""

from __future__ import annotations

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

STEPS = 10


@da.tool(read_only=True)
def noop(n: int) -> int:
    """Do nothing."""
    return n


_SCRIPT = [scripted.calls(scripted.call("noop", {"n": i})) for i in range(STEPS - 1)] + [
    scripted.text("done")
]

# The same run in both durability modes (bench/throughput.py measures both in one run).
steps = [
    da.Agent(
        "bench-steps" if durability == "sync" else f"bench-steps-{durability}",
        ScriptedModel(_SCRIPT),
        "Benchmark.",
        [noop],
        max_turns=STEPS + 1,
        durability=durability,
    )
    for durability in ("sync", "async")
]
