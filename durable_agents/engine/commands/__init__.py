"""What people and processes do to runs, one module per concept: ``runs`` (start, resume,
hand over, cancel, pending), ``approvals`` (approve), ``halts`` (resolve a halt), ``forks``
(fork a run or a session), ``sessions`` (durable conversations), ``recovery`` (hand
abandoned runs back). Each command given ``by=`` writes its own action-log entry.

Importing any of them installs the inline driver (``runs.drive_quietly``) that
``runtime.dispatch`` falls back to when no dispatcher is configured.
"""

from . import runs as runs
