"""A real HTTP receiver for the notification tests: ``http.server`` on 127.0.0.1 in a thread,
answering each POST as its script says (a status, or ``"hang"``: no answer until released),
then 200; it records every request it read, headers and raw body."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = "hang"


@dataclass(frozen=True)
class Got:
    path: str
    headers: dict[str, str]
    body: bytes
    answer: Any  # the status it answered, or HANG


class Receiver:
    def __init__(self) -> None:
        self.script: deque[Any] = deque()
        self.got: list[Got] = []
        self.hanging = 0
        self.release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    answer = receiver.script.popleft() if receiver.script else 200
                    receiver.got.append(Got(self.path, dict(self.headers.items()), body, answer))
                if answer == HANG:
                    with receiver._lock:
                        receiver.hanging += 1
                    receiver.release.wait(60)
                    with receiver._lock:
                        receiver.hanging -= 1
                    answer = 200
                try:
                    self.send_response(int(answer))
                    if int(answer) == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"said": "%d"}' % int(answer))
                except OSError:  # the sender gave up waiting
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hooks/approvals"

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_hanging(self, timeout: float = 10.0) -> None:
        """Until a request hangs here (poll, with a deadline)."""
        deadline = time.monotonic() + timeout
        while self.hanging == 0:
            assert time.monotonic() < deadline, "no request reached the receiver"
            time.sleep(0.01)


def verified(got: Got, setting: str = "NOTIFY_HOOK_SECRET") -> dict[str, Any]:
    """The payload of a request the receiver got, its signature checked twice: by the
    scheme as docs/notifications.md states it, and by the inbound webhook's own check (a
    receiver verifies with the same code)."""
    from django.conf import settings
    from django.test import RequestFactory

    from durable_agents.webhooks import InboundWebhook

    secret = getattr(settings, setting)
    delivery_id = got.headers["X-Delivery-Id"]
    parts = dict(p.split("=", 1) for p in got.headers["X-Signature"].split(","))
    t = int(parts["t"])
    mac = hmac.new(secret.encode(), f"{t}.{delivery_id}.".encode() + got.body, hashlib.sha256)
    assert parts["v1"] == mac.hexdigest()
    assert abs(time.time() - t) < 60
    view = InboundWebhook(secret_setting=setting, tolerance=300)
    request = RequestFactory().post(
        "/", got.body, content_type="application/json", HTTP_X_SIGNATURE=got.headers["X-Signature"]
    )
    view._verify(request, delivery_id, got.body)  # raises Refused if it does not verify
    assert got.headers["Content-Type"] == "application/json"
    payload: dict[str, Any] = json.loads(got.body)
    return payload
