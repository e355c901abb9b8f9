"""Reading Server-Sent Events (``durable_agents.database.events``) as a client does: parsing the
text, and following a stream over a real HTTP connection."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit


def parse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE text: ``{"event", "id", "data"}`` (data decoded from JSON), and
    ``{"comment": …}`` for comment lines; a ``retry:`` field is ``{"retry": ms}``."""
    events: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event: dict[str, Any] = {}
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "":
                events.append({"comment": value})
            elif field == "data":
                event["data"] = json.loads(value)
            elif field == "retry":
                event["retry"] = int(value)
            else:
                event[field] = value
        if event:
            events.append(event)
    return events


def records(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(int(e["id"]), e["data"]["name"]) for e in events if e.get("event") == "record"]


class Stream(threading.Thread):
    """A client of one SSE URL over its own HTTP connection, in a thread; ``events`` grows
    as they arrive; ``drop()`` breaks the connection like a network failure would."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.headers = headers
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self.content_type: str | None = None
        self.error: BaseException | None = None
        self.sock: socket.socket | None = None

    def run(self) -> None:
        try:
            self.conn.request("GET", self.path, headers=self.headers)
            self.sock = self.conn.sock  # the response takes it over from the connection
            response = self.conn.getresponse()
            self.status, self.content_type = response.status, response.getheader("Content-Type")
            block = ""
            while True:
                line = response.readline().decode()
                if not line:
                    return
                block += line
                if line == "\n":
                    self.events.extend(parse(block))
                    block = ""
        except (OSError, http.client.HTTPException) as exc:
            self.error = exc

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.shutdown(socket.SHUT_RDWR)
