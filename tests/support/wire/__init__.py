"""A local HTTP server that replays recorded provider answers to the real SDKs, and the
recorded answers themselves (``<provider>_<what>.json`` in this directory).

Tests queue replies (status, headers, JSON body), point an adapter's ``base_url`` at
``server.url``, and read back what the SDK sent in ``server.requests``. A request that
finds the queue empty is answered 599 and listed in ``server.unexpected``, so a test that
makes one call too many fails rather than passing on an invented answer.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent  # the recorded answers sit beside this module


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering, to provoke client timeouts


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def fixture(name: str) -> dict[str, Any]:
    """A recorded exchange: ``{"status": ..., "headers": {...}, "body": {...}}``, fresh copy."""
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return copy.deepcopy(data)


def reply(name: str, **body_changes: Any) -> Reply:
    """The fixture ``name`` as a ``Reply``, with top-level body keys overridden."""
    data = fixture(name)
    body = data["body"]
    body.update(body_changes)
    return Reply(status=data["status"], body=body, headers=data.get("headers", {}))


class WireServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        port = self._httpd.server_address[1]
        return f"http://127.0.0.1:{port}"

    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    @property
    def last_body(self) -> Any:
        assert self.requests, "the SDK sent no request"
        return self.requests[-1].body

    def start(self) -> WireServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next(self, seen: Recorded) -> Reply | None:
        with self._lock:
            self.requests.append(seen)
            if self.replies:
                return self.replies.popleft()
            self.unexpected.append(seen)
            return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                seen = Recorded(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                answer = server._next(seen) or Reply(599, {"error": "wire: no reply queued"})
                if answer.delay:
                    time.sleep(answer.delay)
                payload = json.dumps(answer.body).encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler
