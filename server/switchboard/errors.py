"""Error translation in one place: psycopg SQLSTATEs and domain errors -> HTTP statuses.

Modelled on PostgREST's mapping. Anything a client can send must end as a
4xx with a JSON body naming the problem; an unexpected exception is logged
with its traceback server-side and answered with a bare 500 JSON body.
"""

from __future__ import annotations

import logging
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
    return falcon.HTTPError(status, description=desc)


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
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPRouteNotFound, handle_route_not_found)
    app.add_error_handler(falcon.HTTPMethodNotAllowed, handle_method_not_allowed)
    app.add_error_handler(psycopg.Error, handle_db_error)
    app.add_error_handler(DomainError, handle_domain_error)
    app.add_error_handler(psycopg_pool.PoolTimeout, handle_pool_timeout)
    app.add_error_handler(psycopg_pool.PoolClosed, handle_pool_timeout)


__all__ = ["register", "http_error_from_db", "status_for_sqlstate", "psycopg_pool", "DOMAIN_STATUS",
           "http_error_from_domain", "status_for_domain_error"]
