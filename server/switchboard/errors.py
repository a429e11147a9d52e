"""Error translation in one place: psycopg SQLSTATEs and domain errors -> HTTP
statuses, and every HTTP error -> an RFC 9457 problem document.

Modelled on PostgREST's mapping. Anything a client can send must end as a
4xx with a JSON body naming the problem; an unexpected exception is logged
with its traceback server-side and answered with a bare 500.

Every error leaves as ``application/problem+json``:
``{"type", "title", "status", "detail", ...extensions}``. ``type`` is
``https://switchboard.dev/problems/<slug>`` (docs/how-to/http-api.md, "Errors", lists the
slugs); extension members (``known_handlers``, ``active_run``, ``reasons``,
``sqlstate``) are top-level. For one release the body also keeps
``description`` (= ``detail``) for clients written against the old
``{title, description}`` shape. Resources keep raising plain falcon errors (or
``Problem`` when they need a specific type or extension members); the
serializer below is the only place that shapes the body.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

import falcon
import psycopg
import psycopg_pool

from .bounded import escape
from .domain_errors import (AuthError, DomainError, NotFound, RateLimited, ToolCallLost,
                            ToolCallTimeout, Unavailable)

LOG = logging.getLogger("switchboard.errors")

# The one table from what a lower layer raised to the HTTP status it answers with,
# keyed on the domain error's type (the most specific class in its MRO wins). The
# body is {"title", "description"} from the error; its headers are passed through.
DOMAIN_STATUS: dict[type[DomainError], str] = {
    AuthError: falcon.HTTP_401,
    NotFound: falcon.HTTP_404,
    RateLimited: falcon.HTTP_429,
    Unavailable: falcon.HTTP_503,
    ToolCallLost: falcon.HTTP_503,
    ToolCallTimeout: falcon.HTTP_504,
    DomainError: falcon.HTTP_500,
}


def status_for_domain_error(exc: DomainError) -> str:
    for cls in type(exc).__mro__:
        if cls in DOMAIN_STATUS:
            return DOMAIN_STATUS[cls]
    return falcon.HTTP_500


def http_error_from_domain(exc: DomainError) -> falcon.HTTPError:
    return falcon.HTTPError(status_for_domain_error(exc), title=exc.title,
                            description=exc.description, headers=exc.headers or None)
PROBLEM_BASE = "https://switchboard.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"
# The type of an error nobody gave a more specific one: one slug per status.
DEFAULT_SLUGS = {
    400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 408: "request-timeout", 409: "conflict", 413: "content-too-large",
    415: "unsupported-media-type",
    422: "unprocessable", 429: "rate-limited", 500: "internal", 503: "unavailable", 504: "timeout",
}
# Members of falcon's to_dict() that are not extensions.
_FALCON_KEYS = {"title", "description", "code", "link"}


class Problem(falcon.HTTPError):
    """An HTTP error with a specific problem type and extension members.

    ``Problem(409, "active-run", "the task already has a queued or running run",
    active_run={...})``. The extensions become top-level members of the body."""

    def __init__(self, status: int, slug: str, detail: str, *, title: str | None = None,
                 headers: dict[str, str] | None = None, **extensions: Any) -> None:
        super().__init__(falcon.code_to_http_status(status), title=title or HTTPStatus(status).phrase,
                         description=detail, headers=headers)
        self.problem = slug
        self.extensions = extensions

    def to_dict(self, obj_type: type = dict) -> Any:
        d = super().to_dict(obj_type)
        d.update(self.extensions)
        return d


def problem_type(slug: str) -> str:
    return PROBLEM_BASE + slug


def problem_body(exc: falcon.HTTPError) -> dict[str, Any]:
    """The RFC 9457 document of one error (what the serializer writes)."""
    status = int(exc.status_code)
    raw = dict(exc.to_dict())
    slug = getattr(exc, "problem", None) or DEFAULT_SLUGS.get(status) or f"http-{status}"
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    title = raw.get("title")
    if not isinstance(title, str) or not title or title[:3] == str(status):
        title = phrase  # falcon's default title is "404 Not Found": the phrase alone
    detail = raw.get("description")
    if not isinstance(detail, str) or not detail:
        detail = title
    body: dict[str, Any] = {"type": problem_type(slug), "title": title, "status": status, "detail": detail}
    for k, v in raw.items():
        if k not in _FALCON_KEYS and k not in body:
            body[k] = v
    body["description"] = detail  # deprecated alias of detail, kept for one release
    return body


def serialize_problem(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    resp.content_type = PROBLEM_CONTENT_TYPE
    resp.data = json.dumps(problem_body(exc), default=str, ensure_ascii=False).encode()


def status_for_sqlstate(sqlstate: str | None) -> str:
    s = sqlstate or ""
    if s == "23505":
        return falcon.HTTP_409
    if s in ("P0002",):
        return falcon.HTTP_404
    if s.startswith("28") or s == "42501":
        return falcon.HTTP_403
    if s.startswith("22") or s.startswith("23"):
        return falcon.HTTP_422
    if s in ("40001", "40P01", "55P03", "57014"):
        return falcon.HTTP_503
    if s.startswith("08") or s.startswith("57") or s.startswith("53"):
        return falcon.HTTP_503
    if s == "25006":
        # read_only_sql_transaction: this connection reached a standby (a demoted old
        # primary, or a Service that has not switched to the new leader yet)
        return falcon.HTTP_503
    return falcon.HTTP_500


def http_error_from_db(exc: psycopg.Error) -> falcon.HTTPError:
    if exc.sqlstate is None and isinstance(exc, psycopg.DataError):
        # refused client-side by psycopg (e.g. NUL in a text parameter): the input is bad
        return falcon.HTTPUnprocessableEntity(description=str(exc).strip())
    status = status_for_sqlstate(exc.sqlstate)
    if exc.sqlstate is None and isinstance(exc, psycopg.OperationalError):
        # the connection died under the statement (server crash, failover, network):
        # no SQLSTATE, and nothing the client did wrong
        status = falcon.HTTP_503
    diag = exc.diag
    if status == falcon.HTTP_500:
        LOG.error("database error %s: %s", exc.sqlstate, exc)
        return falcon.HTTPInternalServerError(title="Internal Server Error",
                                              description="The database reported an unexpected error.")
    if status == falcon.HTTP_503:
        return falcon.HTTPServiceUnavailable(title="Service Unavailable",
                                             description="The database is unavailable; retry shortly.",
                                             retry_after=1)
    desc = diag.message_primary or str(exc)
    if diag.message_hint:
        desc = f"{desc} (hint: {diag.message_hint})"
    code = int(status[:3])
    return Problem(code, DEFAULT_SLUGS.get(code, f"http-{code}"), desc, sqlstate=exc.sqlstate)


async def handle_db_error(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]) -> None:
    if isinstance(exc, psycopg.Error):
        raise http_error_from_db(exc)
    raise exc


async def handle_domain_error(req: falcon.Request, resp: falcon.Response, exc: Exception,
                              params: dict[str, Any]) -> None:
    if isinstance(exc, DomainError):
        raise http_error_from_domain(exc)
    raise exc


async def handle_pool_timeout(req: falcon.Request, resp: falcon.Response, exc: Exception,
                              params: dict[str, Any]) -> None:
    LOG.warning("database pool: %s", exc)
    raise falcon.HTTPServiceUnavailable(title="Service Unavailable",
                                        description="The database is unavailable; retry shortly.",
                                        retry_after=1)


async def handle_unexpected(req: falcon.Request, resp: falcon.Response, exc: Exception,
                            params: dict[str, Any]) -> None:
    if isinstance(exc, falcon.HTTPError):
        raise exc
    LOG.exception("unhandled error on %s %s", req.method, req.path)
    raise falcon.HTTPInternalServerError(title="Internal Server Error",
                                         description="An unexpected error occurred.")


async def handle_route_not_found(req: falcon.Request, resp: falcon.Response, exc: Exception,
                                 params: dict[str, Any]) -> None:
    """Falcon answers an unknown path with {"title": "404 Not Found"} only; every other
    error carries a description, so this one does too."""
    raise falcon.HTTPNotFound(title="Not Found",
                              description=f"no resource at {escape(req.path, 200)}; the API is described at /openapi.json")


async def handle_method_not_allowed(req: falcon.Request, resp: falcon.Response, exc: Exception,
                                    params: dict[str, Any]) -> None:
    allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
    raise falcon.HTTPMethodNotAllowed(
        [m.strip() for m in allowed.split(",") if m.strip()], title="Method Not Allowed",
        description=f"{escape(req.method, 20)} is not allowed on {escape(req.path, 200)}; "
                    f"allowed: {allowed or 'none'}")


def register(app: falcon.asgi.App[Any, Any]) -> None:
    app.set_error_serializer(serialize_problem)
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPRouteNotFound, handle_route_not_found)
    app.add_error_handler(falcon.HTTPMethodNotAllowed, handle_method_not_allowed)
    app.add_error_handler(psycopg.Error, handle_db_error)
    app.add_error_handler(DomainError, handle_domain_error)
    app.add_error_handler(psycopg_pool.PoolTimeout, handle_pool_timeout)
    app.add_error_handler(psycopg_pool.PoolClosed, handle_pool_timeout)


__all__ = ["register", "http_error_from_db", "status_for_sqlstate", "psycopg_pool", "DOMAIN_STATUS",
           "http_error_from_domain", "status_for_domain_error", "Problem", "problem_body",
           "problem_type", "PROBLEM_CONTENT_TYPE"]
