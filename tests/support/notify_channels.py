"""A channel of a site's own, by dotted path (``{"kind": "tests.support.notify_channels.
Collect", ...}``): it keeps what it is handed, or refuses it when its options say so."""

from __future__ import annotations

from typing import Any

from durable_agents.notifications import DeliveryFailed, Notice

received: list[tuple[dict[str, Any], Notice]] = []


class Collect:
    def __init__(self, config: Any) -> None:
        self.options = dict(config.options)

    def send(self, notice: Notice) -> None:
        if self.options.get("refuse"):
            raise DeliveryFailed(str(self.options["refuse"]), retry=False)
        received.append((self.options, notice))


not_a_channel = 42
