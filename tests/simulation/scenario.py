"""One seed: the cast, the three phases (main, drain, quiet), and the checks.

*Main*: the actors interleaved by the seed, with crashes and stalls, until nothing new
happens. *Drain*: no new operations and no faults; every process still alive finishes.
*Quiet*: leases lapse, then recovery passes with workers draining the queue until a pass
hands nothing over. Then every invariant (``invariants.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from durable_agents.engine.agent import get_agent
from durable_agents.engine.errors import ConfigError
from durable_agents.engine.journal import Journal
from durable_agents.engine.limits import parse_rate, tool_key
from durable_agents.engine.ports import CANCELLED, FAILED

from . import halts, pruning, remote, rollbacks, rollout, rulecast, slots, trees, votes
from . import world as W
from .actors import (
    Actor,
    Answerer,
    Client,
    Deployer,
    Driver,
    Importer,
    Operator,
    Outsider,
    Person,
    Recovery,
    Replayer,
    Stepper,
    TreeCanceller,
    Webhook,
    drive_like_a_worker,
)
from .agent import AGENT, DIGEST_RATE, ERRAND, SESSION, Deploy, Plans, draw_limits, undo_refunds

# -- one seed -----------------------------------------------------------------------------


def build(w: W.World) -> None:
    """The cast of one seed: which actors take part, drawn from the seed."""
    cfg = w.config
    rng = w.rng
    w.plans = Plans(w)
    # Sagas came after sub-agents: only a cast with the answerer runs a saga deploy.
    # Quorums came after sagas: drawn from a stream of the seed's own (the seed's draws stay
    # as they were), for casts with people.
    quorum = "person" in cfg.actors and random.Random(f"quorum:{cfg.seed}").random() < cfg.quorum
    # Concurrent tool calls came after quorums: drawn the same way, from a stream of its own.
    concurrent = random.Random(f"concurrent:{cfg.seed}").random() < cfg.concurrent
    # Limits came after concurrent calls: drawn the same way (``agent.draw_limits``), in
    # the answerer's casts only, so the known-hole seeds keep their schedules.
    limits = draw_limits(cfg.seed, cfg.limits) if "answerer" in cfg.actors else None
    # Cancels of a tree (issue 29) are drawn from a stream of their own (below); errands
    # that book under a spent daily rate (issue 41) came after limits, in those casts only,
    # drawn the same way; not where the agent's own booking is limited (a rate's key is
    # the tool's name).
    canceller = "answerer" in cfg.actors and random.Random(f"stops:{cfg.seed}").random() < 0.6
    digest = (
        canceller
        and random.Random(f"digest:{cfg.seed}").random() < cfg.digest
        and (limits is None or limits.tool != "book")
    )
    # Approval rules (issue 42) came after the second tab, drawn from a stream of their own
    # in the casts with people and the answerer: a rules cast gates refunds by rules, not
    # by a quorum.
    rules = rulecast.takes_part(cfg)
    # Trees three deep (issue 43) came after gated compensable refunds, in the casts with
    # people and the answerer whose errands are not the digest's, drawn from a stream of
    # their own.
    deep = (
        "person" in cfg.actors
        and "answerer" in cfg.actors
        and not digest
        and (limits is None or limits.tool != "book")  # (a rate's key is the tool's name)
        and trees.takes_part(cfg.seed)
    )
    w.deploy = Deploy(
        saga="answerer" in cfg.actors,
        quorum=quorum and not rules,
        concurrent=concurrent,
        limits=limits,
        digest=digest,
        rules=1 if rules else 0,
        expiry=rulecast.expiry_of(cfg.seed) if rules else "deny",
        # Gated and compensable refunds (issue 43) came after prunes, in saga deploys, drawn
        # from a stream of their own.
        undo_refunds="answerer" in cfg.actors and undo_refunds(cfg.seed),
        deep=deep,
        # An MCP server's tools (issue 45) came after trees three deep, drawn from a stream
        # of their own in the answerer's casts.
        remote=remote.takes_part(cfg),
    )
    w.deploy.activate()
    if w.deploy.remote:  # (the seed's own draws pick the server's tools: its schedule is its own)
        w.plans.tools += list(remote.PICKS)
    if deep:  # (the seed's own draws pick errands more often: its schedule is its own)
        w.plans.tools += [ERRAND, ERRAND]
    if digest:  # today's booking was made before the seed began: the next waits a day
        rate = parse_rate(DIGEST_RATE, "the errands' booking")
        w.raw.take_permit(tool_key("book"), rate.count, rate.period)
    w.deliveries = {f"d{i}": w.plans.make() for i in range(1, 3)}
    w.chat = [w.plans.make() for _ in range(2)]
    if deep:
        w.plans.errand_first = 2  # the client's first two plans open with an errand

    def on(kind: str, p: float = 0.75) -> bool:
        # Every draw happens whatever the config, so narrowing it keeps the other choices.
        return rng.random() < p and kind in cfg.actors

    actors: list[Actor] = []
    more = w.hunt.rng.randint(1, 2) if w.hunt.large else 0  # a larger cast (issue 32)
    if on("client", 1.0):
        actors.append(Client("client", w.plans, rng.randint(1, 3) + more))
    if "driver" in cfg.actors:
        actors += [Driver(f"driver{i}") for i in range(1, cfg.drivers + 1 + min(more, 1))]
    if on("recovery", 0.9):
        actors.append(Recovery("recovery"))
    if on("person"):
        actors += [
            Person(n, rng.randint(0, 2), rng.choice([0, 0, 1]))
            for n in ("ann", "bob")[: cfg.persons]
        ]
    if rules:
        quorum = False  # refunds are gated by the rules: their quorum is finance's
    if quorum and any(isinstance(a, Person) for a in actors):
        # Half the quorum casts with the answerer have a third member (cat), drawn from the
        # quorum's stream: two of three can pass it, and a vote can come after the quorum
        # is decided. (Casts without the answerer keep the known-hole seeds' schedules.)
        qrng = random.Random(f"quorum-cast:{cfg.seed}")
        if qrng.random() < 0.5 and "answerer" in cfg.actors:
            actors.append(Person("cat", qrng.randint(0, 2), qrng.choice([0, 0, 1])))
        w.eligible = [a.name for a in actors if isinstance(a, Person)]
        actors.append(Outsider("eve", 2))
    if on("deployer", 0.8):
        actors.append(Deployer("deployer", rng.randint(1, 4)))
    if on("webhook", 0.5):
        actors += [Webhook("webhook1", rng.randint(1, 4)), Webhook("webhook2", rng.randint(0, 3))]
    if on("stepper", 0.15):
        actors += [Stepper("stepper1", 2), Stepper("stepper2", 1)]
    # The one exception to "every draw happens whatever the config": a seed without the
    # answerer draws what it drew before waits existed (see ``Plans``).
    if "answerer" in cfg.actors and on("answerer", 0.8):
        actors.append(Answerer("carol", rng.randint(2, 6)))
    # Signed decisions came after quorums, with the answerer's casts (so the known-hole
    # seeds keep their schedules): the people hold keys and sign some decisions, and
    # someone who captured them replays them elsewhere (its choices from the signing
    # stream; it moves only once something is signed).
    if "answerer" in cfg.actors and any(isinstance(a, Person) for a in actors):
        for person in actors:
            if isinstance(person, Person):
                w.give_key(person.name)
        actors.append(Replayer("mallory", 3))
    # Cancels of a tree with a sub-run paused or busy (issue 29) came after signing, with
    # the answerer's casts, drawn from a stream of their own.
    if canceller:
        actors.append(TreeCanceller("dora", 2, aimed=1 if digest else 0))
    # Imports (issue 31) came after cancels of trees, drawn from a stream of their own: an
    # operator imports runs as evidence, and every command is tried on the copies.
    if "importer" in cfg.actors and random.Random(f"import:{cfg.seed}").random() < 0.35:
        actors.append(Importer("ivan", 2, 4))
    # Deletes (issue 41) came after imports, drawn from a stream of their own: an operator
    # deletes finished runs, and every way back to a deleted id is tried.
    if "operator" in cfg.actors and random.Random(f"operator:{cfg.seed}").random() < 0.3:
        actors.append(Operator("olga", 3, 5))
    # Prunes (issue 43) came after deletes, drawn from a stream of their own, in the
    # answerer's casts (errands make trees there): an operator cancels stale trees, prunes,
    # keeps the export, and comes back to what it pruned.
    if "operator" in cfg.actors and "answerer" in cfg.actors and pruning.takes_part(cfg.seed):
        actors.append(pruning.Pruner("pam", cfg.seed, 3, 2, 4))
    # A stale driver giving a slot back after a takeover (issue 43) came after prunes, in
    # the casts whose agent has a limit on runs, drawn from a stream of its own.
    if limits is not None and limits.runs and "driver" in cfg.actors and slots.takes_part(cfg.seed):
        actors.append(slots.SlotStaller("sid", cfg.seed, 3))
        drivers = [a for a in actors if isinstance(a, Driver)]
        if len(drivers) < 3:
            # A worker more: one frozen, one driving its successor, one for the run that
            # waits for the slot (else it waits in the queue, not for the slot).
            actors.append(Driver(f"driver{len(drivers) + 1}"))
    # A person voting twice before anyone else has (issue 43) came after the staller, in
    # the quorum casts, drawn from a stream of its own: the first member's two tabs.
    if quorum and w.eligible and votes.takes_part(cfg.seed):
        actors += [votes.Tab(w.eligible[0], 1), votes.Tab(w.eligible[0], 2)]
    # A person deciding from pages left open, after their requests closed (issue 43), came
    # after the second tab, in the casts with people and the answerer (so the known-hole
    # seeds keep their schedules), drawn from a stream of its own.
    people = [a.name for a in actors if isinstance(a, Person)]
    if people and "answerer" in cfg.actors and votes.stale_pages(cfg.seed):
        actors.append(votes.StalePage(people[0], cfg.seed, 3))
    if rules and any(isinstance(a, Person) for a in actors):
        people = [a.name for a in actors if type(a) is Person]
        actors += rulecast.cast(w, people)
    # A root cancelled as a sub-run below it starts its own (issue 43) came after the rules
    # casts, in the casts whose trees are three deep.
    if deep and any(isinstance(a, Person) for a in actors):
        actors.append(trees.LateCanceller(w, "lee", cfg.seed, 2))
    # A run rolled back as soon as an approver's edit of its refund ran (issue 43) came after
    # the late canceller, in the casts that undo refunds, with people.
    if w.deploy.undo_refunds and any(isinstance(a, Person) for a in actors):
        actors.append(rollbacks.EditUndoer(w, "rita", cfg.seed, 2))
    # The targeted adversaries act only where their marks are: captured signatures with a
    # replayer, forks with people.
    w.intercepts = w.intercepts and any(isinstance(a, Replayer) for a in actors)
    w.aims_forks = w.aims_forks and any(isinstance(a, Person) for a in actors)
    # A halt on a stalled driver's call resolved at once (issue 43) came after the rules
    # cast, in the casts with drivers, recovery and people (and the answerer, so the
    # known-hole seeds keep their schedules), drawn from a stream of its own.
    if (
        "answerer" in cfg.actors
        and any(isinstance(a, Driver) for a in actors)
        and any(isinstance(a, Recovery) for a in actors)
        and "person" in cfg.actors
        and halts.takes_part(cfg.seed)
    ):
        w.halt_aim = halts.HaltResolver("nora", cfg.seed, 2)
        # A worker more, free to take the frozen driver's run over when recovery hands it.
        drivers = [a for a in actors if isinstance(a, Driver)]
        actors += [w.halt_aim, Driver(f"driver{len(drivers) + 1}")]
    # A deploy timed to a signed approval, and its signature replayed on the call asked again
    # (issue 43), came after the halt aim, in the casts whose people hold keys, drawn from a
    # stream of its own; not in the rules casts (its prompt approver would decide the refunds
    # their editor halves first: ``edit-lowers-need`` went from 7 of CI's 600 to 2).
    if (
        w.keys
        and not w.intercepts
        and not rules
        and "replayer" in cfg.actors
        and rollout.takes_part(cfg.seed)
    ):
        w.sign_odds = 1.0
        people = [a.name for a in actors if type(a) is Person]
        actors += [rollout.PromptApprover(people[0], 2), rollout.Rollout("oscar", cfg.seed, 2, 2)]
    w.actors = actors
    w.log(
        "-",
        f"cast: {', '.join(a.name for a in actors)}; crash x{w.crash_rate} "
        f"stall x{w.stall_rate}{'; split writes' if w.split_writes else ''}",
    )


def main_phase(w: W.World, check: Callable[[W.World], None]) -> None:
    """Actors interleaved by the seed, with crashes and stalls, until nothing moves any
    more (twice, with the clock moved past every lease in between) or the step budget is
    spent."""
    quiet_spells = 0
    for step in range(w.config.steps):
        w.step = step
        w.deliver_late()
        # A process that just woke from a stall, or a person's resolution, moves first and
        # at once: no time passes and nobody else moves until it reaches a store call.
        first = [a.proc for a in w.actors if a.proc and a.proc.urgent and a.proc.ready(w.now)]
        if first:
            w.move(first[0], faults=first[0].exclusive)
            check(w)
            continue
        stalled = any(a.proc is not None and a.proc.stalled_until for a in w.actors)
        # While a process is frozen, time runs slow: the others get many steps to take its
        # run over (and a person to act on it) before it wakes.
        w.advance(w.rng.choice(W.STALL_STEP_SECONDS if stalled else W.STEP_SECONDS))
        options: list[tuple[int, Actor]] = []
        for actor in w.actors:
            if actor.proc is not None:
                if actor.proc.ready(w.now):
                    options.append((4, actor))
            else:
                weight = actor.weight(w)
                if weight:
                    options.append((weight, actor))
        idle = not any(a.proc for a in w.actors) and all(a.kind == "recovery" for _, a in options)
        if idle or step - w.progress > 60:
            if quiet_spells == 2:
                return
            # Nothing new happens: let crashed processes' leases lapse (and halts age), so
            # recovery and people find what they left behind; twice at most.
            quiet_spells += 1
            w.progress = step
            w.log("-", "nothing new happens: the clock moves past every lease")
            w.advance_by(2 * w.config.ttl + 1)
            continue
        if not options:  # all stalled or asleep
            procs = [a.proc for a in w.actors if a.proc is not None]
            wake = min(max(p.stalled_until, p.sleep_until) for p in procs)
            w.advance(min(w.config.ttl / 3, max(0.1, wake - w.now)))
            continue
        actor = w.pick(options)
        if actor.proc is not None:
            w.move(actor.proc, faults=True)
        else:
            chosen = actor.choose(w)
            if chosen is not None:
                proc = w.start(actor, *chosen)
                if getattr(chosen[1], "exclusive", False) and not proc.glet.dead:
                    proc.exclusive = proc.urgent = True
        check(w)


def drain_phase(w: W.World) -> None:
    """No new operations and no more faults: every process still alive finishes (stalled
    ones continue when their stall ends)."""
    w.phase = "drain"
    for guard in range(20000):
        w.step = guard
        procs = [a.proc for a in w.actors if a.proc is not None]
        if not procs:
            return
        ready = [p for p in procs if p.ready(w.now)]
        if not ready:
            wake = min(max(p.stalled_until, p.sleep_until) for p in procs)
            w.advance(min(w.config.ttl / 3, max(0.1, wake - w.now)))
            continue
        urgent = [p for p in ready if p.urgent]
        w.move(urgent[0] if urgent else ready[w.rng.randrange(len(ready))], faults=False)
    w.violate("terminates", "processes were still running after 20000 drain steps", hole="new")


def quiet_phase(w: W.World) -> None:
    """Crashed drivers' leases expire; then recovery passes and sweeps (which hand over
    throttled runs whose retry is due), each followed by workers draining the queue, until a
    pass hands nothing over (or it is clearly never going to)."""
    w.phase = "quiet"
    w.queue += w.hunt.late  # late messages arrive at last
    w.hunt.late.clear()
    w.advance_by(2 * w.config.ttl + 1)
    worker = Driver("worker")
    beat = Recovery("beat")
    w.actors += [worker, beat]
    from durable_agents.engine import runtime
    from durable_agents.engine.commands.recovery import recover, resend_at
    from durable_agents.engine.commands.timers import wake_timers

    from .invariants import sweep_reaches_down

    def drain() -> None:
        # Copies of one message are driven once: the rest would find it driven already.
        pending, w.queue[:] = list(dict.fromkeys(w.queue)), []
        for run_id in pending:
            proc = w.start(
                worker, f"drive {run_id}", lambda run_id=run_id: drive_like_a_worker(w, run_id)
            )
            w.last_drive[run_id] = w.run_to_end(proc).outcome

    # The first drain's workers may meet one of the aim's targets (a crash or a store failure
    # at a write the main phase seldom makes: recovery's compensations); the leases of a
    # worker that crashed expire before the passes begin, as the main phase's did above.
    w.quiet_aim = w.aim is not None
    drain()
    w.quiet_aim = False
    if w.quiet_faults:
        w.advance_by(2 * w.config.ttl + 1)
    session_liveness(w, worker)
    # Limits slow the settling down (a run waits for its rate or its slot, again and again
    # while others go first): a seed with them gets more passes; one whose errands book at
    # one a day (and a fork books again) lets a day pass for each of them.
    # (A three-deep tree's errands book at one in 90 s, each after the other: 40 too; 60 with
    # limits besides, where a fork of such a tree waits for slots at every level: fresh
    # seed 9101403 settled its last sub-run on the 40th pass.)
    passes = 40 if w.deploy.digest or w.deploy.deep else 10 if w.limits() is None else 20
    if passes == 40 and w.limits() is not None:
        passes = 60
    for round_ in range(passes):
        w.step = round_
        proc = w.run_to_end(w.start(beat, "recovery pass", recover))
        sent = list(proc.result or [])
        sweep = w.run_to_end(
            w.start(
                beat,
                "timer sweep",
                lambda: sweep_reaches_down(w, lambda: wake_timers(store=w.store)),
            )
        )
        sent += list(sweep.result or [])
        w.recovery_rounds.append(sent)
        if not sent and not w.queue:  # (a drive of the last drain may have handed one over)
            # A run still queued whose message was lost is sent again once it has waited as
            # long again as it had (``recovery.resend_at``): move the clock there, once more.
            due = [
                at
                for r in w.runs
                if (row := w.raw.get_run(r)) is not None
                and row.status == "queued"
                and (at := resend_at(row, runtime.recovery_interval())) is not None
            ]
            # A throttled run is handed over when its retry comes due: let it.
            due += [t.retry_at for t in w.raw.list_throttled(limit=1000)]
            if not due or round_ == passes - 1:
                return
            w.advance_by(max(1.0, max(due).timestamp() - w.now + 1.0))
            continue
        drain()
        w.advance_by(30.0)  # past any back-off recovery keeps for a failing run


def session_liveness(w: W.World, worker: Actor) -> None:
    """A session whose open turn was cancelled or failed for good still takes a message."""
    records = Journal(w.raw).records(f"{SESSION}>session")
    answered = {r.get("run_id") for r in records if r.name.startswith("answer:")}
    sends = [r for r in records if r.name.startswith("turn:")]
    open_turn = next((r for r in reversed(sends) if r.get("run_id") not in answered), None)
    if open_turn is None:
        return
    run = w.raw.get_run(str(open_turn.get("run_id")))
    if run is None or run.status not in (CANCELLED, FAILED):
        return
    if run.status == FAILED and (run.last_error or {}).get("retryable"):
        return
    text = "plan:lookup.99.0"

    def send() -> Any:
        try:
            return get_agent(AGENT).session(SESSION, store=w.store).send(text).answer
        except ConfigError as exc:
            if exc.code == "session.turn_open":
                w.violate(
                    "sessions_stay_open",
                    f"session {SESSION!r}: turn {run.run_id!r} is {run.status} for good, and "
                    f"a new message is refused ({exc.code})",
                    hole="9",
                )
            raise

    w.run_to_end(w.start(worker, f"send {text}", send))


def simulate(config: W.Config) -> W.World:
    """Run one seed: build, interleave, drain, settle; then check every invariant."""
    from .invariants import check_all, check_as_we_go

    w = W.World(config)
    with W.patched(w):
        try:
            build(w)
            w.phase = "main"
            main_phase(w, check_as_we_go)
            drain_phase(w)
            quiet_phase(w)
            check_all(w)
            pruning.at_rest(w)
        finally:
            w.teardown()
            remote.close(w)
    return w
