"""The README's site, driven by Celery workers: journal records per second of the site the
packaging test builds (``django-admin startproject mysite`` with the README's "Add it to your
site" blocks applied as written), against the configuration docs/celery.md's table was
measured with (``bench/throughput.py``'s: ``tests/settings.py`` with ``CONN_MAX_AGE = 600``
and ``CELERY_DB_REUSE_MAX = 1000``), in interleaved rounds. Four configurations:

* ``readme``: the site as the packaging test builds it (startproject leaves ``DEBUG = True``);
* ``readme-nodebug``: the same with ``DEBUG = False``, as a site is deployed;
* ``readme-before``: that, with the database settings the README's block lacked before issue
  44 (Django's and Celery's defaults: a connection per task);
* ``celery.md``: ``bench/throughput.py``'s configuration.

A batch is ``--runs`` runs of 10 model turns (9 calling a no-op read-only tool; ScriptedModel,
``durability="sync"``) started at once in the configuration's own settings (a subprocess) and
driven by its own ``--workers`` worker processes (threads pool, ``--concurrency`` threads each;
docs/celery.md's table: 2 x 4): records / seconds from the first start to the last run
finished. Every worker of every configuration runs throughout, idle when not its turn. Within
a round the configurations take turns, in an order rotated each round, each batch preceded and
followed by the raw rate: one connection's autocommit INSERTs of a ~1 KB row for 2 s
(``bench/throughput.py``'s yardstick; a batch's ratio is against the mean of the two). Prints
each batch, then per configuration the median and range over the rounds of records/s, of the
ratio to raw, and of its records/s over ``celery.md``'s in the same round; one RESULT line per
configuration.

    .venv/bin/python bench/site_throughput.py [--rounds 9] [--runs 200] [--workers 2]
        [--concurrency 4]

The sites use this checkout's installed package (the packaging test installs the wheel built
from it into a fresh virtualenv: the same code) and the bench database ``DA_BENCH_DB``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from _setup import BENCH_DB, PG, ROOT, setup_django
from throughput import BROKER, raw_rate

sys.path.insert(0, str(ROOT))

from tests.support.readme_site import apply_readme

AGENTS_MODULE = '''
import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

STEPS = 10


@da.tool(read_only=True)
def noop(n: int) -> int:
    """Do nothing."""
    return n


# bench/bench_agents.py's run: 10 turns, 9 of them calling the tool. Named as the README's
# webhook block names its agent.
support = da.Agent(
    "support",
    ScriptedModel(
        [scripted.calls(scripted.call("noop", {"n": i})) for i in range(STEPS - 1)]
        + [scripted.text("done")]
    ),
    "Benchmark.",
    [noop],
    max_turns=STEPS + 1,
)
'''

# The README's block before issue 44 set none of these: Django's and Celery's defaults.
BEFORE = """
# --- the README's block before issue 44: Celery's default database connections ---
DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
del CELERY_DB_REUSE_MAX
"""

# Runs a batch in a configuration's own settings: bench/throughput.py's drive_batch.
BATCH = """
import json, sys
import django
django.setup()
from throughput import drive_batch
records, elapsed = drive_batch(sys.argv[1], int(sys.argv[2]))
print(json.dumps({"records": records, "elapsed": elapsed}))
"""


@dataclass
class Config:
    name: str
    agent: str
    queue: str
    env: dict[str, str]
    celery_app: str
    cwd: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


def make_site(root: Path, name: str, queue: str, *, before: bool, debug: bool) -> Path:
    """A ``startproject`` site with the README's blocks, on the bench database and broker;
    ``debug``: as startproject leaves it (``DEBUG = True``), else as deployed."""
    site = root / name
    site.mkdir()
    django_admin = Path(sys.executable).parent / "django-admin"
    subprocess.run([str(django_admin), "startproject", "mysite", "."], cwd=site, check=True)
    (site / "myapp").mkdir()
    (site / "myapp" / "__init__.py").write_text("")
    (site / "myapp" / "agents.py").write_text(AGENTS_MODULE)
    apply_readme(site, skip=("myapp/agents.py",))  # its own agents: the benchmark's run
    with (site / "mysite" / "settings.py").open("a") as f:
        if before:
            f.write(BEFORE)
        if not debug:
            f.write("\n# --- deployed: DEBUG off (Django then keeps no log of queries) ---\n")
            f.write("DEBUG = False\n")
        f.write(
            f"""
# --- the benchmark's environment (as the packaging test's: its database and queue) ---
DATABASES["default"].update({{"ENGINE": "django.db.backends.postgresql",
    "NAME": {BENCH_DB!r}, "USER": {PG["user"]!r}, "HOST": {PG["host"]!r},
    "PORT": {PG["port"]!r}}})
CELERY_BROKER_URL = {BROKER!r}
DURABLE_AGENTS["CELERY_QUEUE"] = {queue!r}
"""
        )
    return site


def clean_env(**extra: str) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DA_", "DJANGO_", "PYTHONPATH", "CELERY_"))
    }
    return {**keep, **extra}


def start_workers(config: Config, workers: int, concurrency: int) -> None:
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    for i in range(workers):
        with (logs / f"{config.queue}-w{i}.log").open("wb") as log:
            config.workers.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "celery", "-A", config.celery_app, "worker"),
                        *("-Q", config.queue, "--pool", "threads", "-c", str(concurrency)),
                        *("-n", f"w{i}-{config.queue}@%h", "-l", "warning"),
                        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                    ],
                    cwd=config.cwd,
                    env=config.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )


def batch(config: Config, runs: int) -> tuple[int, float]:
    """A batch in the configuration's settings: (journal records, seconds)."""
    for w in config.workers:
        if w.poll() is not None:
            raise SystemExit(f"{config.name}: a worker exited; see {config.queue}-w*.log")
    out = subprocess.run(
        [sys.executable, "-c", BATCH, config.agent, str(runs)],
        cwd=config.cwd,
        env=config.env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{config.name}: batch failed\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return int(result["records"]), float(result["elapsed"])


def spread(values: list[float], digits: int = 2) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    setup_django()  # the bench database, migrated (the sites' schema is the same)

    root = Path(tempfile.mkdtemp(prefix="da-site-bench-"))
    tag = uuid.uuid4().hex[:8]
    path = f"{ROOT}{os.pathsep}{ROOT / 'bench'}"
    configs: list[Config] = []
    for name, before, debug in (
        ("readme", False, True),
        ("readme-nodebug", False, False),
        ("readme-before", True, False),
    ):
        queue = f"da-site-{name}-{tag}"
        site = make_site(root, name, queue, before=before, debug=debug)
        configs.append(
            Config(
                name,
                "support",
                queue,
                clean_env(
                    DJANGO_SETTINGS_MODULE="mysite.settings",
                    PYTHONPATH=f"{site}{os.pathsep}{path}",
                    # What the README tells the operator to export for the webhook block.
                    WEBHOOK_SECRET=secrets.token_urlsafe(32),
                ),
                "mysite",
                site,
            )
        )
    queue = f"da-site-celerymd-{tag}"
    configs.append(
        Config(
            "celery.md",
            "bench-steps",
            queue,
            clean_env(  # bench/throughput.py's environment: docs/celery.md's table
                DJANGO_SETTINGS_MODULE="tests.settings",
                DA_PG_NAME=BENCH_DB,
                DA_DISPATCH="celery",
                DA_CELERY_QUEUE=queue,
                DA_BROKER_URL=BROKER,
                DA_EXTRA_AGENTS="bench_agents.steps",
                DA_CONN_MAX_AGE="600",
                DA_CELERY_DB_REUSE_MAX="1000",
                PYTHONPATH=path,
            ),
            "tests.celery_app",
            ROOT,
        )
    )
    # A SIGTERM (a timeout) stops the workers too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    try:
        for config in configs:
            start_workers(config, args.workers, args.concurrency)
        time.sleep(3)  # workers connect
        for config in configs:
            batch(config, max(10, args.runs // 10))  # warm up: imports, plans
        raw = raw_rate(2.0)
        print(f"{'round':>5}  {'configuration':14} {'records/s':>9} {'raw/s':>7} {'ratio':>6}")
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for config in order:
                records, elapsed = batch(config, args.runs)
                after = raw_rate(2.0)
                rate, yardstick = records / elapsed, (raw + after) / 2
                config.rates.append(rate)
                config.ratios.append(rate / yardstick)
                print(
                    f"{r + 1:>5}  {config.name:14} {rate:9.0f} {yardstick:7.0f} "
                    f"{rate / yardstick:6.2f}",
                    flush=True,
                )
                raw = after
    finally:
        for config in configs:
            for w in config.workers:
                os.killpg(w.pid, signal.SIGTERM)
        for config in configs:
            for w in config.workers:
                w.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)

    load = os.getloadavg()
    print(
        f"\n{args.rounds} rounds of {args.runs} runs x 10 turns per configuration, "
        f"{args.workers} workers x {args.concurrency} threads each; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"
    )
    reference = configs[-1]
    for config in configs:
        against = [a / b for a, b in zip(config.rates, reference.rates, strict=True)]
        print(
            f"{config.name:14} records/s {spread(config.rates, 0)}; ratio to raw "
            f"{spread(config.ratios)}; records/s to celery.md's in the same round "
            f"{spread(against)}"
        )
    for config in configs:
        against = [a / b for a, b in zip(config.rates, reference.rates, strict=True)]
        print(
            f"RESULT site-throughput config={config.name} "
            f"records_per_s={statistics.median(config.rates):.0f} "
            f"raw_ratio={statistics.median(config.ratios):.2f} "
            f"raw_ratio_min={min(config.ratios):.2f} raw_ratio_max={max(config.ratios):.2f} "
            f"vs_celery_md={statistics.median(against):.2f}"
        )


if __name__ == "__main__":
    main()
