"""A run's journal records as they are committed: ``events(run_id, after=0)``.

On PostgreSQL every journal insert and every change of a run's status notifies the run's
channel while someone follows the run (triggers of migrations 0006, 0009 and 0010); a
follower ``LISTEN``s on a dedicated autocommit connection of its own, registers itself
(``durable_agents.database.followers``: only followed runs notify), *then* reads the backlog, then
reads again whenever a notification arrives, so no record committed in between is missed and
none is repeated (each read starts after the last ``seq`` seen). Its registration is deleted
and the dedicated connection closed when the iterator ends or is closed. Behind a
transaction pooler (``TRANSACTION_POOLING``) it listens on ``DIRECT_DATABASE``, or polls
without one (LISTEN is session state). On SQLite (or any other database) it polls every
``POLL_SECONDS``.

It ends when the run ends or pauses (see ``engine.follow``). ``agent.events(run_id)`` is
the same iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any

import psycopg
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse

from ..conf import get_settings
from ..engine.errors import NotFound
from ..engine.follow import POLL_SECONDS, Wait, pauses_or_ends, polling, ticks
from ..engine.ports import Entry, RunInfo
from ..engine.records import Record
from ..models import JournalEntry, Run
from .followers import Registration
from .store import DjangoStore, site_store

_J = JournalEntry._meta.db_table
_R = Run._meta.db_table


def channel(run_id: str) -> str:
    """The ``NOTIFY`` channel of a run (a channel name is at most 63 bytes; run ids are
    longer): ``da_run_`` and the MD5 of the id, as the trigger computes it."""
    return "da_run_" + hashlib.md5(run_id.encode()).hexdigest()


APPLICATION_NAME = "durable_agents.events"


def listen_connection(using: str, *, pooled: bool = False) -> psycopg.Connection[Any]:
    """A new autocommit connection to the database ``using`` names, with its settings;
    ``pg_stat_activity`` shows it as ``durable_agents.database.events`` unless the settings name the
    application. ``pooled``: ``using`` goes through a transaction pooler, so psycopg must
    never prepare a statement on it (the next statement may reach another server
    connection)."""
    params = dict(connections[using].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    if pooled:
        params["prepare_threshold"] = None
    params.setdefault("application_name", APPLICATION_NAME)
    return psycopg.connect(**params, autocommit=True)


class _Reader:
    """The two reads of a follower, on its own listening connection: a stream then holds no
    connection of Django's, which a WSGI server that drops a client without closing the
    response (the development server) would never give back."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def load(self, run_id: str, after: int = 0) -> Sequence[Entry]:
        rows = self.conn.execute(
            f"SELECT seq, name, data, created_at FROM {_J} "
            "WHERE run_id = %s AND seq > %s ORDER BY seq",
            [run_id, after],
        ).fetchall()
        return [Entry(run_id, name, seq, data, at) for seq, name, data, at in rows]

    def get_run(self, run_id: str) -> RunInfo | None:
        row = self.conn.execute(f"SELECT status FROM {_R} WHERE run_id = %s", [run_id]).fetchone()
        return RunInfo(run_id=run_id, status=row[0]) if row is not None else None


def _notified(conn: psycopg.Connection[Any]) -> Wait:
    def wait(timeout: float) -> bool:
        heard = False
        for _ in conn.notifies(timeout=timeout, stop_after=1):
            heard = True
        if heard:  # several commits may have notified: one read covers them all
            for _ in conn.notifies(timeout=0.0):
                pass
        return heard

    return wait


def ticks_of(
    run_id: str,
    after: int = 0,
    *,
    store: DjangoStore | None = None,
    idle: float | None = None,
    poll: float = POLL_SECONDS,
    stop: Callable[[str], bool] = pauses_or_ends,
) -> Iterator[Record | str | None]:
    """``events``, with the run's status (a ``str``) first and whenever it changes, and
    ``None`` after every ``idle`` seconds without news (a stream sends a keep-alive then;
    writing it is also how a server learns that its client left; default: the
    ``EVENTS_KEEPALIVE`` setting). Ends after the status
    ``stop`` accepts (by default: the run ended or paused)."""
    store = store or site_store()
    idle = get_settings().events_keepalive if idle is None else idle
    if not store.dialect.postgres:
        yield from ticks(store, run_id, after, wait=polling(poll), idle=idle, stop=stop)
        return
    if store.pooled and store.direct is None:
        # LISTEN is session state: behind a transaction pooler it would hear nothing (its
        # server connection goes back to the pool). Without DIRECT_DATABASE, poll, on a
        # connection of its own all the same (a stream holds none of Django's).
        conn = listen_connection(store.using, pooled=True)
        try:
            yield from ticks(_Reader(conn), run_id, after, wait=polling(poll), idle=idle, stop=stop)
        finally:
            conn.close()
        return
    conn = listen_connection(store.direct or store.using)
    follower = Registration(conn, run_id, every=idle)
    try:
        conn.execute(f'LISTEN "{channel(run_id)}"')
        follower.start()  # the run notifies from now on; before the first read
        wait = follower.waiting(_notified(conn))
        yield from ticks(_Reader(conn), run_id, after, wait=wait, idle=idle, stop=stop)
    finally:
        follower.stop()
        conn.close()


def events(run_id: str, after: int = 0, *, store: DjangoStore | None = None) -> Iterator[Record]:
    """The journal records of ``run_id`` with ``seq > after``, each as it is committed, in
    ``seq`` order; the iterator ends when the run ends or pauses (read the backlog and
    return at once for a run that already has). Resume a broken stream with ``after=`` the
    last ``seq`` you got. Raises ``NotFound`` (``run.not_found``) for an unknown run.
    Close the iterator (or leave its ``for`` loop) to free its connection early."""
    for item in ticks_of(run_id, after, store=store):
        if isinstance(item, Record):
            yield item


# -- Server-Sent Events -------------------------------------------------------------------

RETRY_MS = 3000
_DONE = object()


def record_json(record: Record) -> dict[str, Any]:
    """A record as the stream (and the journal API) shows it."""
    at = record.created_at.isoformat() if record.created_at is not None else None
    return {
        "seq": record.seq,
        "name": record.name,
        "kind": record.kind,
        "data": record.body,
        "created_at": at,
    }


def _event(kind: str, payload: Any, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"{head}event: {kind}\ndata: {text}\n\n"


def _let_go_of_request_connections() -> None:
    """Close this thread's Django connections when the stream starts (the view is done with
    them; the stream reads on a connection of its own). Even a kept one (``CONN_MAX_AGE``):
    a stream lasts as long as its page is open, and a connection kept for the thread's next
    request would sit idle that long, one per open page (under gunicorn's threads, one per
    streaming thread); and a WSGI server that drops a client without closing the response
    never ends the request. Not inside a transaction."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def frames(
    run_id: str,
    after: int = 0,
    *,
    store: DjangoStore | None = None,
    stop: Callable[[str], bool] = pauses_or_ends,
    idle: float | None = None,
) -> Generator[str]:
    """The run as Server-Sent Events: ``record`` events (``id`` = the record's seq, so a
    client reconnecting with ``Last-Event-ID`` resumes after it), ``status`` events, a
    ``: keep-alive`` comment every ``idle`` seconds (default: the ``EVENTS_KEEPALIVE``
    setting), and a last
    ``end`` event with the status the stream ended on (a client should close then, not
    reconnect)."""
    _let_go_of_request_connections()
    yield f"retry: {RETRY_MS}\n\n"
    status: str | None = None
    try:
        for item in ticks_of(run_id, after, store=store, stop=stop, idle=idle):
            if item is None:
                yield ": keep-alive\n\n"
            elif isinstance(item, Record):
                yield _event("record", record_json(item), item.seq)
            else:
                status = item
                yield _event("status", {"status": status})
    except NotFound:
        status = None  # deleted while followed
    yield _event("end", {"status": status})


async def aframes(run_id: str, after: int = 0, **options: Any) -> AsyncIterator[str]:
    """``frames`` for an ASGI server: the blocking follower runs in a thread of its own
    (its database connections are its own, closed when it ends), handing frames to the
    event loop. When the client leaves, the thread stops at its next frame (at the latest
    after a keep-alive interval)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    leaving = threading.Event()

    def put(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            with contextlib.closing(frames(run_id, after, **options)) as stream:
                for frame in stream:
                    if leaving.is_set():
                        break
                    put(frame)
        except BaseException as exc:
            put(exc)
        finally:
            connections.close_all()
            put(_DONE)

    threading.Thread(target=pump, name=f"events:{run_id}"[:60], daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        leaving.set()


def sse_response(
    request: HttpRequest, run_id: str, after: int, **options: Any
) -> StreamingHttpResponse:
    """A ``StreamingHttpResponse`` of the run's events: a generator under WSGI, an async
    iterator under ASGI."""
    content: Any
    if isinstance(request, ASGIRequest):
        content = aframes(run_id, after, **options)
    else:
        content = frames(run_id, after, **options)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


def last_event_id(request: HttpRequest, after: int) -> int:
    """Where a stream starts: after the ``Last-Event-ID`` a reconnecting client sends (a
    seq), else after ``after``. ``ValueError`` when the header is not a seq."""
    header = request.headers.get("Last-Event-ID")
    if header is None or header.strip() == "":
        return after
    value = int(header.strip())
    if not 0 <= value < 2**63:
        raise ValueError(header)
    return value
