"""Unit tier: the one error serializer (errors.py), in process, for the paths a
client cannot provoke on purpose -- an unexpected exception (500), the database
gone (503 from a connection error and from the pool), a replica not ready
(503 with reasons) -- plus CORS and the cookie TLS rule, which are pure
functions of the request. No database, no processes."""

from __future__ import annotations

import ipaddress
from typing import Any

import falcon
import falcon.asgi
import falcon.testing
import psycopg
import psycopg_pool
import pytest

from switchboard import errors
from switchboard.http.common import reached_over_tls
from switchboard.http.cors import cors_middleware, origin_allowed
from switchboard.http.ops import Ready

BASE = "https://switchboard.dev/problems/"


class Boom:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise self.exc


class _Relay:
    connected = False


class _Replica:
    draining = True
    replica_id = "r-test"


class _DB:
    async def ping(self, timeout: float) -> None:
        raise OSError("connection refused")


def app(allowed: list[str] | None = None) -> falcon.testing.TestClient:
    a = falcon.asgi.App(middleware=cors_middleware(allowed or []), cors_enable=False)
    errors.register(a)
    a.add_route("/boom", Boom(RuntimeError("secret internals")))
    a.add_route("/db-down", Boom(psycopg.OperationalError("server closed the connection")))
    a.add_route("/pool", Boom(psycopg_pool.PoolTimeout("couldn't get a connection after 10.00 sec")))
    a.add_route("/ready", Ready(_Replica(), _Relay(), _DB()))  # type: ignore[arg-type]
    a.add_route("/auth/refresh", Boom(falcon.HTTPUnauthorized(title="Unauthorized", description="x")))
    a.add_route("/tasks", Boom(falcon.HTTPForbidden(title="Forbidden", description="admin role required")))
    return falcon.testing.TestClient(a)


def problem(r: Any, status: int, slug: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json
    assert (body["type"], body["status"]) == (BASE + slug, status)
    assert body["detail"] == body["description"] and body["title"]
    return body


def test_unexpected_exception_is_a_bare_500_problem() -> None:
    body = problem(app().simulate_get("/boom"), 500, "internal")
    assert "secret" not in str(body)


@pytest.mark.parametrize("path", ["/db-down", "/pool"])
def test_database_gone_is_503_with_retry_after(path: str) -> None:
    r = app().simulate_get(path)
    problem(r, 503, "unavailable")
    assert r.headers["retry-after"] == "1"


def test_not_ready_is_a_503_problem_with_reasons() -> None:
    body = problem(app().simulate_get("/ready"), 503, "not-ready")
    assert body["reasons"] == ["shutting_down", "listen_down", "database_unavailable"]
    assert "replica" not in body  # anonymous: no replica ids (docs/explanation/security.md)


def test_unknown_path_and_method() -> None:
    problem(app().simulate_get("/nowhere"), 404, "not-found")
    problem(app().simulate_delete("/boom"), 405, "method-not-allowed")


def test_problem_extensions_are_top_level() -> None:
    body = errors.problem_body(errors.Problem(409, "active-run", "busy", active_run={"id": 1}))
    assert body == {"type": BASE + "active-run", "title": "Conflict", "status": 409, "detail": "busy",
                    "active_run": {"id": 1}, "description": "busy"}


# -- CORS ------------------------------------------------------------------------------------
ORIGIN = "http://localhost:5173"


def test_cors_off_by_default() -> None:
    r = app().simulate_get("/tasks", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in r.headers


def test_cors_allowed_origin_exposes_rate_limit_headers_without_credentials() -> None:
    r = app([ORIGIN]).simulate_get("/tasks", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"ratelimit", "ratelimit-policy", "retry-after"} <= exposed
    assert "access-control-allow-credentials" not in r.headers
    assert "Origin" in r.headers["vary"]


def test_cors_credentials_only_on_the_cookie_paths_and_never_for_the_wildcard() -> None:
    r = app([ORIGIN]).simulate_get("/auth/refresh", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = app(["*"]).simulate_get("/auth/refresh", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in r.headers


def test_cors_refuses_other_origins() -> None:
    r = app([ORIGIN]).simulate_get("/tasks", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_origin_allowed_accepts_the_list_and_our_own_origin() -> None:
    own = "https://api.example"
    for cred in (True, False):
        assert origin_allowed(None, own, [], credentialed=cred)  # non-browser
        assert origin_allowed("https://api.example", own, [], credentialed=cred)
        assert origin_allowed("HTTPS://API.example:443", own, [], credentialed=cred)  # as browsers serialise
        assert origin_allowed(ORIGIN, own, [ORIGIN], credentialed=cred)
        assert not origin_allowed("https://evil.example", own, [ORIGIN], credentialed=cred)
        assert not origin_allowed("http://api.example", own, [], credentialed=cred)       # scheme
        assert not origin_allowed("https://api.example:8443", own, [], credentialed=cred)  # port
        assert not origin_allowed("null", own, ["*"], credentialed=cred)
    # '*' opens the non-credentialed doors (/ws) only
    assert origin_allowed("https://evil.example", own, ["*"], credentialed=False)
    assert not origin_allowed("https://evil.example", own, ["*"], credentialed=True)


# -- Secure cookies behind a proxy ---------------------------------------------------------------
class _Req:
    def __init__(self, scheme: str, peer: str, proto: str | None) -> None:
        self.scheme, self.remote_addr, self._proto = scheme, peer, proto

    def get_header(self, name: str) -> str | None:
        return self._proto if name == "X-Forwarded-Proto" else None


def test_reached_over_tls() -> None:
    proxies = [ipaddress.ip_network("10.0.0.0/8")]
    assert reached_over_tls(_Req("https", "192.0.2.1", None), [])  # type: ignore[arg-type]
    assert reached_over_tls(_Req("http", "10.1.2.3", "https"), proxies)  # type: ignore[arg-type]
    # an appending proxy: the client's own value comes first, the proxy's last
    assert not reached_over_tls(_Req("http", "10.1.2.3", "https, http"), proxies)  # type: ignore[arg-type]
    assert reached_over_tls(_Req("http", "10.1.2.3", "http, https"), proxies)  # type: ignore[arg-type]
    assert not reached_over_tls(_Req("http", "192.0.2.1", "https"), proxies)  # type: ignore[arg-type]
    assert not reached_over_tls(_Req("http", "10.1.2.3", "http"), proxies)  # type: ignore[arg-type]
    assert not reached_over_tls(_Req("http", "10.1.2.3", "https"), [])  # type: ignore[arg-type]
