"""Browser origins as RFC 6454 serialises them: what SWITCHBOARD_ALLOWED_ORIGINS holds
(config.py) and what the Origin checks compare (http/cors.py). No I/O."""

from __future__ import annotations

from urllib.parse import urlsplit

_DEFAULT_PORT = {"http": 80, "https": 443}


def normalize_origin(value: str) -> str | None:
    """``scheme://host[:port]`` as a browser serialises an origin (RFC 6454: lower-case
    scheme and host, the scheme's default port left out), or None for anything that is
    not an http(s) origin: ``null``, a path, a query, credentials, a bad port."""
    if not value or len(value) > 2048:
        return None
    try:
        u = urlsplit(value.strip())
        port = u.port
    except ValueError:
        return None
    scheme = u.scheme.lower()
    if scheme not in _DEFAULT_PORT or not u.hostname or u.username is not None or u.password is not None \
            or u.path not in ("", "/") or u.query or u.fragment:
        return None
    host = u.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != _DEFAULT_PORT[scheme] else "")
