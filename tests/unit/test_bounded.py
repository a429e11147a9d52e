"""Unit tier: the bounded parser every entry point uses (no database)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard import bounded
from switchboard.bounded import BadInput


def test_deep_json_is_bad_input_not_recursion_error() -> None:
    for depth in (65, 1_000, 100_000):
        with pytest.raises(BadInput) as e:
            bounded.loads("[" * depth + "]" * depth, max_bytes=10**6)
        assert e.value.reason == "too_deep"


def test_depth_at_the_bound_passes() -> None:
    doc = "[" * 64 + "]" * 64
    assert bounded.json_depth_exceeds(bounded.loads(doc, max_bytes=1000), 64) is False


def test_size_and_constants() -> None:
    with pytest.raises(BadInput) as e:
        bounded.loads("[" + "1," * 100 + "1]", max_bytes=50)
    assert e.value.reason == "too_large"
    for doc in ("NaN", "[Infinity]", "{\"a\": -Infinity}", "{", "\"\\ud800"):
        with pytest.raises(BadInput):
            bounded.loads(doc, max_bytes=100)


@pytest.mark.parametrize("value", ["²", "١٢", "1e3", " 1", "", "9223372036854775808",
                                   True, 1.5, float("nan"), float("inf"), None, [1], 2**63])
def test_bigint_refuses(value: object) -> None:
    with pytest.raises(BadInput):
        bounded.bigint(value)


@pytest.mark.parametrize("value,expected", [("0", 0), ("-5", -5), (7, 7), (3.0, 3),
                                            ("9223372036854775807", 2**63 - 1)])
def test_bigint_accepts(value: object, expected: int) -> None:
    assert bounded.bigint(value) == expected


def test_escape_makes_one_line() -> None:
    out = bounded.escape("GET /x\r\n127.0.0.1 - \"forged\" 200\u2028", 1000)
    assert "\n" not in out and "\r" not in out and "\u2028" not in out
    assert out.startswith("GET /x\\x0d\\x0a")
    assert bounded.escape("a" * 300, 10) == "a" * 10 + "…"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
                    max_leaves=30))
def test_round_trip_of_valid_documents(value: object) -> None:
    doc = json.dumps(value)
    assert bounded.loads(doc, max_bytes=len(doc), max_depth=1000) == value
