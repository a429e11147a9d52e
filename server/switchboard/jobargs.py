"""Typed job arguments: a handler's args as a ``@dataclass`` or a ``TypedDict``, checked
when a job is enqueued and again when its run starts. No I/O, no database.

Job args travel as a JSON object. A handler may declare their type::

    from dataclasses import dataclass, field

    @dataclass
    class InvoiceArgs:
        order_id: int
        email: str
        notes: list[str] = field(default_factory=list)

- ``check_args_type(InvoiceArgs)`` at registration: TypeError unless it is a dataclass
  or TypedDict class whose every field (nested types included) is supported.
- ``dump_args(InvoiceArgs(order_id=7, email="a@b.c"))`` (or a dict with the type) at
  enqueue: validated, to a JSON-able dict (``{"order_id": 7, "email": "a@b.c", "notes": []}``).
- ``load_args(InvoiceArgs, run_args)`` at run start, on what the database holds:
  validated, strictly (an unknown key is refused), to an ``InvoiceArgs``.

Both raise ``ArgsError`` (a ValueError) naming the field: ``args field 'items[2].sku'
must be str, got int 5``; ``args field 'order_id' is required``; ``args field 'ordr_id'
is not a field of InvoiceArgs (fields: order_id, email, notes)``. Set ``e.handler`` and
the message starts with the handler's name.

Supported: str, int (not bool, not 3.0), float (takes an int), bool, None, Any/object
(any JSON), ``X | None`` and ``Union`` (the first alternative that takes the value
wins), ``Literal[...]``, ``list[X]``, ``tuple[X, ...]`` (a JSON array), ``dict[str, X]``,
``Mapping[str, X]``, nested dataclasses and TypedDicts (``total=False``, ``Required``,
``NotRequired``), ``datetime`` (ISO 8601 with a UTC offset; a naive one is refused),
``date``, ``UUID``, ``Enum`` (by value), ``Decimal`` (from a str or an int), and
``Annotated[X, ...]`` (metadata ignored). Dumping also takes the JSON form of a
datetime, date, UUID, Enum or Decimal (an ISO string, a member's value), normalised.
Annotations are resolved with ``typing.get_type_hints``: under ``from __future__ import
annotations`` the types they name must be defined at module level.

Hostile args are bounded (jobargs_bounds): at most 32 levels of nesting and 10,000
values, checked without recursion before any type is tried.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import (Annotated, Any, Literal, NotRequired, Required, Union, get_args,
                    get_origin, get_type_hints, is_typeddict)
from uuid import UUID

from .jobargs_bounds import ArgsError, Walk, describe, json_kind, listing, scan
from .jobargs_nodes import (ANY, BOOL, DATE, DATETIME, DECIMAL, FLOAT, INT, NONE, STR, UUID_, Choice,
                            Map, Node, OneOf, Record, Seq)

__all__ = ["ArgsError", "check_args_type", "dump_args", "load_args"]

_PLAIN: tuple[tuple[Any, Node], ...] = (
    (str, STR), (int, INT), (float, FLOAT), (bool, BOOL), (None, NONE), (type(None), NONE),
    (Any, ANY), (object, ANY), (datetime, DATETIME), (date, DATE), (UUID, UUID_), (Decimal, DECIMAL),
)
_SUPPORTED = ("str, int, float, bool, None, Any, X | None, Literal[...], list[X], tuple[X, ...], "
              "dict[str, X], Mapping[str, X], datetime, date, UUID, Decimal, an Enum, "
              "a dataclass or a TypedDict")
_BARE = {list: "list[X]", tuple: "tuple[X, ...]", dict: "dict[str, X]", set: "list[X]",
         frozenset: "list[X]"}

# Compiled record types, by class. A failed compile stores nothing.
_CACHE: dict[type, Record] = {}


# -- public API -------------------------------------------------------------------------------
def check_args_type(tp: Any) -> None:
    """Raise TypeError unless ``tp`` is a dataclass or TypedDict class whose fields all have
    supported annotations (nested types too). Called when a handler registers."""
    _compiled(tp)


def dump_args(value: Any, tp: Any | None = None) -> dict[str, Any]:
    """Args for enqueue, as a JSON-able dict.

    ``value``: a dataclass instance (its type is used when ``tp`` is None), a dict
    (validated against ``tp`` when given, else returned as it is once its keys are seen
    to be str), or None (an empty object). ArgsError when a field has the wrong type;
    TypeError when ``value`` is an instance of another dataclass than ``tp``."""
    if isinstance(value, type):
        raise TypeError(f"dump_args takes args (a dataclass instance or a dict), "
                        f"not the class {_name(value)}")
    instance = dataclasses.is_dataclass(value)
    if tp is None:
        if instance:
            tp = type(value)
        elif value is None:
            return {}
        else:
            return _plain(value)
    elif instance and type(value) is not tp:
        raise TypeError(f"args of type {type(value).__name__} given for {_name(tp)}")
    out = _compiled(tp).dump({} if value is None else value, Walk(), None)
    scan(out)  # what enqueue stores passes the bounds load_args keeps
    return out


def load_args(tp: Any, data: Any) -> Any:
    """The args of a starting run (decoded JSON; None counts as ``{}``) as ``tp``: a
    dataclass instance, or for a TypedDict a plain dict with converted values.
    ArgsError when they do not fit, strictly: an unknown key is refused."""
    record = _compiled(tp)
    data = {} if data is None else data
    scan(data)
    return record.load(data, Walk(), None)


def _plain(value: Any) -> dict[str, Any]:
    got = describe(value)
    if not isinstance(value, dict):
        raise ArgsError("", "dict", got, f"must be a dict or a dataclass instance, got {got}")
    for k in value:
        if not isinstance(k, str):
            raise ArgsError("", "dict[str, Any]", got, f"must have str keys, got a {describe(k)} key")
    return value


# -- annotations to nodes ---------------------------------------------------------------------
def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or is_typeddict(tp))


def _name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else repr(tp).removeprefix("typing.")


def _compiled(tp: Any) -> Record:
    if not _is_record(tp):
        raise TypeError(f"an args type must be a @dataclass class or a TypedDict class, not {_name(tp)}")
    record = _CACHE.get(tp)
    if record is None:
        seen: dict[type, Record] = {}
        record = _record(tp, "", seen)
        _CACHE.update(seen)
    return record


def _record(tp: type, where: str, seen: dict[type, Record]) -> Record:
    """A dataclass or TypedDict, its fields compiled after it is in ``seen`` (a type may
    refer to itself, directly or through others)."""
    done = _CACHE.get(tp) or seen.get(tp)
    if done is not None:
        return done
    where = f"{where} -> {tp.__name__}" if where else tp.__name__
    try:
        hints = get_type_hints(tp, include_extras=True)
    except Exception as e:  # NameError, TypeError, SyntaxError: whatever evaluation raised
        raise TypeError(f"{where}: cannot resolve its annotations: {type(e).__name__}: {e}") from e
    if dataclasses.is_dataclass(tp):
        names, required = _dataclass_fields(tp, hints, where)
    else:
        names, required = list(hints), _typeddict_required(tp, hints)
    record = Record(tp, frozenset(required), dataclasses.is_dataclass(tp))
    seen[tp] = record
    for name in names:
        record.fields[name] = _compile(hints[name], f"{where}.{name}", seen)
    return record


def _dataclass_fields(tp: type, hints: dict[str, Any], where: str) -> tuple[list[str], set[str]]:
    """The fields __init__ takes (init=False ones are the class's own business)."""
    if any(isinstance(h, dataclasses.InitVar) for h in hints.values()):
        raise TypeError(f"{where}: InitVar fields are not supported in job args")
    fields = [f for f in dataclasses.fields(tp) if f.init]
    required = {f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return [f.name for f in fields], required


def _typeddict_required(tp: Any, hints: dict[str, Any]) -> set[str]:
    """__required_keys__, corrected by Required/NotRequired themselves: under
    ``from __future__ import annotations`` Python 3.11 cannot see them in the strings."""
    required = set(tp.__required_keys__)
    for name, hint in hints.items():
        while get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
        if get_origin(hint) is Required:
            required.add(name)
        elif get_origin(hint) is NotRequired:
            required.discard(name)
    return required


def _compile(tp: Any, where: str, seen: dict[type, Record]) -> Node:
    origin = get_origin(tp)
    if origin is not None:
        build = _BY_ORIGIN.get(origin)
        if build is None:
            raise _unsupported(tp, where)
        return build(tp, get_args(tp), where, seen)
    for plain, node in _PLAIN:
        if tp is plain:
            return node
    if isinstance(tp, type) and issubclass(tp, Enum):
        return _enum(tp, where)
    if _is_record(tp):
        return _record(tp, where, seen)
    raise _unsupported(tp, where)


def _unsupported(tp: Any, where: str, why: str = "") -> TypeError:
    bare = isinstance(tp, type) and tp in _BARE
    hint = f" (a bare {tp.__name__} needs its item type: {_BARE[tp]})" if bare else ""
    why = why or f"{_name(tp)} is not a supported args type{hint}; use {_SUPPORTED}"
    return TypeError(f"{where}: {why}")


Build = Callable[[Any, tuple[Any, ...], str, dict[type, Record]], Node]


def _inner(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    """Annotated[X, ...], Required[X], NotRequired[X]: X."""
    return _compile(args[0], where, seen)


def _union(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    return OneOf([_compile(a, where, seen) for a in args])


def _list(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    if len(args) != 1:
        raise _unsupported(tp, where, f"{_name(tp)}: a list needs one item type, list[X]")
    return Seq(_compile(args[0], f"{where}[]", seen), as_tuple=False)


def _tuple(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    if len(args) != 2 or args[1] is not Ellipsis:
        raise _unsupported(tp, where, f"{_name(tp)}: only tuple[X, ...] is supported (a JSON array)")
    return Seq(_compile(args[0], f"{where}[]", seen), as_tuple=True)


def _mapping(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    kind = "Mapping" if get_origin(tp) is Mapping else "dict"
    if len(args) != 2 or args[0] is not str:
        raise _unsupported(tp, where, f"{_name(tp)}: JSON object keys are str, use {kind}[str, X]")
    return Map(_compile(args[1], f"{where}[]", seen), kind)


def _literal(tp: Any, args: tuple[Any, ...], where: str, seen: dict[type, Record]) -> Node:
    bad = [a for a in args if type(a) not in (str, int, bool, type(None))]
    if bad:
        raise _unsupported(tp, where, f"{_name(tp)}: Literal values must be str, int, bool or None, "
                                      f"not {bad[0]!r}")
    return Choice(listing([repr(a) for a in args], " | "), {(json_kind(a), a): a for a in args}, None)


def _enum(tp: type[Enum], where: str) -> Node:
    table: dict[tuple[Any, Any], Any] = {}
    for member in tp:
        kind = json_kind(member.value)
        if kind is None or isinstance(member.value, Enum):
            raise _unsupported(tp, where, f"{tp.__name__}.{member.name} = {member.value!r}: an args Enum's "
                                          f"values must be str, int, float, bool or None (JSON scalars)")
        table[(kind, member.value)] = member
    return Choice(f"{tp.__name__} ({listing([repr(m.value) for m in tp], ' | ')})", table, tp)


_BY_ORIGIN: dict[Any, Build] = {
    Annotated: _inner, Required: _inner, NotRequired: _inner,
    Union: _union, types.UnionType: _union, Literal: _literal,
    list: _list, tuple: _tuple, dict: _mapping, Mapping: _mapping,
}
