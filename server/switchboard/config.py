"""Settings, read from the environment once (docs/reference/configuration.md, generated
from config_docs.py)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Literal, TypedDict

from .handler_options import parse_queue_slots
from .origins import normalize_origin


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


def _number(name: str, default: float, lo: float, hi: float, cast: Callable[[str], float],
            kind: str) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    expected = f"expected {kind} in [{_show(lo)}, {_show(hi)}], e.g. {name}={_show(default)}"
    try:
        val = cast(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not {kind}; {expected}") from exc
    if not lo <= val <= hi:
        raise ConfigError(f"{name}={raw!r} is out of range; {expected}")
    return val


def _show(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _queues() -> dict[str, int]:
    try:
        return parse_queue_slots(os.environ.get("SWITCHBOARD_QUEUES"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _int(name: str, default: int, lo: int = 0, hi: int = 10**9) -> int:
    return int(_number(name, default, lo, hi, int, "an integer"))


def _float(name: str, default: float, lo: float = 0.0, hi: float = 1e9) -> float:
    return _number(name, default, lo, hi, float, "a number")


def _list(name: str, default: str = "") -> list[str]:
    raw = os.environ.get(name, default)
    return [p.strip() for p in raw.split(",") if p.strip()]


def _origins(values: list[str]) -> list[str]:
    """SWITCHBOARD_ALLOWED_ORIGINS, each entry normalised as browsers send an Origin
    (compared exactly: scheme, host and port), or ``*``."""
    out = []
    for v in values:
        o = "*" if v == "*" else normalize_origin(v)
        if o is None:
            raise ConfigError(f"SWITCHBOARD_ALLOWED_ORIGINS: {v!r} is not an origin "
                              "(scheme://host[:port], e.g. https://app.example.com, or *)")
        out.append(o)
    return out


def prepare_threshold(listen_url: str | None) -> int | None:
    """SWITCHBOARD_PREPARE_THRESHOLD: after how many executions psycopg prepares a statement
    server-side on a request-pool connection; ``off`` never prepares.

    Default: psycopg's 5 with a direct connection, ``off`` when
    SWITCHBOARD_LISTEN_DATABASE_URL is set -- that setting means DATABASE_URL goes
    through a transaction-mode pooler, and PgBouncer before 1.21 (and any pooler
    without protocol-level prepared-statement support) hands the next transaction
    a server connection that never saw the PREPARE ("prepared statement _pg3_0
    does not exist"). The data layer also detects that error, turns preparation
    off for the process and retries the statement once (it never ran)."""
    raw = os.environ.get("SWITCHBOARD_PREPARE_THRESHOLD", "").strip().lower()
    if raw == "":
        return None if listen_url else 5
    if raw in ("off", "none", "no", "false"):
        return None
    try:
        val = int(raw)
    except ValueError as exc:
        raise ConfigError(f"SWITCHBOARD_PREPARE_THRESHOLD={raw!r} is not an integer or 'off'") from exc
    if not 0 <= val <= 1_000_000:
        raise ConfigError(f"SWITCHBOARD_PREPARE_THRESHOLD={val} is out of range [0, 1000000]")
    return val


def _samesite() -> str:
    """SWITCHBOARD_SESSION_COOKIE_SAMESITE: Strict (default), Lax or None.

    Strict: the refresh cookie is only ever sent by fetch() from the app itself,
    never on a navigation, so Lax would add nothing but exposure; an app on
    another *site* (not just another origin of the same site) needs None, which
    also forces Secure (browsers drop SameSite=None cookies without it)."""
    raw = os.environ.get("SWITCHBOARD_SESSION_COOKIE_SAMESITE", "Strict").strip().capitalize()
    if raw not in ("Strict", "Lax", "None"):
        raise ConfigError(f"SWITCHBOARD_SESSION_COOKIE_SAMESITE={raw!r} is not Strict, Lax or None")
    return raw


def session_lifetimes() -> tuple[int, int]:
    """SWITCHBOARD_SESSION_TTL and SWITCHBOARD_SESSION_MAX_LIFETIME, seconds.

    The TTL (default 14 days) is the idle lifetime: every refresh moves the
    session's expiry to now + TTL. The max lifetime (default 30 days, or the TTL
    if that is longer; at most 365 days) is absolute, counted from the login: no
    refresh moves the expiry past it, so a stolen session that keeps refreshing
    still ends. It must be at least the TTL."""
    ttl = _int("SWITCHBOARD_SESSION_TTL", 14 * 86400, 5, 365 * 86400)
    explicit = os.environ.get("SWITCHBOARD_SESSION_MAX_LIFETIME", "") != ""
    max_lifetime = _int("SWITCHBOARD_SESSION_MAX_LIFETIME", max(30 * 86400, ttl), 5, 365 * 86400)
    if explicit and max_lifetime < ttl:
        raise ConfigError(f"SWITCHBOARD_SESSION_MAX_LIFETIME={max_lifetime} is shorter than "
                          f"SWITCHBOARD_SESSION_TTL={ttl}; the absolute lifetime of a session must be at "
                          "least its idle lifetime (raise the first or lower the second)")
    return ttl, max_lifetime


def refresh_grace() -> float:
    """SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS (default 60, 0 .. 600): for this long after
    a refresh token was used, the same client presenting it again (its response was
    lost, or two tabs refreshed at once) gets the same successor instead of ending
    the session. SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS (the 0.2 name, 0 .. 60) is
    read as an alias when the new name is unset."""
    if os.environ.get("SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS", "") == "" and \
            os.environ.get("SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS", "") != "":
        return _float("SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS", 10.0, 0, 60)
    return _float("SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS", 60.0, 0, 600)


def ws_compression_enabled() -> bool:
    """SWITCHBOARD_WS_COMPRESSION (default off): negotiate permessage-deflate on /ws.

    Off by default: every compressed socket keeps a zlib context on each side
    (it roughly doubles a replica's RSS per idle browser socket: BENCHMARKS.md,
    "Changes made to Switchboard from these measurements"), and Switchboard's
    frames are small JSON that barely compress. Turn it on when clients sit behind
    slow links and payloads are large."""
    return os.environ.get("SWITCHBOARD_WS_COMPRESSION", "off").lower() in ("1", "on", "true", "yes")


def uvloop_enabled() -> bool:
    """SWITCHBOARD_UVLOOP (default off): serve with uvloop and httptools, the C
    implementations of the asyncio event loop and of HTTP/1.1 parsing (uvicorn's
    ``standard`` extra, dependencies of the package). Off: the pure-Python asyncio
    loop and h11, set explicitly, so installing uvloop changes nothing by itself.
    WebSocket framing is the websockets library either way. Opt-in, not the
    default: it costs markedly less CPU per HTTP request (docs/explanation/benchmark-journal.md "uvloop and
    httptools" has the figure), but httptools does not apply SWITCHBOARD_MAX_HEADER_BYTES, and in
    one CI run two replicas serving with uvloop exited without a word right after a
    PostgreSQL failover (not reproduced, not explained). (Its refusals of malformed
    header bytes are problem+json now, as h11's are: http/protocol.py.)"""
    raw = os.environ.get("SWITCHBOARD_UVLOOP", "off").strip().lower()
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"SWITCHBOARD_UVLOOP={raw!r} is not on or off")


class ServerIO(TypedDict):
    """uvicorn.Config's ``loop`` and ``http`` (typed, so mypy checks them against uvicorn's)."""

    loop: Literal["asyncio", "uvloop"]
    http: Literal["h11", "httptools"]


def server_io(enabled: bool) -> ServerIO:
    """uvicorn's ``loop`` and ``http`` settings (`serve` alone and the gunicorn worker).
    A platform without uvloop or httptools wheels falls back to asyncio + h11."""
    import importlib.util

    if enabled and all(importlib.util.find_spec(m) is not None for m in ("uvloop", "httptools")):
        return {"loop": "uvloop", "http": "httptools"}
    return {"loop": "asyncio", "http": "h11"}


class ServerLimits(TypedDict):
    """uvicorn.Config keyword arguments (typed, so mypy checks them against uvicorn's)."""

    timeout_keep_alive: int
    limit_concurrency: int
    h11_max_incomplete_event_size: int


def server_limits() -> ServerLimits:
    """uvicorn's connection limits (used by `serve` alone and by the gunicorn worker).

    * ``timeout_keep_alive`` (SWITCHBOARD_KEEPALIVE_TIMEOUT, default 5 s): an idle
      keep-alive connection is closed after it.
    * ``limit_concurrency`` (SWITCHBOARD_LIMIT_CONCURRENCY, default 4096): open
      connections (WebSockets included) plus requests in flight per process; above
      it uvicorn answers 503 at once instead of queueing without bound. Size it
      above the sockets one replica holds (see BENCHMARKS.md) plus headroom.
    * ``h11_max_incomplete_event_size`` (SWITCHBOARD_MAX_HEADER_BYTES, default
      16 KiB): what h11 holds of a request line and headers still arriving; past it
      the request is refused 400 before any of it reaches the application. (A
      complete header block that arrives in one read is parsed whole; httptools,
      with SWITCHBOARD_UVLOOP=on, does not apply this cap.)
    uvicorn's own 400 and 503 bodies are problem+json like every other error
    (http/protocol.py).
    uvicorn has no header or body *read* timeout of its own; Switchboard adds both:
    header_timeout() (http/protocol.py) and Config.body_timeout (http/common.py)."""
    return {
        "timeout_keep_alive": _int("SWITCHBOARD_KEEPALIVE_TIMEOUT", 5, 1, 3600),
        "limit_concurrency": _int("SWITCHBOARD_LIMIT_CONCURRENCY", 4096, 16, 1_000_000),
        "h11_max_incomplete_event_size": _int("SWITCHBOARD_MAX_HEADER_BYTES", 16 * 1024, 1024, 1024 * 1024),
    }


def header_timeout() -> float:
    """SWITCHBOARD_HEADER_TIMEOUT (default 10 s): how long a connection may take to
    send a complete request line and headers -- from its first byte or from the end
    of its previous response -- before it is answered 408 and closed (a slow-header
    client would otherwise hold a connection slot for ever). h11 only (the default);
    with SWITCHBOARD_UVLOOP=on httptools' protocol has no such timer. Idle
    keep-alive connections are closed sooner, by SWITCHBOARD_KEEPALIVE_TIMEOUT."""
    return _float("SWITCHBOARD_HEADER_TIMEOUT", 10.0, 0.5, 3600)


@dataclass
class Config:
    database_url: str
    jwt_secret: str
    listen_database_url: str | None = None
    read_database_url: str | None = None   # a streaming replica for history reads (data/history.py)
    read_max_lag: float = 5.0
    read_pool_size: int = 4
    migration_database_url: str | None = None
    trusted_proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)  # [] = own origin; ["*"] = any
    pool_min: int = 2
    pool_size: int = 10
    pool_timeout: float = 10.0
    prepare_threshold: int | None = 5
    jwt_ttl: int = 3600
    ticket_ttl: int = 30
    # sessions (refresh cookie): idle lifetime, extended by every refresh up to the
    # absolute lifetime, which no refresh extends (session_lifetimes())
    session_ttl: int = 14 * 86400
    session_max_lifetime: int = 30 * 86400
    session_cookie_samesite: str = "Strict"
    session_check_interval: float = 1.0
    session_refresh_grace: float = 60.0
    # scheduler
    scheduler_enabled: bool = True
    scheduler_concurrency: int = 8
    # SWITCHBOARD_QUEUES: slots per named queue on this replica (handler_options.py)
    queues: dict[str, int] = field(default_factory=dict)
    lease_seconds: float = 60.0
    poll_interval: float = 1.0
    shutdown_grace: float = 20.0
    # relay / sockets
    event_retention_seconds: int = 300
    listen_check_interval: float = 5.0
    event_tick_interval: float = 0.02
    relay_read_gap: float = 0.012
    heartbeat_interval: float = 5.0
    presence_interval: float = 1.0
    replica_stale_seconds: float = 30.0
    ws_queue_size: int = 1000
    ws_queue_bytes: int = 16 * 1024 * 1024
    live_unconfirmed_ttl: float = 30.0
    stream_flush_seconds: float = 0.002
    ws_deaf_close_seconds: float = 30.0
    ws_replay_stall_seconds: float = 10.0
    ws_max_frame_bytes: int = 65536
    ws_frame_rate: float = 20.0
    ws_frame_burst: int = 40
    ws_max_sockets_per_user: int = 10
    ws_compression: bool = False
    uvloop: bool = False
    ws_ticket_rate: float = 1.0
    ws_ticket_burst: int = 30
    # rate limits
    login_ip_rate: float = 10 / 60
    login_ip_burst: int = 10
    login_user_rate: float = 5 / 60
    login_user_burst: int = 5
    refresh_ip_rate: float = 5.0
    refresh_ip_burst: int = 100
    refresh_session_rate: float = 0.2
    refresh_session_burst: int = 30
    ratelimit_timeout: float = 0.5
    sql_allow_no_timeout: bool = False
    sql_kill_grace_seconds: float = 5.0
    max_body_bytes: int = 2 * 1024 * 1024
    body_timeout: float = 30.0
    handler_modules: list[str] = field(default_factory=list)
    log_level: str = "INFO"
    dev: bool = False

    @classmethod
    def from_env(cls, dev: bool = False) -> "Config":
        db = os.environ.get("DATABASE_URL", "")
        if not db:
            raise ConfigError("DATABASE_URL is not set (required)")
        secret = os.environ.get("SWITCHBOARD_JWT_SECRET", "")
        if not secret:
            raise ConfigError("SWITCHBOARD_JWT_SECRET is not set (required)")
        if len(secret) < 32 and not dev:
            raise ConfigError("SWITCHBOARD_JWT_SECRET must be at least 32 characters")
        proxies = []
        for p in _list("SWITCHBOARD_TRUSTED_PROXIES"):
            try:
                proxies.append(ipaddress.ip_network(p, strict=False))
            except ValueError as exc:
                raise ConfigError(f"SWITCHBOARD_TRUSTED_PROXIES: {p!r} is not an IP or CIDR") from exc
        listen_url = os.environ.get("SWITCHBOARD_LISTEN_DATABASE_URL") or None
        session_ttl, session_max_lifetime = session_lifetimes()
        return cls(
            database_url=db,
            jwt_secret=secret,
            listen_database_url=listen_url,
            read_database_url=os.environ.get("SWITCHBOARD_READ_DATABASE_URL") or None,
            read_max_lag=_float("SWITCHBOARD_READ_MAX_LAG", 5.0, 0.1, 3600),
            read_pool_size=_int("SWITCHBOARD_READ_POOL_SIZE", 4, 1, 100),
            migration_database_url=os.environ.get("SWITCHBOARD_MIGRATION_DATABASE_URL") or None,
            trusted_proxies=proxies,
            allowed_origins=_origins(_list("SWITCHBOARD_ALLOWED_ORIGINS", "*" if dev else "")),
            pool_min=_int("SWITCHBOARD_POOL_MIN", 2, 0, 1000),
            pool_size=_int("SWITCHBOARD_POOL_SIZE", 10, 1, 1000),
            pool_timeout=_float("SWITCHBOARD_POOL_TIMEOUT", 10.0, 0.1, 300),
            prepare_threshold=prepare_threshold(listen_url),
            jwt_ttl=_int("SWITCHBOARD_JWT_TTL", 3600, 60, 86400),
            ticket_ttl=_int("SWITCHBOARD_TICKET_TTL", 30, 1, 3600),
            session_ttl=session_ttl,
            session_max_lifetime=session_max_lifetime,
            session_cookie_samesite=_samesite(),
            session_check_interval=_float("SWITCHBOARD_SESSION_CHECK_INTERVAL", 1.0, 0.1, 300),
            session_refresh_grace=refresh_grace(),
            scheduler_enabled=os.environ.get("SWITCHBOARD_SCHEDULER", "on").lower() not in ("0", "off", "false", "no"),
            scheduler_concurrency=_int("SWITCHBOARD_SCHEDULER_CONCURRENCY", 8, 1, 1000),
            queues=_queues(),
            lease_seconds=_float("SWITCHBOARD_LEASE_SECONDS", 60.0, 1, 86400),
            poll_interval=_float("SWITCHBOARD_POLL_INTERVAL", 1.0, 0.01, 3600),
            shutdown_grace=_float("SWITCHBOARD_SHUTDOWN_GRACE_SECONDS", 20.0, 0, 3600),
            event_retention_seconds=_int("SWITCHBOARD_EVENT_RETENTION_SECONDS", 300, 1, 86400 * 7),
            listen_check_interval=_float("SWITCHBOARD_LISTEN_CHECK_INTERVAL", 5.0, 0.1, 300),
            event_tick_interval=_float("SWITCHBOARD_EVENT_TICK_INTERVAL", 0.02, 0.002, 5),
            relay_read_gap=_float("SWITCHBOARD_RELAY_READ_GAP", 0.012, 0.0, 1.0),
            heartbeat_interval=_float("SWITCHBOARD_HEARTBEAT_INTERVAL", 5.0, 0.1, 300),
            presence_interval=_float("SWITCHBOARD_PRESENCE_INTERVAL", 1.0, 0.05, 60),
            replica_stale_seconds=_float("SWITCHBOARD_REPLICA_STALE_SECONDS", 30.0, 1, 3600),
            ws_queue_size=_int("SWITCHBOARD_WS_QUEUE_SIZE", 1000, 1, 1_000_000),
            ws_queue_bytes=_int("SWITCHBOARD_WS_QUEUE_BYTES", 16 * 1024 * 1024, 65536, 1 << 31),
            live_unconfirmed_ttl=_float("SWITCHBOARD_LIVE_UNCONFIRMED_TTL", 30.0, 0.5, 3600),
            stream_flush_seconds=_float("SWITCHBOARD_STREAM_FLUSH_SECONDS", 0.002, 0.0, 1.0),
            ws_deaf_close_seconds=_float("SWITCHBOARD_WS_DEAF_CLOSE_SECONDS", 30.0, 0.5, 3600),
            ws_replay_stall_seconds=_float("SWITCHBOARD_WS_REPLAY_STALL_SECONDS", 10.0, 0.1, 3600),
            ws_max_frame_bytes=_int("SWITCHBOARD_WS_MAX_FRAME_BYTES", 65536, 256, 16 * 1024 * 1024),
            ws_frame_rate=_float("SWITCHBOARD_WS_FRAME_RATE", 20.0, 0.1, 100000),
            ws_frame_burst=_int("SWITCHBOARD_WS_FRAME_BURST", 40, 1, 100000),
            ws_max_sockets_per_user=_int("SWITCHBOARD_WS_MAX_SOCKETS_PER_USER", 10, 1, 10000),
            ws_compression=ws_compression_enabled(),
            uvloop=uvloop_enabled(),
            ws_ticket_rate=_float("SWITCHBOARD_WS_TICKET_RATE", 1.0, 0.0001, 1e6),
            body_timeout=_float("SWITCHBOARD_BODY_TIMEOUT", 30.0, 0.5, 3600),
            ws_ticket_burst=_int("SWITCHBOARD_WS_TICKET_BURST", 30, 1, 1_000_000),
            login_ip_rate=_float("SWITCHBOARD_LOGIN_IP_RATE", 10 / 60, 0.0001, 1e6),
            login_ip_burst=_int("SWITCHBOARD_LOGIN_IP_BURST", 10, 1, 1_000_000),
            login_user_rate=_float("SWITCHBOARD_LOGIN_USER_RATE", 5 / 60, 0.0001, 1e6),
            login_user_burst=_int("SWITCHBOARD_LOGIN_USER_BURST", 5, 1, 1_000_000),
            refresh_ip_rate=_float("SWITCHBOARD_REFRESH_IP_RATE", 5.0, 0.0001, 1e6),
            refresh_ip_burst=_int("SWITCHBOARD_REFRESH_IP_BURST", 100, 1, 1_000_000),
            refresh_session_rate=_float("SWITCHBOARD_REFRESH_SESSION_RATE", 0.2, 0.0001, 1e6),
            refresh_session_burst=_int("SWITCHBOARD_REFRESH_SESSION_BURST", 30, 1, 1_000_000),
            ratelimit_timeout=_float("SWITCHBOARD_RATELIMIT_TIMEOUT", 0.5, 0.01, 60),
            sql_allow_no_timeout=os.environ.get("SWITCHBOARD_SQL_ALLOW_NO_TIMEOUT", "off").lower()
            in ("1", "on", "true", "yes"),
            sql_kill_grace_seconds=_float("SWITCHBOARD_SQL_KILL_GRACE_SECONDS", 5.0, 0.5, 600),
            handler_modules=_list("SWITCHBOARD_HANDLERS"),
            log_level=os.environ.get("SWITCHBOARD_LOG_LEVEL", "INFO").upper(),
            dev=dev,
        )

    def describe(self) -> dict[str, object]:
        """Settings without secrets, for logs."""
        out: dict[str, object] = {}
        for f in fields(self):
            if f.name in ("jwt_secret",) or f.name.endswith("_url"):
                continue
            out[f.name] = getattr(self, f.name)
        return out
