"""Parsing outside input with bounds: one place, used at every entry point.

Everything that comes from outside the replica — NOTIFY payloads (any role
that can connect may send any payload on any channel), HTTP bodies and query
parameters, WebSocket frames and handshake parameters, job arguments — is
parsed here, so that a hostile input fails as *that input* (a ``BadInput``
the caller turns into a 4xx, an error frame or a counted drop) and never as
a ``RecursionError``, an overflow inside a database call, or a 500.

No dependency on Falcon or psycopg: the relay, the HTTP layer and the CLI
all use it.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import unicodedata
from collections.abc import Callable
from typing import Any

# PostgreSQL bigint bounds: an id outside them must be refused before it
# reaches a query (psycopg would raise NumericValueOutOfRange inside the call).
BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

# Deep enough for any real payload, shallow enough that json.dumps, psycopg's
# Jsonb and PostgreSQL's own jsonb input (which stops at ~ max_stack_depth) all
# cope with what passes.
DEFAULT_MAX_DEPTH = 64

_INT_RE = re.compile(r"-?[0-9]{1,19}")


class BadInput(ValueError):
    """An outside input that fails its bounds. ``reason`` is a short fixed code
    (closed set, safe as a metric label); ``str(exc)`` is a human message that
    never echoes more than a short, escaped excerpt of the input."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when ``value`` nests containers deeper than ``max_depth``.

    Iterative (an explicit stack), so a deep value cannot exhaust the Python
    stack while being checked."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                return True
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            if depth > max_depth:
                return True
            stack.extend((v, depth + 1) for v in node)
    return False


def loads(data: str | bytes, *, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """``json.loads`` with a size bound, a nesting bound, and no NaN/Infinity
    (PostgreSQL's jsonb refuses them, so accepting them here would only move
    the failure into a later database call)."""
    if len(data) > max_bytes:
        raise BadInput("too_large", f"JSON document of {len(data)} bytes exceeds {max_bytes}")
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise BadInput("too_deep", f"JSON nested deeper than {max_depth}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, BadInput):
            raise
        raise BadInput("malformed", f"malformed JSON: {_short(str(exc))}") from None
    if json_depth_exceeds(value, max_depth):
        raise BadInput("too_deep", f"JSON nested deeper than {max_depth}")
    return value


def stored_json(text: str) -> Any:
    """A jsonb value read as text from a stored row (an event's payload).

    PostgreSQL's jsonb nests as deep as its stack allows (thousands of levels); Python's
    json stops near 1,000 with RecursionError. Publishing refuses more than 64 levels
    since V0020 (_check_event), but a row stored before, or written by hand, may be
    deeper: refused here as BadInput("too_deep"), so that one row cannot stop a reader
    (the relay skips and counts it; see Relay._read)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadInput("too_deep", "a stored JSON value nested too deep for this reader") from None


def _refuse_constant(name: str) -> Any:
    raise BadInput("malformed", f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    # 1e999 parses as inf: refused like Infinity (jsonb cannot hold it either).
    value = float(text)
    if not math.isfinite(value):
        raise BadInput("bad_number", f"number {escape(text, 40)} is out of range")
    return value


def bigint(value: object, *, name: str = "value", minimum: int = BIGINT_MIN,
           maximum: int = BIGINT_MAX) -> int:
    """An integer in [minimum, maximum] from a JSON number or a decimal string.

    Refuses bools, floats with a fraction, NaN/inf, non-ASCII digits ('²',
    Arabic-Indic digits: ``int()`` would accept some of them) and anything
    outside the range."""
    if isinstance(value, bool):
        raise BadInput("bad_number", f"{name} must be an integer, not a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise BadInput("bad_number", f"{name} must be an integer")
        value = int(value)
    if isinstance(value, str):
        if not _INT_RE.fullmatch(value):
            raise BadInput("bad_number", f"{name} must be a decimal integer, got {escape(value, 40)}")
        value = int(value)
    if not isinstance(value, int):
        raise BadInput("bad_number", f"{name} must be an integer")
    if not minimum <= value <= maximum:
        raise BadInput("out_of_range", f"{name} {value} is outside [{minimum}, {maximum}]")
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape(text: str, limit: int = 200) -> str:
    """Printable, single-line, bounded text for logs and messages: control
    characters (CR/LF included, so no forged log lines) become ``\\xNN`` /
    ``\\uNNNN`` escapes, and the result is cut at ``limit`` characters."""
    cut = text[:limit]
    out = _CONTROL.sub(lambda m: _esc(m.group()), cut)
    return out + ("…" if len(text) > limit else "")


def _esc(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _short(text: str) -> str:
    return escape(text, 120)


# -- what a refusal looks like from outside: a counted, rate-limited log line ------------
# The label values of switchboard_bad_input_total. Closed sets: a reason or a
# source that is not listed is counted as "other", so no input can add a series.
SOURCES = ("http", "ws", "handshake", "job", "event_row", "other")
REASONS = ("too_large", "too_deep", "malformed", "bad_number", "out_of_range", "bad_type",
           "bad_content_type", "bad_text", "too_slow", "other")


class Rejections:
    """The one refused-input logger: counts every refused input and logs at most
    one line per key per ``interval`` seconds (with how many were suppressed), so
    a flood of hostile input costs a counter increment each, not a log line each.

    HTTP bodies, WebSocket frames and handshakes (and job arguments) use it as is:
    counted in switchboard_bad_input_total{source, reason}, one line per (source,
    reason). NOTIFY payloads use ``NotifyRejections`` below. The state is keyed by
    closed sets (a source or reason not listed becomes "other"): it cannot grow."""

    def __init__(self, count: Callable[[str, str], None] | None, logger: logging.Logger,
                 interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._count = count
        self._log = logger
        self.interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def record(self, source: str, reason: str, detail: str = "") -> None:
        source = source if source in SOURCES else "other"
        reason = reason if reason in REASONS else "other"
        self._counted(source, reason)
        n = self._due((source, reason))
        if n is not None:
            more = f" ({n} more since the last report)" if n else ""
            self._log.warning("refused %s input (%s): %s%s", source, reason, escape(detail, 200), more)

    def _counted(self, source: str, reason: str) -> None:
        if self._count is None:
            return
        try:
            self._count(source, reason)
        except Exception:  # a metric must never turn a refusal into a 500
            self._log.debug("counting a refused input failed", exc_info=True)

    def _due(self, key: tuple[str, str]) -> int | None:
        """None if ``key`` was reported less than ``interval`` ago (this one is then
        suppressed), else how many were suppressed since its last report."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)


class NotifyRejections(Rejections):
    """Rejections for NOTIFY payloads (the relay's hints.RejectLog): one line per
    interval for all of them together, whatever the channel or reason, as before.
    The relay counts switchboard_notify_rejected_total{reason} itself (with the
    reasons of hints.REJECT_REASONS), beside this call."""

    def __init__(self, log: logging.Logger, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(None, log, interval, clock)

    def __call__(self, channel: str, exc: BadInput, payload: str) -> None:
        n = self._due(("notify", ""))
        if n is not None:
            self._log.warning("refused a NOTIFY payload on %s (%s: %s; %d more refused in the last %.0f s): %s",
                              channel, exc.reason, exc, n, self.interval, escape(payload, 120))


def text(value: object, *, name: str, max_len: int, allow_empty: bool = False) -> str:
    """A name-like string from outside (a room, an event name): a str, not too
    long, no NUL (PostgreSQL text cannot hold it) and no other control
    character (they forge log lines and break display)."""
    if not isinstance(value, str):
        raise BadInput("bad_type", f"{name} must be a string")
    if not value and not allow_empty:
        raise BadInput("bad_text", f"{name} must not be empty")
    if len(value) > max_len:
        raise BadInput("too_large", f"{name} is longer than {max_len} characters")
    if _C0.search(value):
        raise BadInput("bad_text", f"{name} must not contain control characters")
    return value


_C0 = re.compile(r"[\x00-\x1f\x7f]")

# ASCII-only lower-casing, the same as PostgreSQL's lower() under COLLATE "C".
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold_username(name: str) -> str:
    """The identity of a username: NFKC-normalised, then ASCII case-folded.

    The one rule, the same as SQL's switchboard.fold_username() (the unique
    index on users): 'Alice', 'ALICE' and the full-width 'ＡＬＩＣＥ' are one
    identity for uniqueness, login, the login throttle and the device cookie.
    Usernames are ASCII (create_user's pattern), so NFKC folds compatibility
    forms of ASCII onto it and ASCII case-folding is the whole case rule."""
    return unicodedata.normalize("NFKC", name).translate(_ASCII_LOWER)
