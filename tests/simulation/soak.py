"""A long run of the simulator, for a night: seeds split over processes, one summary.

    .venv/bin/python -m tests.simulation.soak 0-199999 --jobs 2
    .venv/bin/python -m tests.simulation.soak 5000 --mutation halt-min-age-zero
    .venv/bin/python -m tests.simulation.soak 20000-79999 --minutes 30 --coverage

Prints progress every ``--every`` seeds, then the summary ``runner.summarize`` gives (one line
per invariant, with seeds and a replay command), and with ``--coverage`` the table of where
faults landed. ``--minutes`` stops starting seeds when the time is up. Exits 1 if any seed
broke the promise (or, with ``--mutation``, 1 if none caught it). ``SIM_ACTORS``,
``SIM_FAULTS`` and ``SIM_STEPS`` narrow the cast as for the test. ``scripts/sim-sweep`` runs
this and the PostgreSQL lane on fresh seeds. See docs/simulation.md.
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


def _run(
    bounds: tuple[int, int], mutation: str, until: float | None
) -> tuple[list, dict[str, int], int]:
    _setup()
    from .runner import run_seeds

    env = dict(os.environ, SIM_MUTATION=mutation) if mutation else None
    # ``until`` is a wall-clock time: each process's monotonic clock is its own.
    deadline = None if until is None else time.monotonic() + (until - time.time())
    findings, coverage = run_seeds(range(*bounds), env, until=deadline)
    return findings, coverage, coverage.get("seeds run", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation.soak")
    parser.add_argument("seeds", help='"5000" (seeds 0-4999) or "20000-29999"')
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--mutation", default="", help="a break of mutations.py to hunt with")
    parser.add_argument("--every", type=int, default=1000, help="seeds per chunk (progress)")
    parser.add_argument(
        "--minutes", type=float, default=0, help="stop starting seeds after this long (0: never)"
    )
    parser.add_argument(
        "--coverage", action="store_true", help="print where faults landed (the coverage table)"
    )
    args = parser.parse_args(argv)
    _setup()
    from .coverage import table
    from .runner import parse_seeds, summarize

    seeds = parse_seeds(args.seeds)
    chunks = [
        (lo, min(lo + args.every, seeds.stop)) for lo in range(seeds.start, seeds.stop, args.every)
    ]
    findings: list = []
    coverage: dict[str, int] = {}
    done, began = 0, time.monotonic()
    until = time.time() + 60 * args.minutes if args.minutes else None
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = pool.map(_run, chunks, [args.mutation] * len(chunks), [until] * len(chunks))
        for found, covered, n in runs:
            findings += found
            done += n
            for key, count in covered.items():
                coverage[key] = coverage.get(key, 0) + count
            if not n:
                continue  # a chunk begun after the time was up
            rate = done / max(1e-9, time.monotonic() - began)
            print(
                f"{done}/{len(seeds)} seeds, {len(findings)} broke the promise "
                f"({rate:.0f} seeds/s)",
                flush=True,
            )
    findings.sort(key=lambda f: f.seed)
    if done < len(seeds):
        print(f"time is up: {done} of {len(seeds)} seeds ran (each chunk's first ones)")
    if args.coverage:
        print(table(coverage, done))
    if findings:
        print(summarize(findings, done))
    elif done == len(seeds):
        print(f"seeds {seeds.start}-{seeds.stop - 1} kept the promise")
    else:
        print(f"the {done} seeds that ran kept the promise")
    if args.mutation:
        return 0 if findings else 1
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
