"""The queue-health warning on the admin index (``queue_health.stalled_runs``).

The admin index has no hook for an app (its template is the site's, and an app's override
would need to come before ``django.contrib.admin`` in ``INSTALLED_APPS``). Building the index,
the admin asks every model admin whether the user may see its app; the runs admin answers and
calls ``warn_on_index``, which adds the warning to the page's messages, once per request.
"""

from __future__ import annotations

from django.contrib import messages
from django.db import DatabaseError
from django.http import HttpRequest

from ..celery.queue_health import stalled_runs

_SEEN = "_durable_agents_queue_health"


def warn_on_index(request: HttpRequest) -> None:
    match = getattr(request, "resolver_match", None)
    if match is None or match.url_name != "index" or getattr(request, _SEEN, False):
        return
    setattr(request, _SEEN, True)
    try:
        health = stalled_runs()
    except DatabaseError:
        return  # the index must open even when this read fails
    if health:
        messages.warning(request, f"Durable agents: {health.message()}", fail_silently=True)
