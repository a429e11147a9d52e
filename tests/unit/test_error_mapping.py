"""Unit tier: domain errors -> HTTP in one table, in-process (falcon.testing, no server).

Each domain error must answer exactly what the Falcon error it replaced answered
(status, {"title", "description"} body, WWW-Authenticate / Retry-After /
RateLimit headers): the move below http/ is behaviour-neutral.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import falcon.testing
import pytest

from switchboard import errors
from switchboard.domain_errors import (AuthError, DomainError, NotFound, RateLimited, ToolCallLost,
                                       ToolCallTimeout, Unavailable)
from switchboard.ratelimit import Decision, too_many


class _Raise:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raise self.exc


def _answer(exc: Exception) -> tuple[str, Any, dict[str, str]]:
    app = falcon.asgi.App()
    errors.register(app)
    app.add_route("/x", _Raise(exc))
    r = falcon.testing.TestClient(app).simulate_get("/x")
    keep = ("www-authenticate", "retry-after", "ratelimit", "ratelimit-policy")
    return r.status, r.json, {k.lower(): v for k, v in r.headers.items() if k.lower() in keep}


def _decision() -> Decision:
    return Decision(False, 0, 2500, 60000, "login-ip", 10, 60)


PAIRS = [
    (AuthError("A bearer token is required.", challenge="Bearer"),
     falcon.HTTPUnauthorized(title="Unauthorized", description="A bearer token is required.",
                             challenges=["Bearer"])),
    (AuthError("The token has expired."),
     falcon.HTTPUnauthorized(title="Unauthorized", description="The token has expired.",
                             challenges=['Bearer error="invalid_token"'])),
    (NotFound("user u has no open socket on any replica"),
     falcon.HTTPNotFound(title="Not Found", description="user u has no open socket on any replica")),
    (ToolCallLost("tool call c was lost", retry_after=1),
     falcon.HTTPServiceUnavailable(title="Service Unavailable", retry_after=1, description="tool call c was lost")),
    (ToolCallTimeout("no answer from the user within 100 ms"),
     falcon.HTTPGatewayTimeout(title="Gateway Timeout", description="no answer from the user within 100 ms")),
    (too_many(_decision()),
     falcon.HTTPTooManyRequests(title="Too Many Requests", description="rate limit login-ip exceeded; retry in 3 s",
                                headers=_decision().headers())),
]


@pytest.mark.parametrize(("domain", "falcon_error"), PAIRS, ids=lambda e: type(e).__name__)
def test_a_domain_error_answers_what_the_falcon_error_did(domain: DomainError,
                                                         falcon_error: falcon.HTTPError) -> None:
    assert _answer(domain) == _answer(falcon_error)


def test_the_table_maps_every_domain_error_and_the_most_specific_class_wins() -> None:
    assert errors.status_for_domain_error(AuthError("x")) == falcon.HTTP_401
    assert errors.status_for_domain_error(RateLimited("x")) == falcon.HTTP_429
    assert errors.status_for_domain_error(Unavailable("x")) == falcon.HTTP_503
    assert errors.status_for_domain_error(ToolCallLost("x")) == falcon.HTTP_503
    assert errors.status_for_domain_error(ToolCallTimeout("x")) == falcon.HTTP_504

    class Unmapped(DomainError):
        pass

    class MoreSpecific(NotFound):
        pass

    assert errors.status_for_domain_error(Unmapped("x")) == falcon.HTTP_500
    assert errors.status_for_domain_error(MoreSpecific("x")) == falcon.HTTP_404
    for cls in (AuthError, NotFound, RateLimited, Unavailable, ToolCallLost, ToolCallTimeout):
        assert cls in errors.DOMAIN_STATUS


def test_rate_limited_carries_the_ietf_headers() -> None:
    status, body, headers = _answer(too_many(_decision()))
    assert status == falcon.HTTP_429
    assert body == {"type": "https://switchboard.dev/problems/rate-limited", "title": "Too Many Requests",
                    "status": 429, "detail": "rate limit login-ip exceeded; retry in 3 s",
                    "description": "rate limit login-ip exceeded; retry in 3 s"}
    assert headers["retry-after"] == "3"
    assert headers["ratelimit-policy"] == '"login-ip";q=10;w=60'


@pytest.mark.parametrize(("sqlstate", "status"), [
    ("23505", falcon.HTTP_409), ("P0002", falcon.HTTP_404), ("28000", falcon.HTTP_403),
    ("42501", falcon.HTTP_403), ("22023", falcon.HTTP_422), ("23514", falcon.HTTP_422),
    ("40001", falcon.HTTP_503), ("57014", falcon.HTTP_503), ("08006", falcon.HTTP_503),
    ("53300", falcon.HTTP_503), ("25006", falcon.HTTP_503), ("XX000", falcon.HTTP_500), (None, falcon.HTTP_500),
])
def test_sqlstate_table(sqlstate: str | None, status: str) -> None:
    assert errors.status_for_sqlstate(sqlstate) == status


def test_unknown_route_and_method_answer_json_with_a_description() -> None:
    app = falcon.asgi.App()
    errors.register(app)
    app.add_route("/x", _Raise(NotFound("n")))
    client = falcon.testing.TestClient(app)
    r = client.simulate_get("/nope")
    assert r.status == falcon.HTTP_404 and "/openapi.json" in r.json["description"]
    r = client.simulate_post("/x")
    assert r.status == falcon.HTTP_405 and "allowed: GET" in r.json["description"]


def test_an_unexpected_exception_is_a_bare_500() -> None:
    status, body, _ = _answer(RuntimeError("secret detail"))
    assert status == falcon.HTTP_500
    assert body == {"type": "https://switchboard.dev/problems/internal", "title": "Internal Server Error",
                    "status": 500, "detail": "An unexpected error occurred.",
                    "description": "An unexpected error occurred."}
