"""Where the glue gets a ``DjangoStore``: ``store_for(using)``.

The site's shared store is ``store.site_store()``; the glue's other code that needs a store
on a given alias (an export, an import, a prune, an audit check) asks here rather than
building one, so what a store is built from is decided in one place (a test checks that no
other module constructs ``DjangoStore``).
"""

from __future__ import annotations

from .store import DjangoStore

__all__ = ["store_for"]


def store_for(using: str | None = None) -> DjangoStore:
    """A ``DjangoStore`` on the alias ``using`` (the settings' ``DATABASE`` when None), with
    the settings' choices for that alias (prepared statements, instant takeover, pooling).
    A new store each call: it shares no lease tails with the site's store."""
    return DjangoStore(using)
