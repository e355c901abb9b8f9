"""The staff admin, one module per concept: ``inbox`` (one card per thing waiting on a
person; ``rendered``: arguments as a person reads them), ``runs`` (the list, the run page,
resume and cancel), ``queues`` (approvals and halts; ``deciding``: deciding calls one at a
time or in bulk; ``counts``: what waits on a person, on the index), ``forks`` (fork,
compare, lineage), ``sessions``, ``actions`` (the action log), ``keys`` (API and approver
keys), ``timeline`` (the journal as the run page shows it) and ``base`` (what they share).
Importing the package registers every model admin. See docs/admin.md.
"""

from . import actions, inbox, keys, limits, queues, runs  # noqa: F401  (each registers its model admins)
