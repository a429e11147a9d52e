"""The compiled form of a job args type: one node per annotation (switchboard.jobargs
builds them), each loading a JSON value into Python and dumping a Python value back
to JSON, naming the value's path in every error. No I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from .jobargs_bounds import (FIELD, INDEX, KEY, ArgsError, At, BoundExceeded, Walk, describe, json_kind,
                             listing, path)

_MISSING = object()


class Node:
    """One annotation. ``fits`` is a cheap look at a value's shape: a union tries only the
    alternatives that fit."""

    label = "?"

    def fits(self, v: Any, dumping: bool) -> bool:
        return True

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        raise NotImplementedError

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        raise NotImplementedError

    def refuse(self, v: Any, at: At | None, detail: str | None = None) -> ArgsError:
        return ArgsError(path(at), self.label, describe(v), detail)


class Prim(Node):
    """str, int, float, bool, None: the same test on both sides."""

    def __init__(self, label: str, test: Callable[[Any], bool], convert: Callable[[Any], Any]) -> None:
        self.label = label
        self.test = test
        self.convert = convert

    def fits(self, v: Any, dumping: bool) -> bool:
        return self.test(v)

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        if not self.test(v):
            raise self.refuse(v, at)
        return self.convert(v)

    dump = load


def _is_float(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, int) and not isinstance(v, bool) and v.bit_length() < 1024


STR = Prim("str", lambda v: isinstance(v, str), str.__str__)
INT = Prim("int", lambda v: isinstance(v, int) and not isinstance(v, bool), int)
FLOAT = Prim("float", _is_float, float)
BOOL = Prim("bool", lambda v: isinstance(v, bool), bool)
NONE = Prim("None", lambda v: v is None, lambda v: None)
_SCALAR: dict[Any, Callable[[Any], Any]] = {
    type(None): NONE.convert, bool: BOOL.convert, str: STR.convert, int: INT.convert, float: FLOAT.convert}


class AnyJson(Node):
    """Any or object: any JSON value, kept as it is."""

    label = "Any"

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        return v  # scan() has checked it is JSON

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        if isinstance(v, (list, tuple)):
            walk.enter(at, len(v))
            return [self.dump(x, walk, At(at, i, INDEX)) for i, x in enumerate(v)]
        if isinstance(v, dict):
            walk.enter(at, len(v))
            if all(isinstance(k, str) for k in v):
                return {k: self.dump(x, walk, At(at, k, KEY)) for k, x in v.items()}
        elif json_kind(v) is not None:
            return _SCALAR[json_kind(v)](v)  # a str or int Enum member as its plain value
        raise self.refuse(v, at, f"is not a JSON value: got {describe(v)}")


ANY = AnyJson()


class Parsed(Node):
    """datetime, date, UUID, Decimal: a JSON string (or int) on the wire, an object in Python.
    ``parse`` and ``show`` return None for what parses but is refused (a naive datetime)."""

    def __init__(self, label: str, hint: str, cls: type, raw: tuple[type, ...],
                 parse: Callable[[Any], Any], show: Callable[[Any], Any]) -> None:
        self.label, self.hint, self.cls, self.raw = label, hint, cls, raw
        self.parse, self.show = parse, show

    def fits(self, v: Any, dumping: bool) -> bool:
        return (dumping and self._is_obj(v)) or (isinstance(v, self.raw) and not isinstance(v, bool))

    def _is_obj(self, v: Any) -> bool:
        return isinstance(v, self.cls) and not (self.cls is date and isinstance(v, datetime))

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        out = None
        if isinstance(v, self.raw) and not isinstance(v, bool):
            try:
                out = self.parse(v)
            except (ValueError, ArithmeticError):
                out = None
        if out is None:
            raise self._refuse(v, at)
        return out

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        """The object, or its JSON form (validated and normalised), to the JSON form."""
        out = self.show(v if self._is_obj(v) else self.load(v, walk, at))
        if out is None:
            raise self._refuse(v, at)
        return out

    def _refuse(self, v: Any, at: At | None) -> ArgsError:
        return self.refuse(v, at, f"must be {self.label}{self.hint}, got {describe(v)}")


def _aware(dt: datetime) -> datetime | None:
    return dt if dt.utcoffset() is not None else None


def _finite(d: Decimal) -> Decimal | None:
    return d if d.is_finite() else None


DATETIME = Parsed("datetime", " (ISO 8601 with a UTC offset)", datetime, (str,),
                  lambda s: _aware(datetime.fromisoformat(s)),
                  lambda dt: dt.isoformat() if _aware(dt) else None)
DATE = Parsed("date", " (ISO 8601, YYYY-MM-DD)", date, (str,), date.fromisoformat, date.isoformat)
UUID_ = Parsed("UUID", "", UUID, (str,), UUID, str)
DECIMAL = Parsed("Decimal", " (a decimal number as a str or an int)", Decimal, (str, int),
                 lambda v: _finite(Decimal(v)), lambda d: str(d) if d.is_finite() else None)


class Choice(Node):
    """Literal[...] and Enum: a closed set of JSON scalars, matched with their type (1 is
    not True). ``table`` maps (json_kind, value) to what load returns."""

    def __init__(self, label: str, table: dict[tuple[Any, Any], Any], enum: type[Enum] | None) -> None:
        self.label, self.table, self.enum = label, table, enum

    def _find(self, v: Any) -> Any:
        kind = json_kind(v)
        return _MISSING if kind is None else self.table.get((kind, v), _MISSING)

    def fits(self, v: Any, dumping: bool) -> bool:
        member = dumping and self.enum is not None and isinstance(v, self.enum)
        return member or self._find(v) is not _MISSING

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        out = self._find(v)
        if out is _MISSING or (isinstance(v, Enum) and not (self.enum and isinstance(v, self.enum))):
            raise self.refuse(v, at)
        return out

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        if self.enum is not None and isinstance(v, self.enum):
            return v.value
        out = self.load(v, walk, at)
        return out.value if isinstance(out, Enum) else out


class Seq(Node):
    """list[X] and tuple[X, ...]: a JSON array (load returns a tuple for the latter)."""

    def __init__(self, item: Node, as_tuple: bool) -> None:
        self.item, self.as_tuple = item, as_tuple
        self.label = f"tuple[{item.label}, ...]" if as_tuple else f"list[{item.label}]"

    def fits(self, v: Any, dumping: bool) -> bool:
        return isinstance(v, list) or (dumping and isinstance(v, tuple))

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        if not isinstance(v, list):
            raise self.refuse(v, at)
        walk.enter(at, len(v))
        out = [self.item.load(x, walk, At(at, i, INDEX)) for i, x in enumerate(v)]
        return tuple(out) if self.as_tuple else out

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        if not self.fits(v, True):
            raise self.refuse(v, at)
        walk.enter(at, len(v))
        return [self.item.dump(x, walk, At(at, i, INDEX)) for i, x in enumerate(v)]


class Map(Node):
    """dict[str, X] and Mapping[str, X]: a JSON object, its keys the caller's."""

    def __init__(self, value: Node, name: str) -> None:
        self.value = value
        self.label = f"{name}[str, {value.label}]"

    def fits(self, v: Any, dumping: bool) -> bool:
        return isinstance(v, Mapping if dumping else dict)

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        return self._walk(v, walk, at, False)

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        return self._walk(v, walk, at, True)

    def _walk(self, v: Any, walk: Walk, at: At | None, dumping: bool) -> dict[str, Any]:
        if not self.fits(v, dumping):
            raise self.refuse(v, at)
        walk.enter(at, len(v))
        out: dict[str, Any] = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise self.refuse(v, at, f"must be {self.label}, got a {describe(k)} key")
            child = At(at, k, KEY)
            out[k] = self.value.dump(x, walk, child) if dumping else self.value.load(x, walk, child)
        return out


class Record(Node):
    """A dataclass or a TypedDict: a JSON object with exactly its fields (unknown keys are
    refused; missing ones only where a default or NotRequired allows). ``fields`` is
    filled after construction, so that a type may refer to itself."""

    def __init__(self, cls: type, required: frozenset[str], is_dataclass: bool) -> None:
        self.cls, self.required, self.is_dataclass = cls, required, is_dataclass
        self.label = cls.__name__
        self.fields: dict[str, Node] = {}

    def fits(self, v: Any, dumping: bool) -> bool:
        return isinstance(v, dict) or (dumping and (isinstance(v, Mapping) or type(v) is self.cls))

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        if not isinstance(v, dict):
            raise self.refuse(v, at)
        out = self._walk(v, walk, at, False)
        if not self.is_dataclass:
            return out
        try:
            return self.cls(**out)
        except (TypeError, ValueError) as e:  # __post_init__ refusing the values
            raise self.refuse(v, at, f"is refused by {self.label}: {str(e)[:200]}") from e

    def dump(self, v: Any, walk: Walk, at: At | None) -> dict[str, Any]:
        if self.is_dataclass and type(v) is self.cls:
            v = {name: getattr(v, name) for name in self.fields}
        elif not isinstance(v, Mapping):
            raise self.refuse(v, at)
        return self._walk(v, walk, at, True)

    def _walk(self, v: Mapping[Any, Any], walk: Walk, at: At | None, dumping: bool) -> dict[str, Any]:
        walk.enter(at, len(v))
        for k, x in v.items():
            if k not in self.fields:
                raise ArgsError(path(At(at, k, FIELD)), "no such field", describe(x),
                                f"is not a field of {self.label} (fields: {listing(list(self.fields))})")
        out: dict[str, Any] = {}
        for name, node in self.fields.items():
            child = At(at, name, FIELD)
            if name in v:
                out[name] = node.dump(v[name], walk, child) if dumping else node.load(v[name], walk, child)
            elif name in self.required:
                raise ArgsError(path(child), node.label, "nothing", "is required")
        return out


class OneOf(Node):
    """X | Y | ...: the first alternative that takes the value wins. When only one
    alternative fits the value's shape its own error stands (it names the deeper field)."""

    def __init__(self, alts: list[Node]) -> None:
        self.alts = alts
        self.label = " | ".join(a.label for a in alts)

    def fits(self, v: Any, dumping: bool) -> bool:
        return any(a.fits(v, dumping) for a in self.alts)

    def load(self, v: Any, walk: Walk, at: At | None) -> Any:
        return self._pick(v, walk, at, False)

    def dump(self, v: Any, walk: Walk, at: At | None) -> Any:
        return self._pick(v, walk, at, True)

    def _pick(self, v: Any, walk: Walk, at: At | None, dumping: bool) -> Any:
        alts = [a for a in self.alts if a.fits(v, dumping)]
        if len(alts) == 1:
            return alts[0].dump(v, walk, at) if dumping else alts[0].load(v, walk, at)
        for a in alts:
            try:
                return a.dump(v, walk, at) if dumping else a.load(v, walk, at)
            except BoundExceeded:
                raise
            except ArgsError:
                pass
        raise self.refuse(v, at)
