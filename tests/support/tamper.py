"""Tampering with stored journals and action logs behind the library's back, on every
store, to test that the audit chains show it (tests/conformance/test_audit.py)."""

from __future__ import annotations

from typing import Any

from django.db import connections

from durable_agents.engine.memstore import InMemoryStore
from durable_agents.models import ActionLog, JournalEntry

_J = JournalEntry._meta.db_table


def _sql(store: Any, sql: str, params: list[Any]) -> None:
    with connections[store.using].cursor() as cursor:
        cursor.execute(sql, params)


def edit_record(store: Any, run_id: str, name: str, data: str) -> None:
    if isinstance(store, InMemoryStore):
        ordered = store._ordered[run_id]
        i = next(i for i, e in enumerate(ordered) if e.name == name)
        ordered[i] = store._entries[run_id][name] = ordered[i]._replace(data=data)
        return
    _sql(store, f"UPDATE {_J} SET data = %s WHERE run_id = %s AND name = %s", [data, run_id, name])


def delete_record(store: Any, run_id: str, name: str) -> None:
    if isinstance(store, InMemoryStore):
        store._ordered[run_id] = [e for e in store._ordered[run_id] if e.name != name]
        del store._entries[run_id][name]
        return
    _sql(store, f"DELETE FROM {_J} WHERE run_id = %s AND name = %s", [run_id, name])


def swap_records(store: Any, run_id: str, a: str, b: str) -> None:
    """Swap two records' positions (their seqs): the rows say b came before a."""
    if isinstance(store, InMemoryStore):
        ordered = store._ordered[run_id]
        i = next(i for i, e in enumerate(ordered) if e.name == a)
        j = next(j for j, e in enumerate(ordered) if e.name == b)
        ea, eb = ordered[i], ordered[j]
        ordered[i], ordered[j] = eb._replace(seq=ea.seq), ea._replace(seq=eb.seq)
        return
    seq = {
        name: JournalEntry.objects.using(store.using).get(run_id=run_id, name=name).seq
        for name in (a, b)
    }
    _sql(store, f"UPDATE {_J} SET seq = %s WHERE seq = %s", [-1, seq[a]])
    _sql(store, f"UPDATE {_J} SET seq = %s WHERE seq = %s", [seq[a], seq[b]])
    _sql(store, f"UPDATE {_J} SET seq = %s WHERE seq = %s", [seq[b], -1])


def clear_hashes(store: Any, run_id: str, names: list[str]) -> None:
    """Make records look written before the chain existed (no hash)."""
    if isinstance(store, InMemoryStore):
        for name in names:
            store._hashes.pop((run_id, name), None)
        hashed = [store._hashes.get((run_id, e.name)) for e in store._ordered[run_id]]
        head = next((h for h in reversed(hashed) if h), None)
        if head is None:
            store._heads.pop(run_id, None)
        return
    for name in names:
        _sql(store, f"UPDATE {_J} SET hash = NULL WHERE run_id = %s AND name = %s", [run_id, name])


def edit_action(store: Any, index: int, payload: dict[str, Any]) -> int:
    """Change the payload of the ``index``-th action-log row (0 first); return its position."""
    if isinstance(store, InMemoryStore):
        action = store._actions[index]
        store._actions[index] = type(action)(**{**action.__dict__, "payload": payload})
        return index + 1
    row = ActionLog.objects.using(store.using).order_by("id")[index]
    ActionLog.objects.using(store.using).filter(pk=row.pk).update(payload=payload)
    return int(row.pk)
