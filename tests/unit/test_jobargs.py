"""Unit tier: typed job args (switchboard.jobargs), no database.

Every supported annotation loads and dumps, every refusal names the field by its
path, the bounds hold against hostile args, and unsupported args types are refused
at registration. This module uses ``from __future__ import annotations``, so every
args type below has string annotations that jobargs must resolve.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Literal, NotRequired, Optional, Required, TypedDict, Union
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.jobargs import ArgsError, check_args_type, dump_args, load_args

UID = "6f1c2b9e-3a4d-4e5f-8a9b-0c1d2e3f4a5b"
UTC = timezone.utc


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Item:
    sku: str
    qty: int = 1


@dataclass
class InvoiceArgs:
    order_id: int
    amount: float


@dataclass
class Order:
    order_id: int
    items: list[Item] = field(default_factory=list)
    note: str | None = None


class Meta(TypedDict, total=False):
    source: str
    tries: int


class Partial(TypedDict):
    id: Required[int]
    label: NotRequired[str]


@dataclass
class Everything:
    s: str
    i: int
    f: float
    b: bool
    n: None
    a: Any
    o: object
    opt: Optional[int]
    pipe: int | None
    un: Union[int, str]
    lit: Literal["a", "b", 3]
    ls: list[str]
    tup: tuple[int, ...]
    d: dict[str, int]
    m: Mapping[str, bool]
    item: Item
    meta: Meta
    when: datetime
    day: date
    uid: UUID
    color: Color
    level: Level
    money: Decimal
    ann: Annotated[int, "metadata, ignored"]


EVERYTHING_JSON: dict[str, Any] = {
    "s": "x", "i": 7, "f": 1.5, "b": True, "n": None, "a": {"any": [1, "json"]}, "o": [None],
    "opt": None, "pipe": 4, "un": "u", "lit": 3, "ls": ["p", "q"], "tup": [1, 2], "d": {"k": 1},
    "m": {"on": False}, "item": {"sku": "A-1"}, "meta": {"source": "cli"},
    "when": "2024-05-06T07:08:09.123456+02:00", "day": "2024-05-06", "uid": UID, "color": "green",
    "level": 2, "money": "12.50", "ann": 5,
}


def refused(tp: Any, data: Any) -> ArgsError:
    with pytest.raises(ArgsError) as e:
        load_args(tp, data)
    return e.value


def dump_refused(value: Any, tp: Any = None) -> ArgsError:
    with pytest.raises(ArgsError) as e:
        dump_args(value, tp)
    return e.value


# -- every supported type ---------------------------------------------------------------------
def test_every_supported_type_loads_to_python_values() -> None:
    v = load_args(Everything, EVERYTHING_JSON)
    assert isinstance(v, Everything)
    assert (v.s, v.i, v.f, v.b, v.n, v.a, v.o) == ("x", 7, 1.5, True, None, {"any": [1, "json"]}, [None])
    assert (v.opt, v.pipe, v.un, v.lit, v.ls, v.tup) == (None, 4, "u", 3, ["p", "q"], (1, 2))
    assert (v.d, v.m, v.item, v.meta) == ({"k": 1}, {"on": False}, Item("A-1", 1), {"source": "cli"})
    assert v.when == datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert v.when.utcoffset() == timedelta(hours=2)
    assert (v.day, v.uid, v.color, v.level) == (date(2024, 5, 6), UUID(UID), Color.GREEN, Level.HIGH)
    assert type(v.level) is Level and v.money == Decimal("12.50") and str(v.money) == "12.50"
    assert v.ann == 5


def test_every_supported_type_dumps_to_json_and_back() -> None:
    v = load_args(Everything, EVERYTHING_JSON)
    out = dump_args(v)
    assert json.loads(json.dumps(out)) == out
    assert out == EVERYTHING_JSON | {"item": {"sku": "A-1", "qty": 1}}
    assert load_args(Everything, out) == v


def test_int_refuses_bool_and_integral_floats_and_float_takes_an_int() -> None:
    assert refused(InvoiceArgs, {"order_id": True, "amount": 1}).got == "bool true"
    e = refused(InvoiceArgs, {"order_id": 3.0, "amount": 1})
    assert (e.field, e.expected, e.got) == ("order_id", "int", "float 3.0")
    got = load_args(InvoiceArgs, {"order_id": 3, "amount": 2})
    assert got == InvoiceArgs(3, 2.0) and type(got.amount) is float
    assert refused(InvoiceArgs, {"order_id": 3, "amount": False}).field == "amount"
    assert refused(InvoiceArgs, {"order_id": 3, "amount": "2"}).field == "amount"
    for bad in (float("nan"), float("inf")):
        assert dump_refused(InvoiceArgs(1, bad)).field == "amount"


@pytest.mark.parametrize(("name", "bad", "expected"), [
    ("s", 1, "str"), ("i", "1", "int"), ("f", "1.5", "float"), ("b", 1, "bool"), ("n", 0, "None"),
    ("opt", "x", "int | None"), ("un", 1.5, "int | str"), ("lit", "c", "'a' | 'b' | 3"),
    ("lit", True, "'a' | 'b' | 3"), ("ls", "ab", "list[str]"), ("tup", {}, "tuple[int, ...]"),
    ("d", [], "dict[str, int]"), ("m", None, "Mapping[str, bool]"), ("item", "A-1", "Item"),
    ("meta", [], "Meta"), ("when", 1714975689, "datetime"), ("when", "yesterday", "datetime"),
    ("day", "2024-13-01", "date"), ("day", "2024-05-06T00:00:00+00:00", "date"), ("uid", "nope", "UUID"),
    ("color", "blue", "Color ('red' | 'green')"), ("color", "RED", "Color ('red' | 'green')"),
    ("level", "2", "Level (1 | 2)"), ("money", 1.5, "Decimal"), ("money", "NaN", "Decimal"),
    ("money", "one", "Decimal"), ("ann", "5", "int"),
])
def test_a_wrong_type_is_refused_naming_the_field(name: str, bad: Any, expected: str) -> None:
    e = refused(Everything, EVERYTHING_JSON | {name: bad})
    assert (e.field, e.expected) == (name, expected)
    assert str(e).startswith(f"args field '{name}' must be {expected}")


@pytest.mark.parametrize(("name", "bad", "where"), [
    ("ls", ["ok", 2], "ls[1]"), ("tup", [1, "2"], "tup[1]"), ("d", {"k": "v"}, 'd["k"]'),
    ("d", {"a b": "v"}, 'd["a b"]'), ("m", {"on": 1}, 'm["on"]'), ("item", {"sku": 1}, "item.sku"),
    ("item", {"sku": "x", "qty": "2"}, "item.qty"), ("meta", {"tries": "3"}, "meta.tries"),
])
def test_a_wrong_type_inside_a_container_names_its_path(name: str, bad: Any, where: str) -> None:
    assert refused(Everything, EVERYTHING_JSON | {name: bad}).field == where


def test_a_nested_field_is_named_by_its_path() -> None:
    e = refused(Order, {"order_id": 1, "items": [{"sku": "a"}, {"sku": "b", "qty": "2"}]})
    assert (e.field, e.expected, e.got) == ("items[1].qty", "int", 'str "2"')
    assert str(e) == "args field 'items[1].qty' must be int, got str \"2\""
    e = refused(Order, {"order_id": 1, "items": [{"sku": "a"}, {"qty": 2}]})
    assert str(e) == "args field 'items[1].sku' is required"


# -- the messages -----------------------------------------------------------------------------
def test_the_messages_read_as_documented_and_carry_the_handler() -> None:
    e = refused(InvoiceArgs, {"order_id": "12", "amount": 1})
    assert isinstance(e, ValueError) and e.handler is None
    e.handler = "invoice.send"
    assert str(e) == "invoice.send: args field 'order_id' must be int, got str \"12\""
    assert str(refused(InvoiceArgs, {"amount": 1})) == "args field 'order_id' is required"
    e = refused(InvoiceArgs, {"ordr_id": 12, "amount": 1})
    assert str(e) == "args field 'ordr_id' is not a field of InvoiceArgs (fields: order_id, amount)"
    assert e.field == "ordr_id"
    e = refused(InvoiceArgs, [1, 2])
    assert (e.field, str(e)) == ("", "args must be InvoiceArgs, got list (2 items)")


def test_got_is_short_and_an_error_survives_pickling() -> None:
    e = refused(InvoiceArgs, {"order_id": "x" * 10_000, "amount": 1})
    assert e.got.startswith('str "xxx') and len(e.got) < 60
    e = refused(Order, {"order_id": 1, "items": {"k" * 500: 1}})
    assert len(str(e)) < 120
    e.handler = "h"
    again = pickle.loads(pickle.dumps(e))
    assert (type(again), str(again), again.field) == (ArgsError, str(e), e.field)


# -- missing and unknown keys, defaults, TypedDict ---------------------------------------------
def test_defaults_fill_missing_keys_and_unknown_keys_are_refused() -> None:
    assert load_args(Order, {"order_id": 1}) == Order(1, [], None)
    assert load_args(Order, {"order_id": 1, "items": [{"sku": "a"}]}).items == [Item("a", 1)]
    assert refused(Order, {"order_id": 1, "items": [{"sku": "a", "colour": "red"}]}).field == "items[0].colour"
    assert refused(Order, {"order_id": 1, "": 2}).field == '[""]'


def test_typed_dict_total_false_required_and_not_required() -> None:
    assert load_args(Meta, {}) == {}
    assert load_args(Meta, {"tries": 2}) == {"tries": 2}
    assert refused(Meta, {"retries": 2}).field == "retries"
    # Python 3.11 reads NotRequired only from an evaluated annotation, not from the string
    # (Partial.__required_keys__ holds "label" here): jobargs reads the resolved hint.
    assert load_args(Partial, {"id": 1}) == {"id": 1}
    assert load_args(Partial, {"id": 1, "label": "x"}) == {"id": 1, "label": "x"}
    assert str(refused(Partial, {"label": "x"})) == "args field 'id' is required"
    assert dump_args({"id": 1}, Partial) == {"id": 1}
    assert dump_args(None, Meta) == {}


def test_a_typed_dict_loads_nested_values_as_python_values() -> None:
    class Stamped(TypedDict):
        at: datetime
        who: Item

    got = load_args(Stamped, {"at": "2024-01-02T03:04:05Z", "who": {"sku": "s"}})
    assert got == {"at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "who": Item("s")}
    assert type(got) is dict


def test_post_init_refusing_the_values_is_an_args_error() -> None:
    @dataclass
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("n must be positive")

    e = refused(Positive, {"n": 0})
    assert str(e) == "args is refused by Positive: n must be positive"


# -- datetimes ---------------------------------------------------------------------------------
def test_a_naive_datetime_is_refused_on_both_sides_and_z_is_utc() -> None:
    @dataclass
    class When:
        at: datetime

    assert load_args(When, {"at": "2024-01-02T03:04:05Z"}).at == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    e = refused(When, {"at": "2024-01-02T03:04:05"})
    assert e.field == "at" and "UTC offset" in str(e)
    e = dump_refused(When(datetime(2024, 1, 2, 3, 4, 5)))
    assert e.field == "at" and e.got.startswith("naive datetime 2024-01-02T03:04:05")
    assert dump_args(When(datetime(2024, 1, 2, tzinfo=UTC))) == {"at": "2024-01-02T00:00:00+00:00"}
    # a date is not a datetime, nor a datetime a date
    assert dump_refused(When(date(2024, 1, 2))).field == "at"  # type: ignore[arg-type]


# -- dump_args ---------------------------------------------------------------------------------
def test_dump_args_takes_a_dataclass_a_dict_or_none() -> None:
    assert dump_args(None) == {}
    assert dump_args({"free": ["form"]}) == {"free": ["form"]}
    assert dump_args(Order(2, [Item("a")])) == {"order_id": 2, "items": [{"sku": "a", "qty": 1}], "note": None}
    assert dump_args({"order_id": 2}, Order) == {"order_id": 2}
    assert str(dump_refused(None, Order)) == "args field 'order_id' is required"
    assert dump_refused({"order_id": 2, "itmes": []}, Order).field == "itmes"
    assert dump_refused({1: "x"}).field == ""
    assert dump_refused([1]).field == ""


def test_dump_args_validates_a_dataclass_instance_field_by_field() -> None:
    e = dump_refused(Order(1, [Item("a"), Item("b", "2")]))  # type: ignore[arg-type]
    assert (e.field, e.expected) == ("items[1].qty", "int")
    assert dump_refused(Order(1, [{"sku": "a", "qty": True}])).field == "items[0].qty"  # type: ignore[list-item]
    everything = load_args(Everything, EVERYTHING_JSON)
    assert dump_refused(dataclasses.replace(everything, a={1, 2})).field == "a"
    assert dump_refused(dataclasses.replace(everything, tup=[1, "2"])).field == "tup[1]"
    assert str(dump_refused(Order(1, note=5))) == "args field 'note' must be str | None, got int 5"  # type: ignore[arg-type]


def test_dump_args_takes_the_json_form_and_normalises_it() -> None:
    out = dump_args(EVERYTHING_JSON | {"uid": UID.upper(), "color": Color.RED, "level": Level.LOW,
                                       "money": 12, "tup": (1, 2)}, Everything)
    assert (out["uid"], out["color"], out["level"], out["money"], out["tup"]) == (UID, "red", 1, "12", [1, 2])
    assert json.loads(json.dumps(out)) == out


def test_dump_args_refuses_another_dataclass_and_a_class() -> None:
    with pytest.raises(TypeError, match="Item given for Order"):
        dump_args(Item("a"), Order)
    with pytest.raises(TypeError, match="not the class Order"):
        dump_args(Order)


# -- unions, literals, enums -------------------------------------------------------------------
def test_the_first_union_alternative_that_takes_the_value_wins() -> None:
    @dataclass
    class U:
        a: int | float
        b: float | int
        c: UUID | str

    got = load_args(U, {"a": 3, "b": 3, "c": "not-a-uuid"})
    assert (type(got.a), type(got.b), got.c) == (int, float, "not-a-uuid")
    assert load_args(U, {"a": 3, "b": 3, "c": UID}).c == UUID(UID)


def test_an_optional_record_reports_the_deeper_field() -> None:
    @dataclass
    class Wrap:
        item: Item | None

    assert refused(Wrap, {"item": {"sku": 5}}).field == "item.sku"
    assert refused(Wrap, {"item": 5}).expected == "Item | None"


def test_enum_members_of_another_enum_are_refused() -> None:
    class Other(enum.IntEnum):
        ONE = 1

    @dataclass
    class L:
        level: Level

    assert dump_args(L(Level.HIGH)) == {"level": 2}
    assert dump_args({"level": 1}, L) == {"level": 1}
    assert dump_refused({"level": Other.ONE}, L).field == "level"
    assert refused(L, {"level": True}).field == "level"


# -- recursion and the bounds -----------------------------------------------------------------
@dataclass
class Tree:
    name: str
    kids: list[Tree] = field(default_factory=list)


@dataclass
class Deep:
    x: Any


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_type_that_refers_to_itself_compiles_and_loads() -> None:
    check_args_type(Tree)
    tree = load_args(Tree, {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]})
    assert tree == Tree("a", [Tree("b", [Tree("c")])])
    assert refused(Tree, {"name": "a", "kids": [{"name": "b", "kids": [{"name": 1}]}]}).field == "kids[0].kids[0].name"


def test_nesting_deeper_than_32_is_refused() -> None:
    load_args(Deep, {"x": nested(31)})  # the args object and 31 lists: 32 levels
    dump_args(Deep(nested(31)))
    e = refused(Deep, {"x": nested(32)})
    assert "deeper than 32 levels" in str(e) and e.field.startswith("x[0][0]")
    assert "deeper than 32" in str(dump_refused(Deep(nested(32))))
    with pytest.raises(ArgsError, match="deeper than 32"):
        load_args(Deep, {"x": nested(200_000)})  # no RecursionError


def test_a_cycle_in_dumped_values_hits_the_depth_bound() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert "deeper than 32" in str(dump_refused(Deep(loop)))
    node = Tree("a")
    node.kids.append(node)
    assert "deeper than 32" in str(dump_refused(node))


def test_more_than_10000_values_are_refused() -> None:
    load_args(Deep, {"x": list(range(9_999))})  # 9,999 items and the member x: 10,000
    e = refused(Deep, {"x": list(range(10_000))})
    assert e.field == "" and "more than 10000 values" in str(e)
    assert "more than 10000" in str(dump_refused(Deep(list(range(10_000)))))
    assert "more than 10000" in str(refused(Deep, {"x": [{"k": [1, 2]} for _ in range(3_000)]}))


@dataclass
class Ping:
    kids: list[Ping | Pong]
    ping: int


@dataclass
class Pong:
    kids: list[Ping | Pong]
    pong: int


def test_unions_retrying_nested_values_stop_at_the_step_bound() -> None:
    hostile: dict[str, Any] = {"kids": []}
    for _ in range(14):  # every level is tried as a Ping and as a Pong, each failing after its kids
        hostile = {"kids": [hostile]}
    started = time.monotonic()
    with pytest.raises(ArgsError, match="steps"):
        load_args(Ping, {"kids": [hostile], "ping": 1})
    assert time.monotonic() - started < 5
    fine: dict[str, Any] = {"kids": [], "pong": 1}
    for _ in range(14):
        fine = {"kids": [fine], "ping": 1}
    assert isinstance(load_args(Ping, fine), Ping)


def test_json_that_is_not_json_is_refused() -> None:
    assert refused(Deep, {"x": {1: 2}}).field == "x"
    assert refused(Deep, {"x": [float("nan")]}).field == "x[0]"
    assert refused(Deep, {"x": (1, 2)}).field == "x"
    assert str(refused(Deep, None)) == "args field 'x' is required"  # None counts as {}


# -- check_args_type ---------------------------------------------------------------------------
@dataclass
class HasSet:
    ids: set[int]


@dataclass
class HasDeepSet:
    item: Item
    ids: list[dict[str, set[int]]]


@dataclass
class HasDangling:
    other: NoSuchType  # type: ignore[name-defined]  # noqa: F821


class Plain:
    x: int


class Shade(enum.Enum):
    DARK = (1, 2)


@pytest.mark.parametrize(("tp", "message"), [
    (HasSet, r"HasSet\.ids: set\[int\] is not a supported args type"),
    (HasDeepSet, r"HasDeepSet\.ids\[\]\[\]: set\[int\] is not a supported"),
    (HasDangling, r"HasDangling: cannot resolve its annotations: NameError"),
    (Plain, "must be a @dataclass class or a TypedDict class, not Plain"),
    (int, "not int"), (dict, "not dict"), (Item("a"), "not Item"), (None, "not None"),
])
def test_check_args_type_refuses(tp: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        check_args_type(tp)


@pytest.mark.parametrize(("annotation", "message"), [
    (list, r"a bare list needs its item type: list\[X\]"), (dict[int, str], "keys are str"),
    (tuple[int, str], r"only tuple\[X, \.\.\.\]"), (Literal[1.5], "Literal values must be"),
    (Shade, "Shade.DARK"), (bytes, "bytes is not a supported"), (Plain, "Plain is not a supported"),
    (frozenset[str], "frozenset"), (Optional[complex], "complex"),
])
def test_check_args_type_refuses_a_field(annotation: Any, message: str) -> None:
    tp = dataclasses.make_dataclass("Bad", [("f", annotation)])
    with pytest.raises(TypeError, match=message):
        check_args_type(tp)


def test_init_var_is_refused_and_init_false_fields_are_not_args() -> None:
    @dataclass
    class Computed:
        n: int
        double: int = field(init=False)

        def __post_init__(self) -> None:
            self.double = 2 * self.n

    assert load_args(Computed, {"n": 2}).double == 4
    assert dump_args(Computed(2)) == {"n": 2}
    assert refused(Computed, {"n": 2, "double": 4}).field == "double"
    tp = dataclasses.make_dataclass("WithInit", [("f", dataclasses.InitVar[int])])
    with pytest.raises(TypeError, match="InitVar"):
        check_args_type(tp)


def test_string_annotations_are_resolved() -> None:
    assert Order.__annotations__["items"] == "list[Item]"  # from __future__ import annotations
    check_args_type(Order)
    check_args_type(Everything)
    assert load_args(Order, {"order_id": 1, "items": [{"sku": "z"}]}).items == [Item("z")]


# -- property: dump, JSON, load is the identity -----------------------------------------------
@dataclass
class Sample:
    n: int
    x: float
    s: str
    flags: list[bool]
    tags: tuple[str, ...]
    scores: dict[str, list[int]]
    when: datetime
    day: date
    uid: UUID
    color: Color
    money: Decimal
    choice: Literal["a", "b"]
    item: Item | None
    meta: Meta
    blob: Any


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=20)
_offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
_samples = st.builds(
    Sample,
    n=st.integers(), x=st.floats(allow_nan=False, allow_infinity=False), s=st.text(),
    flags=st.lists(st.booleans()), tags=st.lists(st.text()).map(tuple),
    scores=st.dictionaries(st.text(), st.lists(st.integers())),
    when=st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=_offsets),
    day=st.dates(), uid=st.uuids(), color=st.sampled_from(Color),
    money=st.decimals(allow_nan=False, allow_infinity=False), choice=st.sampled_from(["a", "b"]),
    item=st.none() | st.builds(Item, sku=st.text(), qty=st.integers()),
    meta=st.fixed_dictionaries({}, optional={"source": st.text(), "tries": st.integers()}),
    blob=_json,
)


@settings(max_examples=200, deadline=None)
@given(_samples)
def test_dump_then_json_then_load_gives_the_value_back(value: Sample) -> None:
    assert load_args(Sample, json.loads(json.dumps(dump_args(value)))) == value


@settings(max_examples=100, deadline=None)
@given(st.builds(Tree, name=st.text(max_size=3),
                 kids=st.lists(st.builds(Tree, name=st.text(max_size=3)), max_size=3)))
def test_a_recursive_type_round_trips(value: Tree) -> None:
    assert load_args(Tree, json.loads(json.dumps(dump_args(value)))) == value
