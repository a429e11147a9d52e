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


# -- issue 21 additions ---------------------------------------------------------------------
def test_numbers_that_overflow_to_infinity_are_refused() -> None:
    for doc in ("1e999", "[-1e400]", '{"a": 1E+999}'):
        with pytest.raises(BadInput) as e:
            bounded.loads(doc, max_bytes=100)
        assert e.value.reason == "bad_number"
    with pytest.raises(BadInput) as e:   # Python's int() digit limit
        bounded.loads("1" * 5000, max_bytes=10_000)
    assert e.value.reason == "malformed"


@pytest.mark.parametrize("value", ["a\nb", "a\x00", "\x1b[31m", "a\x7f"])
def test_text_refuses_control_characters(value: str) -> None:
    with pytest.raises(BadInput) as e:
        bounded.text(value, name="room", max_len=10)
    assert e.value.reason == "bad_text"


def test_text_bounds() -> None:
    assert bounded.text("lobby", name="room", max_len=10) == "lobby"
    with pytest.raises(BadInput):
        bounded.text("x" * 11, name="room", max_len=10)
    with pytest.raises(BadInput):
        bounded.text(5, name="room", max_len=10)
    with pytest.raises(BadInput):
        bounded.text("", name="room", max_len=10)


def test_fold_username_is_one_identity() -> None:
    assert bounded.fold_username("Alice") == bounded.fold_username("ALICE") == "alice"
    assert bounded.fold_username("\uff21\uff2c\uff29\uff23\uff25") == "alice"    # full-width
    assert bounded.fold_username("\u212aarl") == "karl"                          # Kelvin sign
    assert bounded.fold_username("\u00c9mile") == "\u00c9mile"   # non-ASCII case is not folded (names are ASCII)


def test_rejections_count_everything_and_log_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    counted: list[tuple[str, str]] = []
    now = [0.0]
    r = bounded.Rejections(lambda s, rs: counted.append((s, rs)), logging.getLogger("t.rej"), interval=60,
                           clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.rej"):
        for _ in range(100):
            r.record("ws", "too_deep", "x\ny")
        r.record("made-up source", "made-up reason", "")
        now[0] = 61.0
        r.record("ws", "too_deep", "again")
    assert len(counted) == 102 and ("other", "other") in counted
    lines = [m for m in caplog.messages if "too_deep" in m]
    assert len(lines) == 2 and "\n" not in lines[0] and "99 more" in lines[1]


def test_notify_rejections_log_one_line_per_interval_for_all_channels_and_reasons(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from switchboard.hints import RejectLog

    now = [0.0]
    r = RejectLog(logging.getLogger("t.notify"), interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.notify"):
        for i in range(50):
            r("switchboard_events" if i % 2 else "switchboard_control",
              bounded.BadInput("too_deep" if i % 3 else "bad_field", "no"), "x\ny")
        now[0] = 61.0
        r("switchboard_runs", bounded.BadInput("too_large", "big"), "z" * 500)
    lines = [m for m in caplog.messages if "refused a NOTIFY payload" in m]
    assert len(lines) == 2 and "\n" not in lines[0] and "; 0 more refused" in lines[0]
    assert "switchboard_runs (too_large: big; 49 more refused in the last 60 s)" in lines[1]
    assert len(lines[1]) < 300     # the payload is cut


@given(st.text(max_size=300))
def test_escape_never_leaves_a_line_break(text: str) -> None:
    out = bounded.escape(text, 100)
    assert "\n" not in out and "\r" not in out and len(out) <= 100 * 6 + 1
