"""Finding agents by name in any process: import the modules ``DURABLE_AGENTS["AGENTS"]``
names (an ``Agent`` object, a list of them, or a module defining them)."""

from __future__ import annotations

import threading

from django.utils.module_loading import import_string

from .conf import get_settings
from .engine.errors import ConfigError

_loaded: set[str] = set()
_lock = threading.Lock()


def load_agents() -> None:
    for path in get_settings().agents:
        if path in _loaded:
            continue
        with _lock:
            if path in _loaded:
                continue
            try:
                import_string(path)
            except ImportError:
                try:
                    __import__(path)  # a module that defines agents
                except ImportError as exc:
                    raise ConfigError(
                        f"DURABLE_AGENTS['AGENTS'] names {path!r}, which cannot be imported: {exc}",
                        code="config.agents",
                    ) from exc
            _loaded.add(path)
