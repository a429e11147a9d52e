"""Job args errors, and the bounds every check of job args keeps (switchboard.jobargs).

``ArgsError`` names the offending value by its path (``items[2].sku``); ``scan`` looks
at a decoded args object without recursion (depth, element count, JSON types) before
any type is tried against it, so the typed walk that follows recurses at most
``MAX_DEPTH`` values deep; ``Walk`` counts the steps of one load or dump, so unions
retrying nested values cannot make a check take unbounded time. No I/O.
"""

from __future__ import annotations

import json
import math
import reprlib
from datetime import datetime
from enum import Enum
from typing import Any

MAX_DEPTH = 32  # containers nested in one another, the args object itself counting 1
MAX_ELEMENTS = 10_000  # list items and object members, at any depth
MAX_STEPS = 10 * MAX_ELEMENTS  # values visited by one load or dump, union retries included
_SHOW = 40  # characters of a value or a key an error message echoes
_LISTED = 12  # field names or choices an error message lists
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _SHOW


class ArgsError(ValueError):
    """Job args that do not fit the handler's args type.

    ``field``: path of the offending value (``order_id``, ``items[2].sku``, ``meta["k"]``,
    "" for the whole object); ``expected``: a readable type; ``got``: a short description
    of the value; ``handler``: set by whoever knows it, it prefixes the message."""

    def __init__(self, field: str, expected: str, got: str, detail: str | None = None) -> None:
        super().__init__(field, expected, got, detail)
        self.field = field
        self.expected = expected
        self.got = got
        self.handler: str | None = None
        self._detail = detail

    def __str__(self) -> str:
        subject = f"args field {self.field!r}" if self.field else "args"
        body = self._detail or f"must be {self.expected}, got {self.got}"
        return f"{self.handler}: {subject} {body}" if self.handler else f"{subject} {body}"


# -- where a value sits, and what it is -------------------------------------------------------
FIELD, KEY, INDEX = 0, 1, 2


class At:
    """A value's place: a field, a mapping key or a list index under ``up`` (None: the root)."""

    __slots__ = ("depth", "key", "kind", "up")

    def __init__(self, up: At | None, key: object, kind: int) -> None:
        self.up = up
        self.key = key
        self.kind = kind
        self.depth: int = 1 + (up.depth if up is not None else 0)


def path(at: At | None) -> str:
    parts: list[str] = []
    while at is not None:
        key = str(at.key)
        if at.kind == INDEX:
            parts.append(f"[{key}]")
        elif at.kind == FIELD and key.isidentifier():
            parts.append(f".{key}")
        else:
            parts.append(f"[{_quote(key)}]")
        at = at.up
    return "".join(reversed(parts)).removeprefix(".")


def _quote(s: str) -> str:
    return json.dumps(s if len(s) <= _SHOW else s[:_SHOW] + "...")


def describe(v: Any) -> str:
    """A short description of a value's JSON type (and the value, cut to ~40 characters)."""
    if v is None:
        return "null"
    if isinstance(v, Enum):
        return f"{type(v).__name__}.{v.name}"[:_SHOW]
    if isinstance(v, bool):
        return "bool true" if v else "bool false"
    if isinstance(v, str):
        return f"str {_quote(v)}"
    if type(v) is int:
        return f"int {v}" if v.bit_length() < 100 else f"int ({v.bit_length()} bits)"
    if isinstance(v, (list, tuple, dict)):
        noun = "key" if isinstance(v, dict) else "item"
        return f"{type(v).__name__} ({len(v)} {noun}{'' if len(v) == 1 else 's'})"
    if isinstance(v, datetime) and v.tzinfo is None:
        return f"naive datetime {v.isoformat()}"
    try:
        shown = _REPR.repr(v)
    except Exception:  # a broken __repr__ must not hide the args error
        shown = "?"
    return f"{type(v).__name__} {shown[:_SHOW]}"


def listing(items: list[str], sep: str = ", ") -> str:
    return sep.join(items[:_LISTED] + (["..."] if len(items) > _LISTED else []))


def json_kind(v: Any) -> type | None:
    """The JSON scalar type of ``v`` (NoneType, bool, str, int, float), or None."""
    if v is None:
        return type(None)
    for t in (bool, str, int):  # bool first: True is not an int here
        if isinstance(v, t):
            return t
    return float if isinstance(v, float) and math.isfinite(v) else None


# -- bounds -----------------------------------------------------------------------------------
class BoundExceeded(ArgsError):
    """Args past a bound: no union alternative may take this error for a mismatch."""


def _bound(at: At | None, expected: str, detail: str) -> ArgsError:
    return BoundExceeded(path(at), expected, "more", detail)


def _too_deep(at: At | None) -> ArgsError:
    return _bound(at, f"at most {MAX_DEPTH} levels of nesting", f"nests deeper than {MAX_DEPTH} levels")


class Walk:
    """One load or dump: the steps it has taken, against MAX_STEPS."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0

    def enter(self, at: At | None, children: int) -> None:
        """Before a container at ``at`` with ``children`` items or members is walked."""
        if at is not None and at.depth >= MAX_DEPTH:
            raise _too_deep(at)
        self.steps += children + 1
        if self.steps > MAX_STEPS:
            raise _bound(None, f"at most {MAX_STEPS} steps",
                         f"take more than {MAX_STEPS} steps to check (too many values, or values "
                         f"retried by nested unions)")


def scan(data: Any) -> None:
    """Depth, element count and JSON types of a decoded args value, with an explicit stack
    (no recursion), before any type is tried against it."""
    count = 0
    stack: list[tuple[Any, At | None]] = [(data, None)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, (dict, list)):
            if at is not None and at.depth >= MAX_DEPTH:
                raise _too_deep(at)
            count += len(v)
            if count > MAX_ELEMENTS:
                raise _bound(None, f"at most {MAX_ELEMENTS} values",
                             f"hold more than {MAX_ELEMENTS} values (list items and object members)")
            if isinstance(v, list):
                stack.extend((v[i], At(at, i, INDEX)) for i in range(len(v) - 1, -1, -1))
                continue
            for k in v:
                if not isinstance(k, str):
                    raise ArgsError(path(at), "an object with str keys", describe(v),
                                    f"is not JSON: a key is {describe(k)}")
            stack.extend((x, At(at, k, FIELD)) for k, x in reversed(v.items()))
        elif json_kind(v) is None:
            raise ArgsError(path(at), "a JSON value", describe(v), f"is not a JSON value: got {describe(v)}")
