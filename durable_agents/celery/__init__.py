"""The glue that talks to Celery: how a run reaches a worker and what workers and beat run.

* ``tasks`` — the tasks (``drive_run``, ``wake_timers``, ``recover_runs``, ``prune``). Their
  names stay ``durable_agents.tasks.*`` and ``durable_agents/tasks.py`` re-exports them, so
  Celery's autodiscovery finds them and messages sent before an upgrade still land.
* ``dispatch`` — handing a run to a worker (or to this process, inline) after commit.
* ``schedule`` — ``beat_schedule(...)``, the beat entries built from ``DURABLE_AGENTS``.
* ``recovery`` and ``queue_health`` — what beat runs to recover runs, and the check that
  someone consumes the queue.
* ``transport`` — a Redis transport that survives a Redis restart.
* ``worker_start`` and ``shutdown`` — a worker refuses bad settings; warm shutdown.

(This package is ``durable_agents.celery``; inside it, ``import celery`` still means Celery:
imports are absolute.)
"""
