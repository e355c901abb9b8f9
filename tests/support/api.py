"""Calling the ninja API (mounted by tests/urls.py at /api/agents/) as a given user, through
Django's test client: by session or by API key, and checking an error answer's code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from durable_agents.api.auth import issue_api_key
from tests.support.people import make_user

API = "/api/agents"


def session(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@dataclass
class Caller:
    client: Client
    headers: dict[str, str]

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(API + path, params, headers=self.headers)

    def post(self, path: str, body: Any = None, *, raw: str | None = None) -> Any:
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            API + path, data=data, content_type="application/json", headers=self.headers
        )

    def put(self, path: str, body: Any) -> Any:
        return self.client.put(
            API + path, data=json.dumps(body), content_type="application/json", headers=self.headers
        )


def as_session(user: User) -> Caller:
    return Caller(session(user), {})


def with_key(user: User) -> Caller:
    _, raw = issue_api_key(user, "tests")
    return Caller(Client(), {"X-API-Key": raw})


def staff_with(*perms: str, name: str = "operator") -> Caller:
    """A staff caller by API key who may read runs (``view_run``), and holds ``perms``."""
    return with_key(make_user(name, "durable_agents.view_run", *perms))


def error(response: Any, status: int, code: str) -> dict:
    """Assert ``response`` is the API's error answer ``status`` with ``code`` and a message."""
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body
