"""Reading the admin as a logged-in user with Django's test client."""

from __future__ import annotations

import html
import json
from typing import Any

from django.contrib.messages import get_messages
from django.test import Client


def client_for(user: Any) -> Client:
    """A test client logged in as ``user`` (None: anonymous)."""
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def text_of(response: Any) -> str:
    """The page's HTML with entities decoded, for plain-text assertions."""
    return html.unescape(response.content.decode())


def messages_of(response: Any) -> list[str]:
    """The messages (``django.contrib.messages``) the request left for the next page."""
    return [str(m) for m in get_messages(response.wsgi_request)]


def shown(request: Any) -> str:
    """The ``shown`` a decision form posts back: the arguments its page showed whole (an
    approval request's). The decide view refuses a decision without it."""
    return json.dumps(request.arguments, ensure_ascii=False, sort_keys=True)
