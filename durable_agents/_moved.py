"""Import paths from before the glue was grouped into ``durable_agents.database`` and
``durable_agents.celery``, and before the top-level modules that shared a name with one in
``engine/`` or ``admin/`` were renamed for what they are (0.2). They still import — the
very same module object, so a setting, a monkeypatch or an ``isinstance`` check written
against an old path keeps working — and warn with ``DeprecationWarning`` naming the new
path. They go in 0.4.

Settings are where old paths live longest (``CELERY_BROKER_TRANSPORT =
"durable_agents.celery_transport:Transport"``, ``from durable_agents.schedule import
beat_schedule``), which is why they are aliased rather than simply removed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED = {
    "durable_agents.audit": "durable_agents.database.audit",
    "durable_agents.events": "durable_agents.database.events",
    "durable_agents.followers": "durable_agents.database.followers",
    "durable_agents.liveness": "durable_agents.database.liveness",
    "durable_agents.prepared": "durable_agents.database.prepared",
    "durable_agents.retention": "durable_agents.database.retention",
    "durable_agents.storage": "durable_agents.database.store",
    "durable_agents.celery_transport": "durable_agents.celery.transport",
    "durable_agents.dispatch": "durable_agents.celery.dispatch",
    "durable_agents.queue_health": "durable_agents.celery.queue_health",
    "durable_agents.recovery": "durable_agents.celery.recovery",
    "durable_agents.schedule": "durable_agents.celery.schedule",
    "durable_agents.shutdown": "durable_agents.celery.shutdown",
    "durable_agents.worker_start": "durable_agents.celery.worker_start",
    # Renamed apart from engine.registry, engine.telemetry and admin.keys.
    "durable_agents.registry": "durable_agents.agent_loader",
    "durable_agents.telemetry": "durable_agents.otel",
    "durable_agents.keys": "durable_agents.people_keys",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}; the old path goes in durable_agents 0.4",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns whatever sys.modules holds under the name once the
        # loader is done, so the old name becomes the new module itself, not a copy.
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
