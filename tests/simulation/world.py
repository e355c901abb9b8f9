"""The simulated world of one seed: a store, a virtual clock, a ledger, processes and the
scheduler that interleaves them.

Every process runs real engine code in a greenlet of its own and hands the baton back to
the scheduler at each *point*: every store call, every failpoint, and inside every tool and
model call. The scheduler, driven by one seeded random stream, picks which process moves
next, how far the virtual clock advances, and where a process crashes or stalls. Nothing
runs concurrently with anything else and nothing the engine decides on reads the real clock
(the store's clock, the runtime's ``sleep`` and ``monotonic`` are the virtual one; uuids are
seeded), so one seed always replays one schedule.

A crash abandons a process where it stands: its greenlet is never resumed, so none of its
``finally`` blocks run and its lease stays in the store until it expires by the virtual
clock. A stall freezes a process (and its heartbeat) for longer than its lease, then lets it
continue. Leases are renewed by ``SimHeartbeat`` as the clock advances, for every process
that is neither crashed nor stalled.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import random
import sys
import threading
import time
import traceback
import uuid as _uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import greenlet
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from durable_agents.engine import failpoints, leases, lifecycle, loop, runtime, throttle
from durable_agents.engine.approvals import decision_bytes, decision_name
from durable_agents.engine.errors import DurableAgentsError, LeaseLost, Pause, StorageError
from durable_agents.engine.limits import parse_rate
from durable_agents.engine.memstore import InMemoryStore
from durable_agents.engine.ports import HALTED, THROTTLED
from durable_agents.engine.records import encode
from durable_agents.engine.retry import RetryPolicy
from tests.support.signing import public_text

from . import coverage as cover
from . import mutations

EPOCH = 1_700_000_000.0
# Virtual seconds the clock may move between two scheduling steps: at most a third of the
# lease, so a healthy process's heartbeat always renews in time.
STEP_SECONDS = (0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
STALL_STEP_SECONDS = (0.0, 0.25, 0.5, 1.0)

# The world whose processes are running; tools and the model reach it through this.
CURRENT: World | None = None
# The simulated model's ``model_id``: the name a site's model rate knows it by.
MODEL_ID = "sim-model"


class Killed(BaseException):
    """Thrown into a crashed process at the end of a seed, only to unwind its greenlet."""


@dataclass(frozen=True)
class Imported:
    """An inert import as written: its source, row status, records, and the status of each
    of its approval requests and halts."""

    source: str
    status: str
    records: tuple[tuple[str, str], ...]
    requests: dict[str, str]
    halts: dict[tuple[str, str], str]


def imported_state(store: Any, run_id: str, source: str) -> Imported:
    """What an import holds now, read from the raw store (``imports_stay_inert``)."""
    row = store.get_run(run_id)
    return Imported(
        source=source,
        status=row.status if row is not None else "missing",
        records=tuple((e.name, e.data) for e in store.load(run_id)),
        requests={
            r.call_id: r.status for r in store.list_approval_requests(status=None, run_id=run_id)
        },
        halts={
            (h.op_id, str(h.attempt)): h.status
            for h in store.list_halts(run_id=run_id, status=None)
        },
    )


@dataclass(frozen=True)
class Config:
    """What one simulated schedule may contain. ``actors`` and ``faults`` narrow it."""

    seed: int
    steps: int = 400
    actors: frozenset[str] = frozenset(
        {
            "client",
            "driver",
            "recovery",
            "person",
            "deployer",
            "webhook",
            "stepper",
            "answerer",
            "replayer",
            "forker",
            "importer",
            "operator",
        }
    )
    faults: frozenset[str] = frozenset(
        {
            "crash",
            "stall",
            "split",
            "slow",
            "broker",
            "heart",
            "store",
            "large",
            "kill",
            "long",
            "skew",
            "sigterm",
            "cover",
        }
    )
    drivers: int = 2
    persons: int = 2
    ttl: float = 30.0
    max_crashes: int = 3
    max_stalls: int = 2
    # The odds that a cast with people gates refunds behind a quorum (``agent.QUORUM``),
    # drawn from a stream of the seed's own so that the other draws stay as they were.
    quorum: float = 0.3
    # The odds that the agent runs two tool calls of a turn at once (``tool_concurrency=2``,
    # ``SimPool``), drawn the same way.
    concurrent: float = 0.3
    # The odds that the agent runs under limits (``agent.Limits``: its runs at once, a tool's
    # calls at once or rate, the model's rate), drawn the same way (``limits:<seed>``).
    limits: float = 0.4
    # The odds that a cast with the tree canceller has its errands book under a daily rate
    # already spent (``agent.Deploy.digest``: their sub-runs wait, throttled, a day), drawn
    # the same way (``digest:<seed>``).
    digest: float = 0.3
    # The odds that a cast with people and the answerer gates refunds by approval rules
    # (issue 42: ``rulecast.py``: thresholds on the amount, deadlines, deputies), drawn
    # the same way (``rules:<seed>``).
    rules: float = 0.4
    # A deliberate break of the engine for the length of the seed (``mutations.py``), to show
    # the invariants catch it: "" runs the engine as it is.
    mutation: str = ""
    # The store the world runs on: "memory" (``InMemoryStore``), "postgres" (``DjangoStore``
    # on the test database, a session per process: ``pg_lane.py``) or "postgres-expiry"
    # (the same with instant takeover off: leases are taken over on expiry only).
    store: str = "memory"


# The group a quorum cast's refunds are approved by (``agent.QUORUM``).
PAYOUTS = "payouts"


@dataclass(frozen=True)
class Signed:
    """What a person signed (``da.decision_bytes``): a decision on one call of one start
    of one run, with the arguments they saw."""

    run_id: str
    call_id: str
    tool_name: str
    arguments: Any
    incarnation: str
    by: str
    approved: bool
    note: str

    def __hash__(self) -> int:
        return hash((self.run_id, self.call_id, self.by, self.approved, self.incarnation))


@dataclass
class Violation:
    invariant: str
    detail: str
    hole: str = "?"  # the hole this is an instance of, "new", or "?"

    def __str__(self) -> str:
        return f"[{self.invariant}] (hole {self.hole}) {self.detail}"


@dataclass
class Effect:
    """One invocation of a tool (or a journal step), as the outside world saw it."""

    seq: int
    t: float
    run: str  # the run that executed it (ctx.run_id)
    call: str  # its call id (or step name)
    tool: str
    args: dict[str, Any]
    key: str  # the idempotency key it carried
    value: Any  # what it returned (or raised)
    effect: bool  # the world changed (after any downstream dedupe by key)
    outcome: str  # "returned", "raised", "unknown" (effect made, then raised ToolOutcomeUnknown)
    pid: int
    # The store's last journal seq when the call began (handed to a pool: when handed over),
    # so a stop recorded before it (``seq <= entered``) came before the call.
    entered: int = 0
    # The seq of the attempt claim this process took for the call (0: none, a retry-safe
    # call): a run's own stop recorded after the claim finds the call in flight.
    claimed: int = 0


@dataclass
class Bill:
    pid: int
    run: str | None
    tokens: int
    lost: bool = False  # its process crashed: nobody could have recorded it


class Proc:
    """One process incarnation, running one operation for an actor."""

    def __init__(self, world: World, actor: Any, label: str, fn: Callable[[], Any]) -> None:
        world.pids += 1
        self.pid = world.pids
        self.world = world
        self.actor = actor
        self.label = label
        self.glet = greenlet.greenlet(run=lambda: world._op_main(self, fn), parent=world.main)
        self.point = "start"
        self.dead = False
        self.stalled_until = 0.0
        self.sleep_until = 0.0
        self.urgent = False
        self.exclusive = False  # runs to its end once started (crashes only)
        self.heart_dead = False  # its heartbeat thread died; the process goes on
        self.stopping = False  # its worker got SIGTERM (warm shutdown)
        self.requests_read: list[Any] = []  # approval requests its store calls returned
        self.claims: dict[str, int] = {}  # call -> the seq of the attempt it claimed last
        self.claim_times: dict[str, float] = {}  # call -> when it claimed it
        self.leased: list[str] = []
        self.capture: dict[str, list[Any]] | None = None
        self.attempt_at: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.outcome = ""
        self.run_id: str | None = None  # the run a driver was asked to drive
        # Its leases may have lapsed under it (a stall, a slow call, a dead heartbeat): the
        # limits it held were not its own any more (``World.work_begins``).
        self.lapsed = False
        self.permits: dict[str, list[float]] = {}  # a rate's key -> when it was granted one
        # A failpoint this process dies at, aimed by its actor (``World.move``).
        self.die_at: str | None = None
        # The kinds of the records the store call it stands at writes, and of those its last
        # write wrote (until its next store call returns): where a fault lands relative to
        # a journal write (``coverage.py``).
        self.writing: tuple[str, ...] = ()
        self.wrote: tuple[str, ...] = ()
        # An aimed fault waiting for its moment: a store failure at this write ("before" or
        # "after" its commit), a crash at the point after it.
        self.aimed_store = ""
        self.crash_after = False

    def ready(self, now: float) -> bool:
        return not self.dead and self.stalled_until <= now and self.sleep_until <= now

    def heart_alive(self, now: float) -> bool:
        return not self.dead and not self.heart_dead and self.stalled_until <= now


class SimStore:
    """The world's InMemoryStore, seen by processes: every call is a scheduling point."""

    def __init__(self, raw: InMemoryStore, world: World) -> None:
        self._raw = raw
        self._world = world

    def announce(self, event: str, details: dict[str, Any]) -> None:
        """The host's hook (``events.announce``): what a site's signals and its notification
        outbox hear. Not a store call: no scheduling point."""
        proc = self._world.current
        said = dict(details)
        if details.get("call_id"):
            # Which asking of the call it is about: a request asked again (other arguments,
            # a new start) is a new one, whose deadline starts afresh.
            request = self._raw.get_approval_request(details.get("run_id"), details["call_id"])
            if request is not None:
                said["_asked"] = (request.start_seq, encode(request.previous_arguments))
        self._world.announced.append((event, said, proc.pid if proc else 0))
        hook = getattr(self._raw, "announce", None)
        if hook is not None:  # the Django store's signals (the PostgreSQL lane)
            hook(event, details)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._raw, name)
        if name.startswith("_") or not callable(attr):
            return attr
        world = self._world

        def call(*args: Any, **kwargs: Any) -> Any:
            proc = world.current
            kinds = cover.written(name, args, kwargs)
            if proc is not None:
                proc.writing = kinds
            world._at_store(name, args)
            moved = _moved_run(name, args)
            before = self._raw.get_run(moved) if moved is not None else None
            asked = _moved_request(name, args)
            was = self._raw.get_approval_request(*asked) if asked is not None else None
            # Only records a drive is sure to come back for are split (see `_split_insert`):
            # a model turn, spend, `run:complete` (its row is left running, which recovery
            # hands over). `fork:done` makes a fork runnable, `run:cancelled` ends a run
            # that may be failed for good, and a person's `saga:abort` moves a paused run to
            # compensating: no drive is owed to any of them, so for them the atomic write is
            # the whole rule, and no store breaks it.
            split = (
                name in ("insert", "finish_run")
                and world.split_writes
                and bool(kwargs.get("run_changes"))
                and args[1] not in SPLIT_NEVER
            )
            fault = world.store_fault(name, kinds)
            if fault == "before":
                raise StorageError(
                    f"the database connection dropped before {name} committed (simulated)",
                    code="storage.unavailable",
                )
            if split:
                result = world._split_insert(self._raw, args, kwargs, release=name == "finish_run")
            elif name == "finish_run_with" and world.split_writes:
                result = world._split_finish(self._raw, args, kwargs)
            else:
                result = attr(*args, **kwargs)
            if proc is not None:
                proc.writing = ()
                proc.wrote = kinds if cover.took(name, result) else ()
                world.kinds_written.update(proc.wrote)
            world._after_store(name, args, kwargs, result)
            if moved is not None:
                world.check_move(moved, before, self._raw.get_run(moved), name)
            if asked is not None:
                world.check_request_move(asked, was, self._raw.get_approval_request(*asked), name)
            if fault == "after":
                raise StorageError(
                    f"the database connection dropped as {name} committed: the client never "
                    "heard back (simulated)",
                    code="storage.unavailable",
                )
            return result

        call.__name__ = name
        self.__dict__[name] = call
        return call


# The store calls that can change a run's status, and the run they change.
_MOVES_ROWS = (
    *("insert", "finish_run", "finish_run_with", "update_run"),
    *("start_run", "start_or_load", "create_run"),
)


def started(name: str, result: Any) -> bool:
    """Whether a store call created, leased and started a run (``start_or_load`` answers a
    pair: what it started, or what it read of a run that existed)."""
    if name == "start_run":
        return result is not None
    return name == "start_or_load" and result[0] is not None


def _moved_request(name: str, args: tuple[Any, ...]) -> tuple[str, str] | None:
    """The request a store call may change the status of: (run, call)."""
    if name == "save_approval_request" and args:
        return args[0].run_id, args[0].call_id
    if name == "set_approval_status" and len(args) >= 2:
        return str(args[0]), str(args[1])
    return None


def _moved_run(name: str, args: tuple[Any, ...]) -> str | None:
    if name not in _MOVES_ROWS or not args:
        return None
    first = args[0]
    return str(getattr(first, "run_id", first))


class SimHeartbeat:
    """Stands in for the engine's heartbeat thread: renews, as the virtual clock moves, the
    leases of processes that are alive and not stalled."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.entries: list[list[Any]] = []  # [lease, proc, next renewal]
        self.idle = threading.Event()
        self.idle.set()

    def add(self, lease: Any) -> None:
        self.entries.append([lease, self.world.current, self.world.now + lease.ttl / 3])

    def remove(self, lease: Any) -> None:
        self.entries = [e for e in self.entries if e[0] is not lease]

    def beat(self) -> None:
        now = self.world.now
        for entry in list(self.entries):
            lease, proc, due = entry
            if proc is None or not proc.heart_alive(now) or lease.lost.is_set() or now < due:
                continue
            lease.renew()
            entry[2] = now + lease.ttl / 3
            if not lease.lost.is_set() and lease.last_renewed == now:
                # The store said yes: by the world's record, ``proc`` holds the run's lease
                # until a ttl from now (``leases_exclusive``).
                self.world.holds_lease(lease.run_id, lease.token, proc, lease.ttl)


class SimPool:
    """Stands in for the loop's ``ThreadPoolExecutor`` (an agent with ``tool_concurrency >
    1``). A process has no threads here, so a call handed to the pool runs in the process's
    own greenlet, with its points: at once, or (drawn from a stream of the seed's own) left
    waiting until the driver hands over the next call or waits for one to finish. So the
    driver claims a second call either after the first one ran or before, and records their
    results after both. A waiting call is never held up by another call's body — calls run
    in the order they were handed over, as a real pool's idle threads start at once — only
    by the driver's claim of the next one. Calls a driver leaves in flight when it stops
    (its lease lost) run to their end when the pool closes, as a real pool's threads do; a
    crash anywhere takes the whole process, its pool's calls with it."""

    def __init__(self, max_workers: int) -> None:
        world = CURRENT
        assert world is not None
        self.world = world
        self.waiting: dict[Future[Any], Callable[[], Any]] = {}
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        w = self.world
        future: Future[Any] = Future()
        w.pools[future] = self
        self.submitted += 1
        if self.submitted > 1:  # the loop's pool is one batch: the first is not settled yet
            w.count("tool calls in flight together")
        # The call begins as it is handed over (a real pool's idle thread starts at once),
        # whenever the model lets its body run.
        entered = w.raw_seq()
        self.waiting[future] = lambda: w.entered_as(entered, fn, *args)
        if w.pool_rng.random() < 0.5:
            self.run_waiting()
        return future

    def run_waiting(self) -> None:
        while self.waiting:
            future, call = next(iter(self.waiting.items()))
            del self.waiting[future]
            try:
                value = call()
            except Exception as exc:  # what a worker thread hands back
                future.set_exception(exc)
            else:
                future.set_result(value)

    def __enter__(self) -> SimPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.run_waiting()  # ``shutdown(wait=True)``: the calls in flight finish


def sim_wait(fs: Any, timeout: Any = None, return_when: Any = None) -> Any:
    """``concurrent.futures.wait`` for ``SimPool``'s futures: the finished ones (in the
    order they were handed over, so a seed replays), after running the waiting ones."""
    futures = list(fs)
    world = CURRENT
    assert world is not None
    for pool in dict.fromkeys(world.pools[f] for f in futures if not f.done()):
        pool.run_waiting()
    return [f for f in futures if f.done()], [f for f in futures if not f.done()]


class _PollTime:
    """The ``time`` module as an MCP task's poller sees it: the process's wall clock, and
    a sleep that gives the baton back until the virtual clock reaches its end."""

    def __init__(self, world: World) -> None:
        self._world = world

    def time(self) -> float:
        return self._world.wall_time()

    def sleep(self, seconds: float) -> None:
        self._world.sleep(seconds)


class _Time:
    """The ``time`` module as the engine's wall-clock readers see it (``World.wall_time``)."""

    def __init__(self, world: World) -> None:
        self._world = world

    def time(self) -> float:
        return self._world.wall_time()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _VirtualMonotonic:
    """The ``time`` module as ``leases`` sees it: ``monotonic`` is the virtual clock."""

    def __init__(self, world: World) -> None:
        self._world = world

    def monotonic(self) -> float:
        return self._world.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _PerProcess:
    """``threading.local`` as a simulated process sees it: each process is a greenlet of
    one thread here, and a thread of its own (or a process) in production, so what the
    engine keeps per thread is kept per greenlet (``throttle._handing``)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[(greenlet.getcurrent(), name)]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[(greenlet.getcurrent(), name)] = value


class _UUID:
    """The ``uuid`` module as engine modules see it: uuid4 from the seed."""

    def __init__(self, world: World) -> None:
        self._world = world

    def uuid4(self) -> _uuid.UUID:
        return _uuid.UUID(int=self._world.uuid_rng.getrandbits(128), version=4)

    def __getattr__(self, name: str) -> Any:
        return getattr(_uuid, name)


def _store_label(name: str, args: tuple[Any, ...]) -> str:
    if not args:
        return name
    first = args[0]
    run_id = getattr(first, "run_id", first)
    if name in ("insert", "get") and len(args) > 1:
        return f"{name} {run_id} {args[1]}"
    if name == "finish_run_with" and len(args) > 1:
        return f"{name} {run_id} {' '.join(n for n, _ in args[1])}"
    if name == "save_halt":
        return f"save_halt {run_id} {first.op_id}"
    return f"{name} {run_id}"


FENCED_ROWS = frozenset({"save_halt", "save_approval_request"})
SPLIT_NEVER = frozenset({"fork:done", "run:cancelled", "saga:abort"})
HOT_PREFIXES = ("tool ", "fp ", "model ", "store:save_halt")
STORE_POINT = "store:"
WRITES = tuple(
    STORE_POINT + name
    for name in (
        "insert",
        "finish_run",
        "update_run",
        "create_run",
        "save_halt",
        "resolve_halt_row",
        "save_approval_request",
        "set_approval_status",
    )
)


class Hunt:
    """The faults added to hunt (issue 32), drawn from ``hunt:<seed>``: whether this seed
    has a slow tool call, a misbehaving broker, a heartbeat that dies while its driver
    lives, a store that fails calls."""

    def __init__(self, seed: int, faults: frozenset[str]) -> None:
        self.rng = random.Random(f"hunt:{seed}")
        draws = [self.rng.random() for _ in range(9)]
        self.slow = 2 if "slow" in faults and draws[0] < 0.5 else 0  # slow calls left
        self.broker = "broker" in faults and draws[1] < 0.3
        self.heart = "heart" in faults and draws[2] < 0.2
        self.store = "store" in faults and draws[3] < 0.3
        # A larger cast: a third driver and up to two more runs.
        self.large = "large" in faults and draws[4] < 0.25
        # The classic window, aimed at: a process dies inside a charge or a refund, after
        # the money moved and before its result is recorded.
        self.kill = "kill" in faults and draws[5] < 0.4
        # One stall longer than HALT_MIN_AGE (``World.stall``).
        self.long = "long" in faults and draws[6] < 0.25
        # Each process's wall clock off the database's by up to five minutes either way
        # (``World.wall_time``): the engine must judge every age by the store's clock.
        self.skew = "skew" in faults and draws[7] < 0.3
        self.skews: dict[int, float] = {}
        # A deploy's warm shutdown (SIGTERM): a worker finishes the step in flight and stops.
        self.sigterm = "sigterm" in faults and draws[8] < 0.3
        self.sigterms = 0
        self.late: list[str] = []
        self.store_faults = 0
        self.hearts_stopped = 0


class World:
    """One seed's world. ``run_phase`` methods drive it; invariants read it afterwards."""

    def __init__(self, config: Config) -> None:
        seed = config.seed
        self.config = config
        self.rng = random.Random(f"schedule:{seed}")
        self.model_rng = random.Random(f"model:{seed}")
        self.uuid_rng = random.Random(f"uuid:{seed}")
        # A tool pool's choices (``SimPool``): a stream of its own, so seeds whose agents
        # run one call at a time keep their schedules.
        self.pool_rng = random.Random(f"pool:{seed}")
        # Whether a deploy rewords ``confirm``'s question (the answerer's casts): its own stream.
        self.ask_rng = random.Random(f"ask:{seed}")
        # What the tree canceller picks (issue 29): a stream of its own.
        self.stop_rng = random.Random(f"stop:{seed}")
        # The hunter's faults (issue 32), each drawn from a stream of its own so that the
        # seeds found before them keep their schedules when they are left out.
        self.hunt = Hunt(seed, config.faults)
        # The targeted adversaries (issue 32): whether this seed has them, and their choices.
        self.aim_rng = random.Random(f"aim:{seed}")
        aims = [self.aim_rng.random() for _ in range(2)]
        self.intercepts = "replayer" in config.actors and aims[0] < 0.5
        self.aims_forks = "forker" in config.actors and aims[1] < 0.6
        # Where faults landed next to journal writes, and the seed's aim at a (record kind,
        # fault) pair (issue 43; ``coverage.py``), from streams of their own.
        self.reached: set[str] = set()
        self.kinds_written: set[str] = set()
        self.aim = cover.draw(seed, config.faults)
        # The quiet phase's first drain may take one of the aim's targets (recovery's
        # workers write what the main phase seldom does: a cancelled saga's compensations).
        self.quiet_aim = False
        self.quiet_faults = 0
        self.leases_taken: list[str] = []  # every run leased, in order
        self.intercepted: list[Signed] = []  # signed decisions captured, never delivered
        # The least share of unedited decisions people sign (``rollout.py``: all of them).
        self.sign_odds = 0.0
        self.signed_taken: list[Signed] = []  # signed decisions the engine took
        # Processes stalled inside a claimed call for longer than HALT_MIN_AGE: an effect of
        # theirs landing after "did not happen" is beyond the promise (docs/simulation.md).
        self.beyond: set[int] = set()
        # The halt aim's resolver (``halts.py``), asked by ``slow_tool``: None outside its casts.
        self.halt_aim: Any = None
        self.pools: dict[Future[Any], SimPool] = {}
        # Signed decisions (the answerer's casts): the people's keys, derived from the seed
        # (set by the cast), what they signed, and a stream of its own for whether they sign
        # and what the replayer picks, so unsigned seeds keep their schedules.
        self.sign_rng = random.Random(f"sign:{seed}")
        self.keys: dict[str, Any] = {}
        self.signatures: list[Signed] = []
        self.signatures_made: dict[Signed, str] = {}
        self.now = EPOCH
        self.lane: Any = None  # the PostgreSQL lane's sessions (``pg_lane.Lane``)
        if config.store.startswith("postgres"):
            from .pg_lane import Lane

            self.lane = Lane(self)
            self.raw = self.lane.store
        else:
            self.raw = InMemoryStore(clock=self.clock)
        self.store = SimStore(self.raw, self)
        self.main = greenlet.getcurrent()
        self.current: Proc | None = None
        self.tearing_down = False
        self.phase = "main"
        self.step = 0
        self.pids = 0
        self.trace: list[tuple[str, int, float, str, str]] = []
        self.violations: list[Violation] = []
        self._violation_keys: set[tuple[str, str]] = set()
        self.ledger: list[Effect] = []
        self.bills: list[Bill] = []
        self.queue: list[str] = []
        self.runs: list[str] = []  # every run row created, in order
        self.dispatches: list[tuple[str, str]] = []  # (actor kind, run id)
        self.actors: list[Any] = []
        self.abandoned: list[Proc] = []
        self.crashes = 0
        self.stalls = 0
        self.heartbeat = SimHeartbeat(self)
        # Journal records and their run-row projection written apart, as on SQLite.
        # (Every draw happens whatever the config, so narrowing it keeps the other choices.)
        split, rates = self.rng.random() < 0.3, (0.0, 0.5, 1.0, 1.0, 2.0)
        crash_rate, stall_rate = self.rng.choice(rates), self.rng.choice(rates)
        self.split_writes = split and "split" in config.faults
        self.crash_rate = crash_rate if "crash" in config.faults else 0.0
        self.stall_rate = stall_rate if "stall" in config.faults else 0.0
        # What people did, for the invariants.
        self.resolutions: dict[tuple[str, str], dict[str, Any]] = {}
        self.resolution_attempts: list[dict[str, Any]] = []
        self.last_crash = 0
        self.approved: dict[tuple[str, str], list[Any]] = {}  # the arguments each approval saw
        # Every approval submitted, before its outcome is known: (run, call, by, arguments it
        # approves running). Its maker may die after the journal took it (``after-decision``);
        # the journal then says whether it stands.
        self.submitted: list[tuple[str, str, str, Any]] = []
        self.edits: set[tuple[str, str, str]] = set()  # (run, call, by) of those with edits
        self.denied: set[tuple[str, str]] = set()  # calls whose final decision was a denial
        self.denials: set[tuple[str, str]] = set()  # calls a denial of was taken for
        # The members of the quorum's group: the cast's people (set by the scenario).
        self.eligible: list[str] = []
        # The rules cast's groups (issue 42: ``rulecast.py``): group -> its members; empty
        # elsewhere (the quorum's group is ``eligible``).
        self.groups: dict[str, list[str]] = {}
        self.rules_rng: random.Random | None = None  # the rules cast's choices
        # The rules' versions deployed when people decided each call: (run, call) -> them.
        self.rule_versions: dict[tuple[str, str], set[int]] = {}
        # What the engine announced (``events.announce``: the host's signals, which the
        # notification outbox projects): (event, details, the process that announced it).
        self.announced: list[tuple[str, dict[str, Any], int]] = []
        # Requests seen expired (a row moved to ``expired``): (run, call, the name of the
        # decision on that asking) -> its arguments.
        self.expired_rows: dict[tuple[str, str, str], Any] = {}
        self.forks: list[dict[str, Any]] = []
        # Answers and signals sent from outside: (run, wait name) -> [(value, what it did)].
        self.answers: dict[tuple[str, str], list[tuple[Any, str]]] = {}
        self.signals: dict[tuple[str, str], list[tuple[Any, str]]] = {}
        # Channel messages: (run, channel) -> [(key, payload sent or standing, what it did)].
        self.messages: dict[tuple[str, str], list[tuple[str, Any, str]]] = {}
        self.fork_snapshots: dict[str, list[Any]] = {}
        # Inert imports (the importer's copies of runs as another site's evidence): run id ->
        # what they held when imported, which nothing may change (``imports_stay_inert``).
        self.imports: dict[str, Imported] = {}
        self.import_rng = random.Random(f"import-ops:{config.seed}")
        self.operator_rng = random.Random(f"operator-ops:{config.seed}")
        self.forgotten: set[str] = set()  # runs an operator deleted (``forget``)
        # Imports aimed at a sub-run's future id (issue 41): the id -> the answer its file
        # says the sub-run gave, which no parent may take (``imports_not_adopted``).
        self.aimed_imports: dict[str, str] = {}
        self.aim_import_rng = random.Random(f"aimed-imports:{config.seed}")
        # A tree's sub-runs wait on a spent daily rate (issue 41; ``agent.Deploy.digest``):
        # cancels aimed at them, from a stream of their own.
        self.digest_rng = random.Random(f"digest-ops:{config.seed}")
        # Actors that act, each as a process of its own run to its end, the moment another
        # process reaches a point (in any phase; ``trees.LateCanceller``).
        self.point_aims: list[Callable[[Proc], None]] = []
        self.recovery_rounds: list[list[str]] = []
        self.last_drive: dict[str, str] = {}
        self.progress = 0  # the last step that wrote anything to a journal
        self.events: dict[str, int] = {}
        self.receipts = 0
        # The MCP server's service (``remote.py``), in the casts that have one.
        self.remote: Any = None
        # Set by the scenario: the plans, the deployed agent version, webhook deliveries.
        self.plans: Any = None
        self.deploy: Any = None
        self.deploys: list[tuple[float, Any]] = []  # (when, the version deployed)
        self.deliveries: dict[str, str] = {}
        self.chat: list[str] = []
        self._entered: int | None = None  # a pool call's begin (``entered_as``)
        # Limits (``agent.Limits``), measured by the simulator at the model and tool points,
        # never read from the store's slots: a limit's key -> holder -> the process driving
        # it (a run of the limited agent from its first model or tool call until its drive
        # gives it back; a limited tool's call from its body's start until its drive gives
        # it back), and a rate's key -> when each call that ran was let through.
        self.holding: dict[str, dict[str, Proc]] = {}
        # Who holds each run's lease, by the world's record of what the store granted
        # (issue 43, ``leases_exclusive``): run -> token -> (the process, until when).
        self.lease_holders: dict[str, dict[str, tuple[Proc, float]]] = {}
        # Every vote saved (issue 43, ``decisions_after_close``): (run, call, approver) ->
        # whether its request was still pending when it was saved.
        self.votes_saved: dict[tuple[str, str, str], bool] = {}
        self.admitted: dict[str, list[float]] = {}
        self._model_rates: dict[str, Any] | None = None

    def clock(self) -> float:
        return self.now

    def forget(self, run_id: str) -> None:
        """What the world knew of a run an operator deleted (issue 41): its journal is gone,
        so what it did is no longer the invariants' to check against it; a run that ever
        comes back under the id is ``spent_stay_spent``'s."""
        self.forgotten.add(run_id)
        self.runs = [r for r in self.runs if r != run_id]
        self.ledger = [e for e in self.ledger if e.run != run_id]
        self.bills = [b for b in self.bills if b.run != run_id]
        self.forks = [f for f in self.forks if f["id"] != run_id]
        self.submitted = [s for s in self.submitted if s[0] != run_id]
        for keyed in (self.answers, self.signals, self.messages, self.approved, self.resolutions):
            for key in [k for k in keyed if k[0] == run_id]:
                del keyed[key]
        self.edits = {e for e in self.edits if e[0] != run_id}
        self.denied = {d for d in self.denied if d[0] != run_id}
        self.denials = {d for d in self.denials if d[0] != run_id}
        self.queue = [r for r in self.queue if r != run_id]

    # -- limits ----------------------------------------------------------------------------

    def limits(self) -> Any:
        """The seed's ``agent.Limits`` (None: nothing is limited)."""
        return self.deploy.limits if self.deploy is not None else None

    def model_rates(self) -> dict[str, Any]:
        """``runtime.model_rates``: the site's rate for the simulated model, if drawn."""
        if self._model_rates is None:
            limits = self.limits()
            rate = limits.model_rate if limits is not None else None
            self._model_rates = (
                {} if rate is None else {MODEL_ID: parse_rate(rate, "the simulated model")}
            )
        return self._model_rates

    def work_begins(self, run_id: str | None, tool: str = "", call: str = "") -> None:
        """A model call (``tool`` empty) or a tool body begins for ``run_id`` in the current
        process: count, by the simulator's own bookkeeping, what runs and calls are being
        driven at once (``limits_hold``), and note when a rate-limited call was let through
        (its drive's permit: the virtual clock may move between the permit and the body's
        first line, which a real process crosses in microseconds)."""
        proc, limits = self.current, self.limits()
        if proc is None or limits is None or run_id is None:
            return
        from .agent import AGENT

        row = self.raw.get_run(run_id)
        if tool and (row is None or row.agent != AGENT):
            return  # the errands' tools are never limited (the limit is the agent's tool's)
        rate = limits.model_rate if not tool else limits.tool_rate if tool == limits.tool else None
        if rate is not None:
            key = f"tool/{tool}" if tool else f"model/{MODEL_ID}"
            granted = proc.permits.get(key)
            if granted:
                self.admitted.setdefault(key, []).append(granted.pop(0))
            else:
                self.violate(
                    "limits_hold",
                    f"{tool or 'the model'} ran for {run_id} (call {call or '-'}) without a "
                    f"permit of its rate {rate} taken by its drive",
                    hole="new",
                )
        if proc.lapsed:
            return  # its leases lapsed under it: what it held was no longer its own
        if limits.runs and row is not None and row.agent == AGENT:
            self._hold(f"agent/{AGENT}", run_id, proc, limits.runs, f"runs of {AGENT}")
        if tool and tool == limits.tool and limits.tool_concurrent:
            holder = f"{run_id}#{call}"
            self._hold(f"tool/{tool}", holder, proc, limits.tool_concurrent, f"{tool} calls")

    # -- safety of what is otherwise liveness (issue 43) -------------------------------------

    def holds_lease(self, run_id: str, token: str, proc: Proc | None, ttl: float) -> None:
        """The store granted (or renewed) ``token``'s lease on ``run_id`` to ``proc`` for
        ``ttl``: no other holder's grant may still run (``leases_exclusive``). A process that
        died or ended keeps its grant until it expires, except on PostgreSQL, where the store
        may see that its session is gone and let another take the lease at once (a drive that
        ended on an error after its grant was committed never learnt it held the lease; its
        connection closed with it, ``PostgresLane.ended``)."""
        if proc is None:
            return
        held = self.lease_holders.setdefault(run_id, {})
        for other, (p, until) in list(held.items()):
            if other == token:
                continue
            if until <= self.now or (self.lane is not None and (p.dead or p.glet.dead)):
                del held[other]
                continue
            self.violate(
                "leases_exclusive",
                f"run {run_id}: the store gave its lease to {proc.actor.name} ({proc.label}) "
                f"while {p.actor.name} ({p.label}) held it until t={until - EPOCH:.1f} "
                f"(now t={self.now - EPOCH:.1f})",
                hole="new",
            )
        held[token] = (proc, self.now + ttl)

    def lets_go_of_lease(self, run_id: str, token: str | None) -> None:
        held = self.lease_holders.get(run_id)
        if held is not None and token is not None:
            held.pop(token, None)

    def halted_on(self, run_id: str) -> str | None:
        """The call ``run_id`` is halted on, by its row and an open halt whose call has no
        outcome in the journal, or None."""
        row = self.raw.get_run(run_id)
        if row is None or row.status != HALTED:
            return None
        for halt in self.raw.list_halts(run_id=run_id):
            if self.raw.get(run_id, f"tool:{halt.op_id}") is None:
                return halt.op_id
        return None

    def step_begins(self, run_id: str | None, what: str, call: str = "") -> None:
        """A model call or a tool's body begins for ``run_id`` in the current process, as
        its driver decided it (before its first point): a run halted on an unknown outcome
        starts no step until a person resolves it (``halted_never_driven``), and no model
        call begins under a stop recorded at or above the run (``stops_hold``; tool calls
        are held to it with their claims, ``invariants.check_stops``). A call handed to the
        tool pool earlier, or claimed by this process before, began then."""
        proc = self.current
        if proc is None or run_id is None or self._entered is not None:
            return
        if call and call in proc.claims:
            return
        halted = self.halted_on(run_id)
        # A process whose lease lapsed under it (a stall between its check before the step
        # and the step) was handed the run before the halt; what it writes is fenced, and
        # no check can close the gap between a check and the next instruction.
        if halted is not None and not proc.lapsed:
            self.violate(
                "halted_never_driven",
                f"run {run_id}: {what} began ({proc.actor.name}, {proc.label}) while the run "
                f"is halted on the unknown outcome of {halted}",
                hole="new",
            )
        if not call:
            from .invariants import stop_at_or_above

            stop = stop_at_or_above(self, run_id)
            if stop is not None:
                self.violate(
                    "stops_hold",
                    f"run {run_id}: a model call began ({proc.actor.name}, {proc.label}) "
                    f"after {stop[0]}'s {stop[1]} was recorded",
                    hole="29",
                )

    def _hold(self, key: str, holder: str, proc: Proc, limit: int, what: str) -> None:
        held = self.holding.setdefault(key, {})
        for other, p in list(held.items()):
            if p.dead or p.glet.dead or p.lapsed:
                del held[other]
        held[holder] = proc
        if len(held) >= limit:
            self.count(f"limits full: {key.split('/')[0]}")
        if len(held) > limit:
            who = ", ".join(f"{h} (pid {p.pid} {p.actor.name})" for h, p in sorted(held.items()))
            self.violate(
                "limits_hold",
                f"{len(held)} {what} driven at once, over the limit of {limit}: {who}",
                hole="new",
            )

    def _let_go(self, proc: Proc, run_id: str, key: str | None = None, holder: str = "") -> None:
        """``proc`` gave back what it held for ``run_id`` (its lease), or one slot."""
        for k, held in self.holding.items():
            if key is not None and k != key:
                continue
            for h, p in list(held.items()):
                if p is proc and (h == holder if holder else h.split("#")[0] == run_id):
                    del held[h]

    def give_key(self, name: str) -> None:
        seed = hashlib.sha256(f"key:{self.config.seed}:{name}".encode()).digest()
        self.keys[name] = Ed25519PrivateKey.from_private_bytes(seed)

    def public_keys(self, user_id: str) -> list[str]:
        key = self.keys.get(user_id)
        return [public_text(key)] if key is not None else []

    def sign(self, signed: Signed) -> str:
        """A person's signature over ``signed`` (base64), kept for the replayer."""
        message = decision_bytes(
            incarnation=signed.incarnation,
            run_id=signed.run_id,
            call_id=signed.call_id,
            tool_name=signed.tool_name,
            arguments=signed.arguments,
            approver_id=signed.by,
            approved=signed.approved,
            note=signed.note,
        )
        signature = base64.b64encode(self.keys[signed.by].sign(message)).decode()
        if signed not in self.signatures_made:
            self.signatures.append(signed)
            self.signatures_made[signed] = signature
        self.count("signed decisions")
        return signature

    def reach(self, fault: str, kinds: tuple[str, ...]) -> None:
        """A fault landed next to writes of these kinds (``coverage.py``)."""
        for k in kinds:
            self.reached.add(cover.pair(k, fault))

    def count(self, event: str) -> None:
        self.events[event] = self.events.get(event, 0) + 1

    def coverage(self) -> dict[str, int]:
        """What this schedule exercised (to show a seed set explores what it claims to)."""
        found = dict(self.events)
        found["halts resolved"] = len(self.resolutions)
        found["calls approved"] = len(self.approved)
        found["calls denied"] = len(self.denied)
        found["calls approved with edits"] = sum(
            1
            for (run_id, call_id), approved in self.approved.items()
            if any(d.arguments is not None for d in self.raw.list_decisions(run_id, call_id))
        )
        found["forks"] = len(self.forks)
        found.update(dict.fromkeys(self.reached, 1))  # seeds, not faults, per pair
        found.update(dict.fromkeys((cover.WRITTEN + k for k in self.kinds_written), 1))
        found["answers recorded"] = sum(
            1 for sent in self.answers.values() for _, did, _ in sent if did == "recorded"
        )
        found["signals recorded"] = sum(
            1 for sent in self.signals.values() for _, did in sent if did == "recorded"
        )
        found["messages recorded"] = sum(
            1 for sent in self.messages.values() for _, _, did in sent if did == "recorded"
        )
        found["effects"] = sum(1 for e in self.ledger if e.effect)
        sub_runs = [r for r in self.runs if (row := self.raw.get_run(r)) and row.parent_run_id]
        found["sub-runs finished"] = sum(
            1 for r in sub_runs if self.raw.get(r, "run:complete") is not None
        )
        # Issue 29: a stop reaching a sub-run from above, recorded by the sub-run itself.
        found["sub-runs stopped from above"] = sum(
            1
            for r in sub_runs
            if (e := self.raw.get(r, "run:cancelled") or self.raw.get(r, "saga:abort")) is not None
            and any(code in e.data for code in ("run.ancestor_cancelled", "saga.parent_aborted"))
        )
        found["questions asked again"] = sum(
            1
            for r in self.runs
            for e in self.raw.load(r)
            if e.name.startswith("wait:") and "#" in e.name
        )
        return found

    # -- the trace -----------------------------------------------------------------------

    def log(self, who: str, text: str) -> None:
        self.trace.append((self.phase, self.step, self.now - EPOCH, who, text))

    def format_trace(self) -> list[str]:
        return [
            f"{phase[0]}{step:4d} t={t:7.1f} {who:10s} {text}"
            for phase, step, t, who, text in self.trace
        ]

    def violate(self, invariant: str, detail: str, hole: str = "?") -> None:
        key = (invariant, detail)
        if key in self._violation_keys:
            return
        self._violation_keys.add(key)
        self.violations.append(Violation(invariant, detail, hole))
        self.log("!", f"VIOLATION [{invariant}] {detail.splitlines()[0]}")

    # -- what processes call -------------------------------------------------------------

    def point(self, label: str) -> None:
        """Give the baton back to the scheduler (a no-op outside a process)."""
        proc = self.current
        if proc is None:
            return
        if self.tearing_down:
            raise Killed()
        proc.point = label
        self.main.switch()

    def failpoint(self, name: str) -> None:
        self.point(f"fp {name}")

    def sleep(self, seconds: float) -> None:
        proc = self.current
        if proc is None:
            return
        proc.sleep_until = self.now + max(0.0, float(seconds))
        self.point(f"sleep {seconds:g}s")

    def engine_dispatch(self, run_id: str) -> None:
        """``runtime.dispatch``: the engine hands ``run_id`` to a driver. Never a run halted
        on an unknown outcome (``halted_never_driven``): whoever hands one over moves it on
        first (a resolution queues it); one handed over as it is would be driven into its
        halt again and again. (An actor's own hand-over, the admin's enqueue of a fork it
        just made, is not the engine's.)"""
        halted = self.halted_on(run_id)
        if halted is not None:
            proc = self.current
            who = f"{proc.actor.name} ({proc.label})" if proc is not None else "the world"
            self.violate(
                "halted_never_driven",
                f"{who} handed {run_id} to a driver while it is halted on the unknown "
                f"outcome of {halted}",
                hole="new",
            )
        self.dispatch(run_id)

    def dispatch(self, run_id: str) -> None:
        proc = self.current
        kind = proc.actor.kind if proc is not None else "world"
        hunt = self.hunt
        if hunt.broker and self.phase == "main" and hunt.rng.random() < 0.25:
            # The broker misbehaves: a message published after its commit is lost (the
            # publisher died between the two, or the broker dropped it), handed out twice,
            # or handed out late (after everything queued now).
            fault = hunt.rng.choice(("lost", "twice", "late"))
            self.count(f"broker: message {fault}")
            self.log("broker", f"message for {run_id} {fault}")
            if fault == "lost":
                return
            if fault == "late":
                hunt.late.append(run_id)
                return
            self.dispatches.append(("broker", run_id))
            self.queue.append(run_id)
        self.dispatches.append((kind, run_id))
        self.queue.append(run_id)

    def store_fault(self, name: str, kinds: tuple[str, ...] = ()) -> str:
        """Whether this store call fails: "" (no), "before" it commits (nothing written) or
        "after" (written, and the caller hears an error: the commit's outcome unknown to it).
        Only in seeds with a failing store, in the main phase, a few times at most; and where
        the seed's aim (``coverage.Aim``) is a store failure at a write of this kind."""
        hunt, proc = self.hunt, self.current
        if (self.phase != "main" and not self.quiet_aim) or proc is None or proc.exclusive:
            return ""
        where = proc.aimed_store
        proc.aimed_store = ""
        if not where and self.phase != "main":
            return ""
        if not where:
            if not hunt.store or hunt.store_faults >= 3 or hunt.rng.random() >= 0.02:
                return ""
            hunt.store_faults += 1
            where = (
                "before"
                if name in ("get", "load", "get_run")
                else hunt.rng.choice(("before", "after"))
            )
        for bill in self.bills:
            if bill.pid == proc.pid:
                bill.lost = True  # the spend it would have recorded may be what failed
        self.count(f"store fails {where} commit")
        self.reach(f"store {where}", kinds)
        self.log(proc.actor.name, f"STORE ERROR {where} commit at {name}")
        return where

    def kill_after_effect(self, proc: Proc) -> bool:
        """Whether ``proc`` dies here: right after the effect of a charge or refund, or of the
        MCP server's payment (``remote.py``: once the service acted) (once a seed, in the
        seeds drawn for it, early enough for the run to be taken over)."""
        hunt = self.hunt
        if not hunt.kill or self.phase != "main" or self.step > 0.6 * self.config.steps:
            return False
        point = proc.point
        aimed = ("tool charge ", "tool refund ", "tool crm__pay ")
        if not (point.startswith(aimed) and point.endswith(" done")):
            return False
        if hunt.rng.random() >= 0.8:
            return False
        hunt.kill = False
        self.count("crashes aimed after an effect")
        return True

    def wall_time(self) -> float:
        """What ``time.time()`` says in the engine's modules: the virtual clock, off by the
        current process's skew in the seeds drawn for it."""
        proc, hunt = self.current, self.hunt
        if proc is None or not hunt.skew:
            return self.now
        if proc.pid not in hunt.skews:
            hunt.skews[proc.pid] = hunt.rng.uniform(-300.0, 300.0)
        return self.now + hunt.skews[proc.pid]

    def should_stop(self) -> bool:
        """``runtime.should_stop``: the current process's worker is shutting down."""
        proc = self.current
        return proc is not None and proc.stopping

    def warm_shutdown(self, proc: Proc) -> None:
        """In some seeds, a driver's worker gets SIGTERM (a deploy): it finishes the step in
        flight, puts the run back, and stops; recovery hands the run over."""
        hunt = self.hunt
        if not hunt.sigterm or hunt.sigterms >= 2 or proc.stopping or self.phase != "main":
            return
        if proc.actor.kind != "driver" or not proc.leased or hunt.rng.random() >= 0.05:
            return
        hunt.sigterms += 1
        proc.stopping = True
        self.count("warm shutdowns (SIGTERM)")
        self.log(proc.actor.name, f"SIGTERM (driving {proc.leased})")

    def stop_heart(self, proc: Proc) -> None:
        """In some seeds a driver's heartbeat dies while it goes on (its lease lapses under
        it; the next fenced write tells it)."""
        hunt = self.hunt
        if not hunt.heart or hunt.hearts_stopped or not proc.leased or self.phase != "main":
            return
        if hunt.rng.random() < 0.1:
            hunt.hearts_stopped += 1
            proc.heart_dead = True
            proc.lapsed = True
            self.count("heartbeats died")
            self.log(proc.actor.name, f"HEARTBEAT DIES (leases {proc.leased})")

    def deliver_late(self) -> None:
        """Late messages arrive once the queue has emptied."""
        if self.hunt.late and not self.queue:
            run_id = self.hunt.late.pop(0)
            self.dispatches.append(("broker", run_id))
            self.queue.append(run_id)
            self.log("broker", f"delivers {run_id} late")

    def begins(self, call_id: str) -> None:
        """A claimed call's body begins. Held up past HALT_MIN_AGE since its claim (a stall
        between them, or, handed to the pool, behind another call's long body: a real pool
        would have started it at once), its effect may land after a person recorded "did
        not happen": the one outcome no engine prevents (docs/simulation.md, Limits)."""
        proc = self.current
        if proc is None:
            return
        claimed = proc.claim_times.get(call_id)
        if claimed is not None and self.now - claimed >= 2 * self.config.ttl:
            self.beyond.add(proc.pid)
            self.count("calls begun later than HALT_MIN_AGE after their claim")

    def slow_tool(self, tool: str, run_id: str = "", call_id: str = "") -> None:
        """Inside an at-most-once tool, before its effect: in some seeds one call freezes
        for most of the time a halt on it must wait before a person may resolve it
        (HALT_MIN_AGE, two leases). A driver that takes the run over halts on the claim; the
        effect lands before the halt is old enough to resolve. (In the halt aim's casts,
        ``halts.py``, its resolver freezes the driver instead, and resolves the halt.)"""
        proc, hunt = self.current, self.hunt
        if (
            proc is not None
            and self.halt_aim is not None
            and self.halt_aim.freeze(self, proc, tool, run_id, call_id)
        ):
            return
        if proc is None or not hunt.slow or self.phase != "main" or proc.attempt_at is None:
            return
        if self.step > 0.6 * self.config.steps:
            return  # too late for anyone to take the run over before the main phase ends
        if tool not in ("charge", "refund") or hunt.rng.random() >= 0.5:
            return
        hunt.slow -= 1
        proc.lapsed = True
        until = proc.attempt_at + hunt.rng.uniform(1.7, 1.95) * self.config.ttl
        proc.stalled_until = until
        self.count("slow tool calls")
        self.log(proc.actor.name, f"SLOW inside {tool} until t={until - EPOCH:.1f}")

    def bill(self, tokens: int) -> None:
        proc = self.current
        run = proc.leased[-1] if proc is not None and proc.leased else None
        self.bills.append(Bill(proc.pid if proc else 0, run, tokens))

    def record(
        self,
        tool: str,
        run: str,
        call: str,
        args: dict[str, Any],
        key: str,
        value: Any,
        *,
        effect: bool,
        outcome: str = "returned",
        dedupe: bool = False,
        entered: int | None = None,
    ) -> Effect:
        """Write one invocation to the ledger. ``dedupe``: the downstream system honours the
        key, so a second effect with one key changes nothing and answers as the first did."""
        if effect and dedupe:
            prior = next(
                (e for e in self.ledger if e.effect and e.tool == tool and e.key == key), None
            )
            if prior is not None:
                effect, value = False, prior.value
        proc = self.current
        entry = Effect(
            len(self.ledger) + 1,
            self.now - EPOCH,
            run,
            call,
            tool,
            dict(args),
            key,
            value,
            effect,
            outcome,
            proc.pid if proc else 0,
            entered if entered is not None else self.entry_seq(),
            proc.claims.get(call, 0) if proc else 0,
        )
        self.ledger.append(entry)
        return entry

    def raw_seq(self) -> int:
        """The store's last journal seq: what a call beginning now comes after."""
        if self.lane is not None:
            return int(self.raw.last_seq())
        return int(self.raw._seq)

    def entry_seq(self) -> int:
        """When the tool call running now began, as a store seq (``Effect.entered``)."""
        return self._entered if self._entered is not None else self.raw_seq()

    def entered_as(self, seq: int, fn: Callable[..., Any], *args: Any) -> Any:
        saved, self._entered = self._entered, seq
        try:
            return fn(*args)
        finally:
            self._entered = saved

    def decision_counts(self, run_id: str, entry: Any) -> None:
        """A decision was journaled (``entry``): none of the votes it counts was saved after
        its request closed — decided, withdrawn (its run cancelled or rolled back, its call
        settled otherwise), expired (``decisions_after_close``)."""
        from durable_agents.engine.records import decode

        body = decode(entry.data)
        tally = body.get("tally") if isinstance(body, dict) else None
        if not isinstance(tally, dict):
            return  # an expiry, or a decision with no votes behind it
        call = entry.name.removeprefix("approval:").split(":")[0]
        for voter in [*tally.get("approved_by", ()), *tally.get("denied_by", ())]:
            if self.votes_saved.get((run_id, call, str(voter))) is False:
                self.violate(
                    "decisions_after_close",
                    f"run {run_id}: the decision on {call} ({entry.name}) counts {voter}'s "
                    "vote, saved after its request was closed",
                    hole="new",
                )

    def check_move(self, run_id: str, before: Any, after: Any, call: str) -> None:
        """A run's status change is a move of the lifecycle table (``lifecycle.MOVES``)."""
        if after is None or (before is not None and before.status == after.status):
            return
        if after.status == THROTTLED:
            self.count("runs throttled")
        elif before is not None and before.status == THROTTLED:
            self.count(f"throttled runs moved to {after.status}")
        if before is None:
            ok = any(m.to == after.status and not m.from_ for m in lifecycle.MOVES)
        else:
            ok = lifecycle.allowed(before.status, after.status)
        if not ok:
            proc = self.current
            who = f"{proc.actor.name} ({proc.label})" if proc is not None else "the world"
            self.violate(
                "lifecycle_moves",
                f"run {run_id} moved {before.status if before else '(new)'} -> {after.status} "
                f"({call} by {who}): not a move of the lifecycle table",
                hole="new",
            )

    def check_request_move(
        self, asked: tuple[str, str], before: Any, after: Any, call: str
    ) -> None:
        """An approval request's status change is a move of its table
        (``lifecycle.APPROVAL_MOVES``): asked pending, left once, pending again only when a
        drive asks the call anew (the row replaced)."""
        if after is None or (before is not None and before.status == after.status):
            return
        if after.status == "expired":
            again = after.previous_arguments is not None
            name = decision_name(asked[1], after.arguments, again=again)
            self.expired_rows.setdefault((asked[0], asked[1], name), after.arguments)
        if not lifecycle.request_allowed(before.status if before else None, after.status):
            proc = self.current
            who = f"{proc.actor.name} ({proc.label})" if proc is not None else "the world"
            self.violate(
                "lifecycle_moves",
                f"the request of call {asked[1]} in run {asked[0]} moved "
                f"{before.status if before else '(new)'} -> {after.status} "
                f"({call} by {who}): not a move of the request lifecycle table",
                hole="new",
            )

    def next_receipt(self) -> int:
        self.receipts += 1
        return self.receipts

    def _split_insert(
        self,
        raw: InMemoryStore,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        release: bool = False,
    ) -> Any:
        """A journal record and its run-row projection as two statements, so a crash can
        fall between. No store writes them apart any more (issue 10, hole 7: one statement
        on PostgreSQL, one transaction on SQLite); the fault stays to check the repairs the
        engine promises on top — a drive puts a row behind `run:complete` back in step, a
        recorded turn or spend is counted from the journal."""
        kwargs = dict(kwargs)
        changes = kwargs.pop("run_changes")
        entry, inserted = raw.insert(*args, **kwargs)
        if inserted:
            self._at_store("update_run", args[:1])
            raw.update_run(args[0], changes, fence=kwargs.get("fence"))
        if inserted and release:
            # finish_run: the lease goes last (a crash before it leaves it to expire)
            self._at_store("release_lease", args[:1])
            raw.release_lease(args[0], kwargs["fence"])
        return entry, inserted

    def _split_finish(
        self, raw: InMemoryStore, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A final turn and ``run:complete`` as separate writes (see ``_split_insert``): a
        crash can leave the turn alone, or the end with its row behind, or the lease."""
        run_id, records = args
        fence, changes = kwargs["fence"], kwargs.get("run_changes")
        if raw.get(run_id, records[0][0]) is not None:
            return None
        try:
            written = [raw.insert(run_id, *records[0], fence=fence)[0]]
        except LeaseLost:
            return None  # as the atomic write: nothing written
        for name, data in records[1:]:
            # Apart, a lease lost after the first record stops the driver there.
            self._at_store("insert", (run_id, name))
            written.append(raw.insert(run_id, name, data, fence=fence)[0])
        if changes:
            self._at_store("update_run", (run_id,))
            raw.update_run(run_id, changes, fence=fence)
        self._at_store("release_lease", (run_id,))
        raw.release_lease(run_id, fence)
        return written

    def _at_store(self, name: str, args: tuple[Any, ...]) -> None:
        if self.current is None:
            return
        if self.tearing_down:
            raise Killed()
        self.point(STORE_POINT + _store_label(name, args))

    def _after_store(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        proc = self.current
        if name == "create_run" and result:
            self.runs.append(args[0].run_id)
            source = args[0].forked_from
            if source and proc is not None and proc.capture is not None:
                # What a fork read of its source, known from the moment its row exists: a
                # person resolving a halt on it must account for the source's effects of
                # the calls that were in flight then, even while the fork is being copied.
                self.fork_snapshots[args[0].run_id] = list(proc.capture.get(source, []))
        if started(name, result):  # created, leased and started
            self.runs.append(args[0].run_id)
            self.progress = self.step
        if proc is None:
            return
        if name == "take_permit" and result == 0:
            proc.permits.setdefault(args[0], []).append(self.now)
        elif name == "release_slot":
            self._let_go(proc, "", key=args[0], holder=args[1])
        elif name == "throttle":
            self.count(f"throttled on {args[0].key.split('/')[0]} {args[0].reason}")
        if name in FENCED_ROWS and result and kwargs.get("fence") is None:
            run_id = args[0].run_id
            if run_id in proc.leased:
                # A lease holder writing these rows unfenced can, once taken over, replace
                # the live request (its decisions) or halt from a stale journal.
                self.violate(
                    "fenced_row_writes",
                    f"{proc.actor.name} ({proc.label}) wrote {name} on {run_id} unfenced",
                    hole="new",
                )
        if name == "acquire_lease" and result:
            self.holds_lease(args[0], args[2], proc, float(args[3]))
        elif started(name, result) and kwargs.get("token"):
            self.holds_lease(args[0].run_id, kwargs["token"], proc, float(kwargs["ttl"]))
        elif name == "release_lease":
            self.lets_go_of_lease(args[0], args[1] if len(args) > 1 else kwargs.get("token"))
        elif name in ("finish_run", "finish_run_with") and result is not None:
            if name == "finish_run_with" or result[1]:
                self.lets_go_of_lease(args[0], kwargs.get("fence"))
        elif name == "save_decision" and result:
            decision = args[0]
            request = self.raw.get_approval_request(decision.run_id, decision.call_id)
            pending = request is not None and request.status == "pending"
            self.votes_saved[(decision.run_id, decision.call_id, decision.approver)] = pending
            if not pending:
                self.violate(
                    "decisions_after_close",
                    f"run {decision.run_id}: {decision.approver}'s vote on {decision.call_id} "
                    f"was saved after its request was closed "
                    f"({request.status if request is not None else 'gone'})",
                    hole="new",
                )
        elif name == "insert" and result[1] and str(args[1]).startswith("approval:"):
            self.decision_counts(str(args[0]), result[0])
        if name == "acquire_lease" and result:
            proc.leased.append(args[0])
            self.leases_taken.append(args[0])
        elif started(name, result):
            proc.leased.append(args[0].run_id)
            self.leases_taken.append(args[0].run_id)
        elif name == "release_lease" and args[0] in proc.leased:
            proc.leased.remove(args[0])
            self._let_go(proc, args[0])
        elif name in ("finish_run", "finish_run_with") and args[0] in proc.leased:
            if result is not None and (name == "finish_run_with" or result[1]):
                proc.leased.remove(args[0])
                self._let_go(proc, args[0])
                self.progress = self.step
        elif name == "insert":
            entry, inserted = result
            if inserted:
                self.progress = self.step
            if inserted and entry.name.startswith("attempt:"):
                proc.attempt_at = self.now
                claimed = entry.name[len("attempt:") :].rpartition(":")[0]
                proc.claims[claimed] = entry.seq
                proc.claim_times[claimed] = self.now
            elif entry.name.startswith("tool:"):
                proc.attempt_at = None
        elif name == "get_approval_request":
            proc.requests_read.append(result)
        elif name == "load" and proc.capture is not None:
            after = args[1] if len(args) > 1 else kwargs.get("after", 0)
            if not after and args[0] not in proc.capture:
                proc.capture[args[0]] = list(result)

    # -- running processes ---------------------------------------------------------------

    def _op_main(self, proc: Proc, fn: Callable[[], Any]) -> None:
        try:
            proc.result = fn()
            if self.aim is not None and proc.wrote:
                # A process may die after its last write, before its caller hears back (a
                # worker before its ack, a view before its answer): a point, so a crash there
                # is one of the crashes after that write (``coverage.py``).
                self.point("returns")
            proc.outcome = f"-> {_short(proc.result)}"
        except Killed:
            raise
        except (DurableAgentsError, Pause) as exc:
            proc.error = exc
            proc.outcome = f"!! {type(exc).__name__} ({getattr(exc, 'code', '')})"
        except Exception as exc:
            proc.error = exc
            proc.outcome = f"!! unexpected {type(exc).__name__}: {exc}"
            self.violate(
                "no_internal_errors",
                f"{proc.actor.name} ({proc.label}) raised {type(exc).__name__}: {exc}\n"
                + "".join(traceback.format_exc(limit=-8)),
                hole="new",
            )

    def start(self, actor: Any, label: str, fn: Callable[[], Any]) -> Proc:
        proc = Proc(self, actor, label, fn)
        actor.proc = proc
        self.count(f"op: {actor.kind}")
        self.log(actor.name, f"starts {label}")
        self.resume(proc)
        return proc

    def resume(self, proc: Proc) -> None:
        self.current = proc
        if self.lane is not None:
            self.lane.enter(proc)  # its own database session (``pg_lane.py``)
        try:
            proc.glet.switch()
        finally:
            self.current = None
            if self.lane is not None:
                self.lane.leave()
        if proc.glet.dead:
            if self.lane is not None:
                self.lane.ended(proc)  # a process that ends closes its connections
            if proc.actor.proc is proc:
                proc.actor.proc = None
            self.log(proc.actor.name, f"ends {proc.label} {proc.outcome}")
        elif proc.urgent and not proc.exclusive and proc.point.startswith(STORE_POINT):
            proc.urgent = False

    def move(self, proc: Proc, *, faults: bool) -> None:
        """Let ``proc`` run to its next point, unless the seed crashes or stalls it here."""
        if faults and self.kill_after_effect(proc):
            self.crash(proc)
            return
        if (
            self.aim is not None
            and not proc.exclusive
            and ((faults and self.phase == "main") or self.quiet_aim)
        ):
            if proc.crash_after:
                proc.crash_after = False
                if proc.wrote:
                    self.crash(proc)
                    return
            quiet = self.phase != "main"  # one target at most, ``quiet_aim``
            fault = (
                ""
                if quiet and self.quiet_faults
                # An MCP task's windows first (``remote.py``: a target of its own).
                else (self.remote is not None and self.remote.aims_at(self, proc))
                or self.aim.at_write(proc.writing, targets_only=quiet)
            )
            if fault:
                self.count("faults aimed by coverage")
                if quiet:
                    self.quiet_faults += 1
                    self.count("faults aimed in the quiet phase")
                if fault == "crash before":
                    self.crash(proc)
                    return
                if fault == "crash after":
                    proc.crash_after = True
                else:
                    proc.aimed_store = fault.split()[1]
        if faults and proc.die_at is not None and proc.point == f"fp {proc.die_at}":
            self.count(f"crashes aimed at {proc.die_at.split(':')[0]}")
            self.crash(proc)
            return
        if faults:
            # Faults land mostly where they hurt: inside tools and model calls, at
            # failpoints, and right before a write.
            heat = (
                1.0
                if proc.point.startswith(HOT_PREFIXES)
                else 0.3
                if proc.point.startswith(WRITES)
                else 0.05
            )
            cfg = self.config
            crash_p = 0.2 * heat * self.crash_rate
            stall_p = 0.1 * heat * self.stall_rate
            roll = self.rng.random()
            if self.crashes < cfg.max_crashes and roll < crash_p:
                self.crash(proc)
                return
            if proc.exclusive:
                stall_p = 0.0
            if self.stalls < cfg.max_stalls and crash_p <= roll < crash_p + stall_p:
                self.stall(proc)
                return
        if faults:
            self.stop_heart(proc)
            self.warm_shutdown(proc)
        for aim in self.point_aims:  # an actor acting the moment a process reaches a point
            aim(proc)
        self.log(proc.actor.name, proc.point)
        self.resume(proc)

    def crash(self, proc: Proc) -> None:
        self.reach("crash before", proc.writing)
        self.reach("crash after", proc.wrote)
        self.crashes += 1
        self.last_crash = self.step
        self.count(f"crash at a {proc.point.split()[0].rstrip(':')} point")
        if proc.actor is not None and getattr(proc.actor, "kind", "") == "sweeper":
            self.count("rules: timer sweeps crashed")
        if proc.point.startswith("fp before-throttle"):
            self.count("crashes between a throttle row and its status")
        proc.dead = True
        if self.lane is not None:
            self.lane.ended(proc)  # the server sees it die: its locks go, its work rolls back
        if proc.actor.proc is proc:
            proc.actor.proc = None
        self.abandoned.append(proc)
        for bill in self.bills:
            if bill.pid == proc.pid:
                bill.lost = True
        self.log(proc.actor.name, f"CRASH at {proc.point} (lease on {proc.leased} not released)")
        if proc.run_id is not None and self.rng.random() < 0.5:
            # acks_late: the broker hands the dead worker's message to another worker.
            self.dispatches.append(("broker", proc.run_id))
            self.queue.append(proc.run_id)
            self.log("broker", f"redelivers {proc.run_id}")

    def stall(self, proc: Proc) -> None:
        self.stalls += 1
        proc.lapsed = True
        self.count(f"stall at a {proc.point.split()[0].rstrip(':')} point")
        ttl = self.config.ttl
        until = self.now + self.rng.uniform(1.05, 1.9) * ttl
        if self.hunt.long and self.hunt.rng.random() < 0.5:
            # Longer than HALT_MIN_AGE (issue 32), in some seeds: outside a claimed call
            # nothing is owed to the stalled process; inside one, its effect may land after a
            # person recorded "did not happen" (the one outcome no engine can prevent: the
            # invariants excuse exactly that, and hold the rest).
            self.hunt.long = False
            until = self.now + self.hunt.rng.uniform(2.2, 3.5) * ttl
            self.count("stalls longer than HALT_MIN_AGE")
            if proc.attempt_at is not None and until > proc.attempt_at + 2 * ttl:
                self.beyond.add(proc.pid)
                self.count("stalls longer than HALT_MIN_AGE inside a claimed call")
        elif proc.attempt_at is not None:
            # Inside a claimed call: the stall ends (and the effect lands) before the halt
            # is old enough to resolve (HALT_MIN_AGE, twice the lease). A longer stall is
            # beyond what any engine can promise: see docs/simulation.md.
            until = min(until, proc.attempt_at + 1.9 * ttl)
        proc.stalled_until = until
        self.log(proc.actor.name, f"STALL at {proc.point} until t={until - EPOCH:.1f}")

    def advance(self, seconds: float) -> None:
        if seconds <= 0:
            return
        # Never jump past a stall's end: the process wakes exactly when its stall ends.
        wakes = [
            a.proc.stalled_until
            for a in self.actors
            if a.proc is not None and self.now < a.proc.stalled_until < self.now + seconds
        ]
        self.now = min([self.now + seconds, *wakes])
        for actor in self.actors:
            proc = actor.proc
            if proc is not None and proc.stalled_until and proc.stalled_until <= self.now:
                proc.stalled_until = 0.0
                proc.urgent = True  # it continues where it froze, before anyone else moves
                self.log(actor.name, f"wakes at {proc.point}")
        self.heartbeat.beat()

    def advance_by(self, seconds: float) -> None:
        """Move the clock in heartbeat-sized steps."""
        chunk = self.config.ttl / 3
        while seconds > 0:
            self.advance(min(chunk, seconds))
            seconds -= chunk

    def pick(self, options: list[tuple[int, Any]]) -> Any:
        total = sum(w for w, _ in options)
        roll = self.rng.random() * total
        for weight, item in options:
            roll -= weight
            if roll < 0:
                return item
        return options[-1][1]

    def run_to_end(self, proc: Proc, guard: int = 5000) -> Proc:
        """Run one process to its end with no faults (the quiet phases)."""
        while not proc.glet.dead and not proc.dead:  # (dead: an aimed crash, ``quiet_aim``)
            guard -= 1
            if guard < 0:
                self.violate("terminates", f"{proc.label} did not finish", hole="new")
                break
            if not proc.ready(self.now):
                self.advance(max(0.1, max(proc.sleep_until, proc.stalled_until) - self.now))
                continue
            self.move(proc, faults=False)
        return proc

    def teardown(self) -> None:
        """Unwind every greenlet still suspended (crashed or unfinished processes)."""
        self.tearing_down = True
        procs = list(self.abandoned) + [a.proc for a in self.actors if a.proc is not None]
        for proc in procs:
            if proc.glet.dead:
                continue
            self.current = proc
            try:
                proc.glet.throw(Killed())
            except Killed:
                pass
            finally:
                self.current = None
        self.abandoned.clear()
        self.heartbeat.entries.clear()
        if self.lane is not None:
            self.lane.close()


def deny_message(call_id: str) -> str:
    """What a person who denies ``call_id`` tells the model (the same from either person,
    so the invariant knows it whoever's denial stands)."""
    return f"not {call_id}: ask the customer first"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_modules: tuple[int, list[Any]] = (0, [])


def _engine_modules() -> list[Any]:
    """The durable_agents modules loaded in this process (cached until more are loaded)."""
    global _modules
    if _modules[0] != len(sys.modules):
        found = [
            m
            for name, m in list(sys.modules.items())
            if m is not None and (name == "durable_agents" or name.startswith("durable_agents."))
        ]
        _modules = (len(sys.modules), found)
    return _modules[1]


@contextlib.contextmanager
def patched(world: World) -> Iterator[None]:
    """Point the engine at ``world`` for one seed: its store, clock, dispatch and people
    through the runtime's own keys; only what the runtime has no key for is swapped in the
    modules (seeded uuids, failpoints, the heartbeat thread). Restored afterwards."""
    global CURRENT
    saved_runtime = dict(runtime._runtime.__dict__)
    uuid_shim = _UUID(world)
    swapped: list[tuple[Any, str, Any]] = []
    # uuid4 names claims, lease tokens and spend records: seeded, so a seed replays. (Wall
    # time still reaches `journal.now_ms`, but only into record bodies nothing decides on:
    # every age the engine judges is by the store's clock, which is the virtual one.)
    for module in _engine_modules():
        if getattr(module, "uuid", None) is _uuid:
            swapped.append((module, "uuid", _uuid))
            module.uuid = uuid_shim
    # Wall time (record bodies' ``at``; a halt's age where a store has no clock) is each
    # process's own clock: virtual, and skewed in some seeds.
    from durable_agents.engine import journal as journal_module
    from durable_agents.engine.commands import halts as halts_module

    clock_shim = _Time(world)
    for module in (journal_module, halts_module):
        swapped.append((module, "time", module.time))
        module.time = clock_shim  # type: ignore[assignment]
    swapped.append((failpoints, "hit", failpoints.hit))
    failpoints.hit = world.failpoint  # type: ignore[assignment]
    # An MCP task's polls (``remote.py``): spaced and timed by the virtual clock, a pause
    # between two polls the process giving the baton back; progress notes by it too.
    from durable_agents.mcp import server as mcp_server
    from durable_agents.mcp import tasks as mcp_tasks

    swapped.append((mcp_tasks, "time", mcp_tasks.time))
    mcp_tasks.time = _PollTime(world)  # type: ignore[assignment]
    swapped.append((mcp_server, "ProgressNotes", mcp_server.ProgressNotes))
    mcp_server.ProgressNotes = functools.partial(  # type: ignore[misc]
        mcp_server.ProgressNotes, clock=world.clock
    )
    swapped.append((leases, "_heartbeat", leases._heartbeat))
    # A lease's last renewal and its lapse (``HeldLease.lapsed``) by the virtual clock: the
    # heartbeat thread, the other reader of ``leases.time``, is ``SimHeartbeat`` here.
    swapped.append((leases, "time", leases.time))
    leases.time = _VirtualMonotonic(world)  # type: ignore[assignment]
    leases._heartbeat = world.heartbeat  # type: ignore[assignment]
    # The tool pool of an agent with ``tool_concurrency > 1``: greenlets, not threads.
    swapped.append((loop, "ThreadPoolExecutor", loop.ThreadPoolExecutor))
    swapped.append((loop, "wait", loop.wait))
    loop.ThreadPoolExecutor = SimPool  # type: ignore[assignment,misc]
    loop.wait = sim_wait  # type: ignore[assignment]
    # The hand-overs of waiters a slot given back sets off, per thread: per process here.
    swapped.append((throttle, "_handing", throttle._handing))
    throttle._handing = _PerProcess()  # type: ignore[assignment]
    logger = logging.getLogger("durable_agents")
    saved_level = logger.level
    logger.setLevel(logging.CRITICAL)
    ttl = world.config.ttl
    runtime.configure(
        store_factory=lambda: world.store,
        agent_loader=None,
        lease_ttl=lambda: ttl,
        on_drift=lambda: "warn",
        dispatcher=world.engine_dispatch,
        should_stop=world.should_stop,
        # The engine as plain Python: no user system, so a person's name is a trusted
        # caller (`identity.plain_actor`). Who may decide is tested against real users in
        # tests/integration; here the question is what the engine does with a decision.
        resolve_actor=None,
        eligible_approvers=lambda group: list(
            world.groups.get(group, world.eligible if group == PAYOUTS else [])
        ),
        approver_keys=world.public_keys,
        halt_min_age=lambda: 2 * ttl,
        retry_policy=lambda: RetryPolicy(),
        # Waits (model retry backoff, a duplicate delivery waiting for its turn) are the
        # process giving the baton back until the virtual clock reaches its wake-up time.
        sleep=world.sleep,
        monotonic=world.clock,
        model_rates=world.model_rates,
    )
    CURRENT = world
    try:
        with mutations.applied(world.config.mutation):
            yield
    finally:
        CURRENT = None
        logger.setLevel(saved_level)
        for module, attr, value in reversed(swapped):
            setattr(module, attr, value)
        runtime._runtime.__dict__.update(saved_runtime)
