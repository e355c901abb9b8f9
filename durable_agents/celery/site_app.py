"""The Celery app this process sends with: the site's own (README, ``mysite/celery.py``).

Celery keeps its current app per thread. In a thread of a threaded web server (gunicorn's
``gthread``, ``runserver``) that did not create the site's app, the current app is Celery's
fallback — broker ``amqp://guest@localhost`` — unless the site made its app the default.
A hand-over sent with it reaches no worker: runs would move only at the next recovery pass.
So hand-overs go through ``site_app()``, and the system check ``durable_agents.E007`` says
when this process has no app of the site's at all (the ``mysite/__init__.py`` block left out),
or one that sends to another broker than ``CELERY_BROKER_URL``.
"""

from __future__ import annotations

from typing import Any

from celery import _state  # Celery has no public way to list the apps a process made

FALLBACK = "default"  # the name Celery gives the app it makes when none was set


def _fallback(app: Any) -> bool:
    return bool(app.main == FALLBACK)


def site_app() -> Any | None:
    """The site's Celery app: the current one unless that is Celery's fallback, else the
    only other app this process made; None when there is none (or several to choose from)."""
    current = _state.get_current_app()
    if not _fallback(current):
        return current
    apps = [app for app in _state._get_active_apps() if not _fallback(app)]
    return apps[0] if len(apps) == 1 else None


def task(name: str) -> Any:
    """The task ``name`` bound to the site's app (or to Celery's current app if the site has
    none: the check says so)."""
    app = site_app() or _state.get_current_app()
    return app.tasks[name]
