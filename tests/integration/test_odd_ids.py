"""Odd bytes in an id never give a 500 (issue 31): a NUL in an admin URL or query is a 404
(PostgreSQL refuses the byte in any text), and a newline, a lone surrogate's bytes or an
overlong id is at worst a 404 or Django's "does not exist" redirect; a path with a newline
under the API prefix gets the coded JSON 404 docs/api.md promises.

The admin URLs are not listed by hand: every pattern of this app's admin pages is taken
from the URL resolver, each of its parameters filled with each odd value, so a page added
later is covered too. On PostgreSQL, whose text type refuses a NUL outright.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.urls import URLPattern, URLResolver

import durable_agents as da
from durable_agents.models import Run
from tests.support.admin_pages import client_for
from tests.support.agents import gated
from tests.support.api import API
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ODD = ["\x00", "a\x00b", "\n", "a\nb", "\r\n", "\t", "\x7f", "\ud800", "x" * 300, "%00", ".."]
PARAM = re.compile(r"<(?:(?P<conv>\w+):)?(?P<name>\w+)>")


def _admin_routes() -> list[str]:
    """Every route of this app's admin pages with a parameter, as ``run/<path:object_id>/…``."""
    routes = []
    for entry in admin.site.get_urls():  # one resolver per model: "durable_agents/run/"
        prefix = str(entry.pattern)
        if not isinstance(entry, URLResolver) or not prefix.startswith("durable_agents/"):
            continue
        for child in entry.url_patterns:
            if isinstance(child, URLPattern) and PARAM.search(str(child.pattern)):
                routes.append(prefix + str(child.pattern))
    return sorted(set(routes))


def _staff():
    """A superuser's client that reports a server error as its 500, not by raising it."""
    client = client_for(make_user("root", superuser=True))
    client.raise_request_exception = False
    return client


def _fill(route: str, value: str) -> str:
    return PARAM.sub(lambda _m: quote(value.encode("utf-8", "surrogatepass"), safe=""), route)


def test_the_admin_has_routes_with_ids():
    routes = _admin_routes()
    assert "durable_agents/run/<path:object_id>/change/" in routes, routes
    assert "durable_agents/run/sessions/<str:session_id>/" in routes, routes
    assert len(routes) >= 20, routes


@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_ids_in_admin_urls_are_404s(value):
    with pytest.raises(da.ApprovalPending):
        gated.run("odd-ids", "refund order 7")
    client = _staff()
    failures = []
    for route in _admin_routes():
        url = "/admin/" + _fill(route, value)
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            wrong = response.status_code != 404 if "\x00" in value else response.status_code >= 500
            if wrong:
                failures.append((method, url, response.status_code))
    assert not failures, failures
    assert Run.objects.get(run_id="odd-ids").status == "awaiting_approval"


@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_ids_in_admin_queries_are_never_500s(value):
    client = _staff()
    odd = quote(value.encode("utf-8", "surrogatepass"), safe="")
    base = "/admin/durable_agents/"
    urls = [
        f"{base}run/compare/?a={odd}&b={odd}",
        f"{base}run/compare/?a=odd-ids&b={odd}",
        f"{base}run/?q={odd}",
        f"{base}run/?status={odd}",
        f"{base}run/?run_id={odd}",
        f"{base}run/sessions/?q={odd}",
        f"{base}run/waiting/?run={odd}",
        f"{base}approvalrequest/?q={odd}",
        f"{base}approvalrequest/?run={odd}",
        f"{base}halt/?q={odd}",
        f"{base}actionlog/?q={odd}",
        f"{base}actionlog/?run_id={odd}",
        f"{base}inbox/?agent={odd}&tool={odd}",
    ]
    failures = []
    for url in urls:
        response = client.get(url)
        if response.status_code >= 500 or ("\x00" in value and response.status_code != 404):
            failures.append((url, response.status_code))
    assert not failures, failures


@pytest.mark.parametrize(
    "path",
    ["runs/%0A", "runs/a%0Ab", "runs/%0A/journal", "runs/x/%0A", "%0A", "runs/%0D%0A", "a%0A/b"],
)
def test_a_newline_in_an_api_path_is_the_coded_json_404(path):
    client = _staff()
    for method in ("get", "post"):
        response = getattr(client, method)(f"{API}/{path}")
        assert response.status_code == 404, (method, path, response.status_code)
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        assert response.json()["code"], response.json()


@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_run_ids_in_api_paths_are_coded_4xx(value):
    client = _staff()
    odd = quote(value.encode("utf-8", "surrogatepass"), safe="")
    for path in (f"runs/{odd}", f"runs/{odd}/journal", f"runs/{odd}/history"):
        response = client.get(f"{API}/{path}")
        assert 400 <= response.status_code < 500, (path, response.status_code)
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    assert response.json()["code"], response.json()


def test_a_nul_in_a_posted_field_is_a_400_and_changes_nothing():
    with pytest.raises(da.ApprovalPending):
        gated.run("odd-post", "refund order 7")
    client = _staff()
    base = "/admin/durable_agents/"
    cases = [
        (f"{base}run/", {"action": "resume_selected", "_selected_action": "a\x00b"}),
        (f"{base}approvalrequest/", {"action": "approve_selected", "_selected_action": "\x00"}),
        (f"{base}run/odd-post/cancel/", {"reason": "x\x00y"}),
    ]
    for url, data in cases:
        response = client.post(url, data)
        assert response.status_code == 400, (url, response.status_code)
    assert Run.objects.get(run_id="odd-post").status == "awaiting_approval"
