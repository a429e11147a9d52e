"""What the components and foundations raise when they refuse: domain errors.

Below ``http/`` nothing knows about HTTP: ``auth``, ``tools`` and ``ratelimit``
raise these, and ``errors.DOMAIN_STATUS`` (the one table, keyed on the type)
turns them into HTTP responses. Each carries what a client is told -- a title,
a description naming the problem, and the response headers it needs (a
``WWW-Authenticate`` challenge, ``Retry-After``, the RateLimit headers) -- and
nothing about status codes.
"""

from __future__ import annotations

from typing import ClassVar


class DomainError(Exception):
    """A refusal a client can be told about. Subclasses name the kind."""

    title: ClassVar[str] = "Error"

    def __init__(self, description: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(description)
        self.description = description
        self.headers: dict[str, str] = dict(headers or {})


class AuthError(DomainError):
    """No usable credentials: missing, malformed, expired, revoked, or the user is disabled."""

    title = "Unauthorized"

    def __init__(self, description: str, *, challenge: str = 'Bearer error="invalid_token"') -> None:
        super().__init__(description, headers={"WWW-Authenticate": challenge})


class NotFound(DomainError):
    title = "Not Found"


class Unavailable(DomainError):
    """A dependency cannot answer now; retrying shortly may work."""

    title = "Service Unavailable"

    def __init__(self, description: str, *, retry_after: int = 1) -> None:
        super().__init__(description, headers={"Retry-After": str(retry_after)})


class ToolCallLost(Unavailable):
    """PostgreSQL lost its UNLOGGED state (failover, crash) with the call in flight."""


class ToolCallTimeout(DomainError):
    """The user's browser did not answer the tool call in time."""

    title = "Gateway Timeout"


class RateLimited(DomainError):
    """Over a rate limit; ``headers`` carry RateLimit-Policy, RateLimit and Retry-After."""

    title = "Too Many Requests"
