"""Login rate limiting through switchboard.rate_check, failing open fast.

The bucket lives in Postgres, so N replicas share one limit. If the check
fails or does not answer within ``ratelimit_timeout`` (default 500 ms -- not
the pool's 30-second wait), the request is let through, logged and counted:
an outage of the limiter must not become an outage of login.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
from dataclasses import dataclass
from typing import Protocol

from .db import Database
from .domain_errors import RateLimited
from .metrics import Metrics

LOG = logging.getLogger("switchboard.ratelimit")


@dataclass
class Decision:
    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    policy: str
    burst: int
    window_s: int
    failed_open: bool = False

    def headers(self) -> dict[str, str]:
        # IETF draft-ietf-httpapi-ratelimit-headers: RateLimit-Policy / RateLimit.
        h = {
            "RateLimit-Policy": f'"{self.policy}";q={self.burst};w={self.window_s}',
            "RateLimit": f'"{self.policy}";r={self.remaining};t={math.ceil(self.reset_after_ms / 1000)}',
        }
        if not self.allowed:
            h["Retry-After"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
        return h


class RateLimiter:
    def __init__(self, db: Database, metrics: Metrics, timeout: float) -> None:
        self.db = db
        self.metrics = metrics
        self.timeout = timeout

    async def check(self, policy: str, key: str, rate: float, burst: int) -> Decision:
        window = max(1, math.ceil(burst / rate))
        timeout = self.timeout
        try:
            row = await asyncio.wait_for(
                self.db.rate_check(f"{policy}:{key}", rate, burst, 1, timeout=timeout), timeout)
        except Exception as exc:  # timeout, pool exhausted, database down
            self.metrics.inc("switchboard_ratelimit_fail_open_total", policy=policy)
            LOG.warning("rate limit %s failed open: %s", policy, str(exc).strip() or type(exc).__name__)
            return Decision(True, burst, 0, 0, policy, burst, window, failed_open=True)
        d = Decision(row["allowed"], row["remaining"], row["retry_after_ms"], row["reset_after_ms"],
                     policy, burst, window)
        if not d.allowed:
            self.metrics.inc("switchboard_ratelimit_denied_total", policy=policy)
        return d


def too_many(d: Decision) -> RateLimited:
    return RateLimited(
        f"rate limit {d.policy} exceeded; retry in {max(1, math.ceil(d.retry_after_ms / 1000))} s",
        headers=d.headers())


class PeerRequest(Protocol):
    """What client_ip() reads of a request (falcon's Request has both)."""

    @property
    def remote_addr(self) -> str | None: ...

    def get_header(self, name: str) -> str | None: ...


def client_ip(req: PeerRequest, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    """The socket peer, unless the peer is a trusted proxy: then the right-most
    X-Forwarded-For address that is not itself a trusted proxy."""
    peer = req.remote_addr or "unknown"
    if not trusted:
        return peer

    def is_trusted(addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(addr.strip())
        except ValueError:
            return False
        return any(ip in net for net in trusted)

    if not is_trusted(peer):
        return peer
    xff = req.get_header("X-Forwarded-For") or ""
    hops = [h.strip() for h in xff.split(",") if h.strip()]
    for hop in reversed(hops):
        if not is_trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer
    return peer


def _trusted(addr: str, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        ip = ipaddress.ip_address(addr.strip())
    except ValueError:
        return False
    return any(ip in net for net in trusted)


def ip_key(ip: str) -> str:
    """The rate-limit key of a client address: IPv4 as is, IPv6 per /64.

    One IPv6 customer usually holds a whole /64 (often far more), so a per-address
    bucket would let it rotate through 2**64 keys. The cost: clients sharing a /64
    (one office, one mobile carrier's NAT64 prefix) share a bucket."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)
