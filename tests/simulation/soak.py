"""A long run of the simulator, for a night: seeds split over processes, one summary.

    .venv/bin/python -m tests.simulation.soak 0-199999 --jobs 2
    .venv/bin/python -m tests.simulation.soak 5000 --mutation halt-min-age-zero

Prints progress every ``--every`` seeds, then the summary ``runner.summarize`` gives (one line
per invariant, with seeds and a replay command). Exits 1 if any seed broke the promise (or,
with ``--mutation``, 1 if none caught it). ``SIM_ACTORS``, ``SIM_FAULTS`` and ``SIM_STEPS``
narrow the cast as for the test. See docs/simulation.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def _run(bounds: tuple[int, int], mutation: str) -> tuple[list, dict[str, int], int]:
    _setup()
    from .runner import run_seeds

    env = dict(os.environ, SIM_MUTATION=mutation) if mutation else None
    findings, coverage = run_seeds(range(*bounds), env)
    return findings, coverage, bounds[1] - bounds[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation.soak")
    parser.add_argument("seeds", help='"5000" (seeds 0-4999) or "20000-29999"')
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--mutation", default="", help="a break of mutations.py to hunt with")
    parser.add_argument("--every", type=int, default=1000, help="seeds per chunk (progress)")
    args = parser.parse_args(argv)
    _setup()
    from .runner import parse_seeds, summarize

    seeds = parse_seeds(args.seeds)
    chunks = [
        (lo, min(lo + args.every, seeds.stop)) for lo in range(seeds.start, seeds.stop, args.every)
    ]
    findings: list = []
    done, began = 0, time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for found, _, n in pool.map(_run, chunks, [args.mutation] * len(chunks)):
            findings += found
            done += n
            rate = done / max(1e-9, time.monotonic() - began)
            print(
                f"{done}/{len(seeds)} seeds, {len(findings)} broke the promise "
                f"({rate:.0f} seeds/s)",
                flush=True,
            )
    findings.sort(key=lambda f: f.seed)
    if findings:
        print(summarize(findings, len(seeds)))
    else:
        print(f"seeds {seeds.start}-{seeds.stop - 1} kept the promise")
    if args.mutation:
        return 0 if findings else 1
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
