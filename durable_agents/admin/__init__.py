"""The staff admin, one module per concept: ``inbox`` (one card per thing waiting on a
person; ``rendered``: arguments as a person reads them), ``runs`` (the list, the run page,
resume and cancel), ``queues`` (approvals and halts; ``deciding``: deciding calls one at a
time or in bulk; ``counts``: what waits on a person, on the index), ``forks`` (fork,
compare, lineage), ``sessions``, ``actions`` (the action log), ``keys`` (API and approver
keys), ``notifications`` (the outbox: what was not sent, and Retry), ``delegations`` (who
decides for an approver who is away), ``timeline`` (the journal as the run page shows it)
and ``base`` (what they share).
Importing the package registers every model admin. See docs/admin.md.
"""

from django.contrib import admin

from . import actions, delegations, inbox, keys, limits, notifications, queues, runs  # noqa: F401  (each registers its model admins)

# The index's app list names what waits ("Inbox (6)"), as the app's own index does; a site
# that set an index template of its own keeps it (its template can load the same tag).
if admin.site.index_template is None:
    admin.site.index_template = "admin/durable_agents/index.html"
