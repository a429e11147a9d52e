"""Cron in PL/pgSQL (db/functions/10_cron.sql), checked against real Postgres.

Oracles:
- croniter 7.0.0, in UTC, on every expression where it follows Vixie's rules.
  It does not on these, which are excluded from its oracle and tested against
  our own brute-force Vixie implementation and by explicit examples:
  * a day field that starts with `*` (`*/2`): croniter counts it as
    restricted and ORs it with the other day field; Vixie ANDs.
  * day-of-week `a/n` and ranges starting at 7 (`7-7`, `7/1`): croniter ends
    `a/n` at 6 and misreads ranges from 7; Vixie's day-of-week runs 0-7.
  * one-value ranges (`5-5`, `0-0/5`): croniter reads them as `*`.
  * a restricted day field whose values cover the whole range (`0-6`, `1,*/2`
    with `2-31/2`): croniter reads it as `*` and drops the OR rule.
- `vixie_next` below: a deliberately plain implementation (sets of values,
  day-by-day walk) of Vixie's rules.
- `zone_next` below: the time-zone rule written as a walk over UTC minutes
  (a wall time fires at the first instant whose wall clock reaches it), with
  Python's zoneinfo.
"""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pgtap import function_privs_are, has_function, results_eq, throws_ok

RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
HYP = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron_next(conn: psycopg.Connection, expr: str, after: datetime, tz: str = "UTC") -> datetime:
    return conn.execute("SELECT switchboard.cron_next(%s, %s, %s)", (expr, after, tz)).fetchone()[0]


def fires(conn: psycopg.Connection, expr: str, after: datetime, n: int, tz: str = "UTC") -> list[datetime]:
    out = []
    for _ in range(n):
        after = cron_next(conn, expr, after, tz)
        out.append(after)
    return out


# --- the Vixie oracle --------------------------------------------------------

def _value(text: str, idx: int) -> int:
    if text.isdigit():
        return int(text)
    names = MONTHS if idx == 3 else DAYS if idx == 4 else []
    offset = 1 if idx == 3 else 0
    return names.index(text.lower()) + offset


def vixie_field(text: str, idx: int) -> set[int]:
    lo, hi = RANGES[idx]
    out: set[int] = set()
    for item in text.split(","):
        rng, slash, step = item.partition("/")
        n = int(step) if slash else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (_value(x, idx) for x in rng.split("-"))
        else:
            a = _value(rng, idx)
            b = hi if slash else a
        assert lo <= a <= b <= hi and n >= 1, (text, idx)
        out |= set(range(a, b + 1, n))
    return {v % 7 for v in out} if idx == 4 else out


def vixie_next(expr: str, after: datetime, years: int = 60) -> datetime | None:
    fields = MACROS.get(expr.strip().lower(), expr).split()
    mins, hrs, doms, mons, dows = (sorted(vixie_field(f, i)) for i, f in enumerate(fields))
    anded = fields[2].startswith("*") or fields[4].startswith("*")
    start = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    day = start.date()
    for _ in range(366 * years):
        if day.month in mons:
            dm, wm = day.day in doms, day.isoweekday() % 7 in dows
            if (dm and wm) if anded else (dm or wm):
                for h in hrs:
                    for m in mins:
                        cand = datetime(day.year, day.month, day.day, h, m, tzinfo=UTC)
                        if cand >= start:
                            return cand
        day += timedelta(days=1)
    return None


def croniter_next(expr: str, after: datetime) -> datetime | None:
    try:
        return croniter(expr, after).get_next(datetime)
    except CroniterBadDateError:
        return None


# --- expression strategies ---------------------------------------------------

@st.composite
def value_text(draw, idx: int, lo: int, hi: int) -> str:
    v = draw(st.integers(lo, hi))
    if idx in (3, 4) and draw(st.booleans()) and not (idx == 4 and v == 7):
        name = MONTHS[v - 1] if idx == 3 else DAYS[v]
        return draw(st.sampled_from([name, name.upper(), name.capitalize()]))
    return str(v)


@st.composite
def item_text(draw, idx: int, croniter_safe: bool) -> str:
    lo, hi = RANGES[idx]
    kind = draw(st.sampled_from(["value", "range", "star_step", "range_step", "start_step"]))
    n = draw(st.integers(1, hi - lo + 1))
    if kind == "value":
        return draw(value_text(idx, lo, hi))
    if kind == "star_step":
        return f"*/{n}"
    a = draw(st.integers(lo, hi))
    if croniter_safe and idx == 4 and (a == 7 or kind == "start_step"):
        a = min(a, 6)
        kind = "range" if kind == "start_step" else kind
    if kind == "start_step":
        return f"{draw(value_text(idx, a, a))}/{n}"
    if croniter_safe:
        a = min(a, hi - 1 if idx != 4 else 5)
    b = draw(st.integers(a + 1 if croniter_safe else a, hi))
    rng = f"{draw(value_text(idx, a, a))}-{draw(value_text(idx, b, b))}"
    return rng if kind == "range" else f"{rng}/{n}"


@st.composite
def field_text(draw, idx: int, croniter_safe: bool = False) -> str:
    if draw(st.integers(0, 3)) == 0:
        return "*"
    items = draw(st.lists(item_text(idx, croniter_safe), min_size=1, max_size=3))
    return ",".join(items)


@st.composite
def croniter_expr(draw) -> str:
    """Expressions on which croniter follows Vixie's day rules."""
    f = [draw(field_text(i, croniter_safe=True)) for i in range(5)]
    dom, dow = f[2], f[4]
    assume(dom == "*" or dow == "*" or not (dom.startswith("*") or dow.startswith("*")))
    if dom != "*" and dow != "*":
        # croniter reads a day field that covers its whole range as `*`
        assume(len(vixie_field(dom, 2)) < 31 and len(vixie_field(dow, 4)) < 7)
    return " ".join(f)


@st.composite
def star_day_expr(draw) -> str:
    """Both day fields restricted, at least one starting with `*`: the AND rule."""
    f = [draw(field_text(i)) for i in range(5)]
    step_dom = draw(st.booleans())
    star = f"*/{draw(st.integers(2, 15 if step_dom else 6))}"
    if step_dom:
        f[2] = star
        f[4] = draw(field_text(4).filter(lambda t: t != "*"))
    else:
        f[4] = star
        f[2] = draw(field_text(2).filter(lambda t: t != "*"))
    return " ".join(f)


instants = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2090, 12, 31),
                        timezones=st.just(UTC))


# --- shape -------------------------------------------------------------------

def test_functions_exist(conn: psycopg.Connection) -> None:
    has_function(conn, "cron_next", ["text", "timestamp with time zone", "text"])
    has_function(conn, "cron_validate", ["text", "text"])
    has_function(conn, "_cron_parse", ["text"])
    has_function(conn, "_cron_field", ["text", "integer", "text"])
    has_function(conn, "_every_interval", ["text"])
    row = conn.execute(
        """SELECT provolatile, proparallel, proisstrict FROM pg_proc
            WHERE oid = 'switchboard.cron_next(text, timestamptz, text)'::regprocedure""").fetchone()
    assert row == ("s", "s", True)


def test_parse_gives_bitmasks(conn: psycopg.Connection) -> None:
    results_eq(conn, "SELECT switchboard._cron_parse('*/15 9-17 * JAN,jul MON-FRI')",
               [([1 | 1 << 15 | 1 << 30 | 1 << 45, sum(1 << h for h in range(9, 18)),
                  (1 << 32) - 2, 1 << 1 | 1 << 7, 0b0111110, 1],)])
    # 7 is Sunday; 0-7 is every day; the OR rule when neither day field starts with *
    results_eq(conn, "SELECT switchboard._cron_parse('0 0 1 * 7')", [([1, 1, 2, 8190, 1, 0],)])
    results_eq(conn, "SELECT switchboard._cron_parse('0 0 1 * 0-7')", [([1, 1, 2, 8190, 127, 0],)])


# --- property tests: UTC -------------------------------------------------------

@settings(max_examples=300, **HYP)
@given(expr=croniter_expr(), after=instants)
def test_agrees_with_croniter_and_vixie(conn: psycopg.Connection, expr: str, after: datetime) -> None:
    expected = vixie_next(expr, after)
    if expected is None:
        throws_ok(conn, "SELECT switchboard.cron_next(%s, %s)", "22023", (expr, after),
                  match="never fires")
        return
    got = fires(conn, expr, after, 3)
    oracle = [expected]
    for _ in range(2):
        oracle.append(vixie_next(expr, oracle[-1]))
    assert got == oracle, expr
    assert got[0] == croniter_next(expr, after), expr
    assert got[1] == croniter_next(expr, got[0]), expr


@settings(max_examples=150, **HYP)
@given(expr=star_day_expr(), after=instants)
def test_star_day_fields_and_rule(conn: psycopg.Connection, expr: str, after: datetime) -> None:
    expected = vixie_next(expr, after)
    if expected is None:
        throws_ok(conn, "SELECT switchboard.cron_next(%s, %s)", "22023", (expr, after),
                  match="never fires")
        return
    got = fires(conn, expr, after, 2)
    assert got == [expected, vixie_next(expr, expected)], expr


@settings(max_examples=100, **HYP)
@given(fields=st.tuples(*(field_text(i) for i in range(5))), after=instants)
def test_any_expression_matches_vixie_oracle(conn: psycopg.Connection, fields: tuple[str, ...],
                                             after: datetime) -> None:
    expr = "  ".join(fields)                          # runs of blanks are one separator
    expected = vixie_next(expr, after)
    if expected is None:
        throws_ok(conn, "SELECT switchboard.cron_next(%s, %s)", "22023", (expr, after),
                  match="never fires")
    else:
        assert cron_next(conn, expr, after) == expected, expr


def test_vixie_day_rule_examples(conn: psycopg.Connection) -> None:
    wed = utc(2025, 1, 1)                              # a Wednesday
    # */2 counts as unrestricted: odd days that are Mondays (croniter ORs them)
    assert fires(conn, "0 0 */2 * 1", wed, 3) == [utc(2025, 1, 13), utc(2025, 1, 27), utc(2025, 2, 3)]
    assert croniter_next("0 0 */2 * 1", wed) == utc(2025, 1, 3)     # croniter's OR, not ours
    # both restricted without *: either matches
    assert fires(conn, "0 0 1 * 1", wed, 3) == [utc(2025, 1, 6), utc(2025, 1, 13), utc(2025, 1, 20)]
    assert cron_next(conn, "0 0 1,15 * MON", utc(2025, 1, 27)) == utc(2025, 2, 1)
    # a day-of-week */n is unrestricted too: the 1st when it is a Sunday
    assert cron_next(conn, "0 0 1 * */7", wed) == utc(2025, 6, 1)
    # a list that starts with a value is restricted even if it holds */n
    assert cron_next(conn, "0 0 1,*/10 * 1", wed) == utc(2025, 1, 6)


def test_day_of_week_runs_to_seven(conn: psycopg.Connection) -> None:
    wed = utc(2025, 1, 1)
    # a/n ends at 7 (Vixie's last day-of-week), so 1/2 is Mon, Wed, Fri and Sun
    days = [d.strftime("%a") for d in fires(conn, "0 0 * * 1/2", wed, 4)]
    assert days == ["Fri", "Sun", "Mon", "Wed"]
    assert [d.strftime("%a") for d in fires(conn, "0 0 * * 7-7", wed, 2)] == ["Sun", "Sun"]
    assert [d.strftime("%a") for d in fires(conn, "0 0 * * 5-7", wed, 3)] == ["Fri", "Sat", "Sun"]
    assert [d.strftime("%a") for d in fires(conn, "0 0 * * */3", wed, 3)] == ["Sat", "Sun", "Wed"]


def test_one_value_ranges(conn: psycopg.Connection) -> None:
    # croniter reads a-a as *; Vixie (and we) read it as the one value
    assert croniter_next("5-5 * * * *", utc(2000, 1, 1)) == utc(2000, 1, 1, 0, 1)
    assert fires(conn, "5-5 * * * *", utc(2000, 1, 1), 2) == [utc(2000, 1, 1, 0, 5), utc(2000, 1, 1, 1, 5)]
    assert fires(conn, "0-0/5 3-3 * * *", utc(2000, 1, 1), 2) == [utc(2000, 1, 1, 3), utc(2000, 1, 2, 3)]


def test_full_range_day_field_keeps_or_rule(conn: psycopg.Connection) -> None:
    # Vixie: the text does not start with *, so the OR rule holds and 0-6
    # matches every day; croniter treats 0-6 as * and keeps only the odd days
    assert croniter_next("0 0 1,*/2 * 0-6", utc(2000, 1, 1, 12)) == utc(2000, 1, 3)
    assert fires(conn, "0 0 1,*/2 * 0-6", utc(2000, 1, 1, 12), 2) == [utc(2000, 1, 2), utc(2000, 1, 3)]


def test_infinite_after(conn: psycopg.Connection) -> None:
    throws_ok(conn, "SELECT switchboard.cron_next('@daily', 'infinity')", "22023", match="finite")


def test_strictly_after(conn: psycopg.Connection) -> None:
    assert cron_next(conn, "*/5 * * * *", utc(2025, 1, 1, 10, 5)) == utc(2025, 1, 1, 10, 10)
    assert cron_next(conn, "*/5 * * * *", utc(2025, 1, 1, 10, 4, 59, 999999)) == utc(2025, 1, 1, 10, 5)
    assert cron_next(conn, "* * * * *", utc(2025, 12, 31, 23, 59, 30)) == utc(2026, 1, 1)


# --- time zones --------------------------------------------------------------

@functools.cache
def transitions(tz: str, year: int = 2025) -> list[datetime]:
    zi = ZoneInfo(tz)
    out, t = [], utc(year, 1, 1)
    while t.year == year:
        if (t + timedelta(minutes=15)).astimezone(zi).utcoffset() != t.astimezone(zi).utcoffset():
            out.append(t + timedelta(minutes=15))
        t += timedelta(minutes=15)
    return out


def zone_next(expr: str, after: datetime, tz: str) -> datetime:
    """Walk UTC minutes; a wall time fires at the first instant whose wall clock reaches it."""
    zi = ZoneInfo(tz)
    fields = expr.split()
    mins, hrs = vixie_field(fields[0], 0), vixie_field(fields[1], 1)
    assert fields[2:] == ["*", "*", "*"]

    def wall(t: datetime) -> datetime:
        return t.astimezone(zi).replace(tzinfo=None)

    t = after.replace(second=0, microsecond=0) - timedelta(hours=4)
    reached = wall(t)                                  # the latest wall time seen so far
    for _ in range(4 * 24 * 60):
        t += timedelta(minutes=1)
        w = wall(t)
        if w <= reached:
            continue                                   # clocks went back: seen already
        fire, m = False, reached + timedelta(minutes=1)
        while m <= w:                                  # normally one; several across a gap
            fire = fire or (m.minute in mins and m.hour in hrs)
            m += timedelta(minutes=1)
        reached = w
        if fire and t > after:
            return t
    raise AssertionError("no fire time within 4 days")


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


@settings(max_examples=200, **HYP)
@given(tz=st.sampled_from(ZONES), which=st.integers(0, 1),
       offset=st.integers(-26 * 60, 26 * 60), seconds=st.integers(0, 59),
       minute=field_text(0), hour=field_text(1))
def test_dst_rule_against_zoneinfo(conn: psycopg.Connection, tz: str, which: int, offset: int,
                                   seconds: int, minute: str, hour: str) -> None:
    expr = f"{minute} {hour} * * *"
    after = transitions(tz)[which] + timedelta(minutes=offset, seconds=seconds)
    got = fires(conn, expr, after, 3, tz)
    expected = [zone_next(expr, after, tz)]
    for _ in range(2):
        expected.append(zone_next(expr, expected[-1], tz))
    assert got == expected, (expr, tz, after)


def test_berlin_spring_forward(conn: psycopg.Connection) -> None:
    # 2025-03-30 02:00 CET -> 03:00 CEST at 01:00 UTC: 02:30 does not exist that day
    assert fires(conn, "30 2 * * *", utc(2025, 3, 29, 12), 3, "Europe/Berlin") == [
        utc(2025, 3, 30, 1, 0),            # the jump itself: 03:00 CEST
        utc(2025, 3, 31, 0, 30),           # 02:30 CEST, normal again
        utc(2025, 4, 1, 0, 30),
    ]
    # every wall-clock quarter hour in the gap collapses into one fire at the jump
    assert fires(conn, "*/15 * * * *", utc(2025, 3, 30, 0, 50), 3, "Europe/Berlin") == [
        utc(2025, 3, 30, 1, 0), utc(2025, 3, 30, 1, 15), utc(2025, 3, 30, 1, 30)]
    # hourly: 02:00 is skipped, fires at the jump, and 03:00 is not a second fire
    assert fires(conn, "0 * * * *", utc(2025, 3, 29, 23, 30), 3, "Europe/Berlin") == [
        utc(2025, 3, 30, 0), utc(2025, 3, 30, 1), utc(2025, 3, 30, 2)]


def test_berlin_fall_back(conn: psycopg.Connection) -> None:
    # 2025-10-26 03:00 CEST -> 02:00 CET at 01:00 UTC: 02:30 happens twice
    assert fires(conn, "30 2 * * *", utc(2025, 10, 25, 12), 2, "Europe/Berlin") == [
        utc(2025, 10, 26, 0, 30),          # 02:30 CEST, the first occurrence
        utc(2025, 10, 27, 1, 30),          # not 01:30 UTC (02:30 CET, the repeat)
    ]


def test_new_york_spring_forward(conn: psycopg.Connection) -> None:
    # 2025-03-09 02:00 EST -> 03:00 EDT at 07:00 UTC
    assert fires(conn, "30 2 * * *", utc(2025, 3, 8, 12), 3, "America/New_York") == [
        utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30), utc(2025, 3, 11, 6, 30)]


def test_new_york_fall_back(conn: psycopg.Connection) -> None:
    # 2025-11-02 02:00 EDT -> 01:00 EST at 06:00 UTC: 01:00-01:59 happen twice
    first = utc(2025, 11, 2, 5, 30)                    # 01:30 EDT
    assert cron_next(conn, "30 1 * * *", utc(2025, 11, 2, 4), "America/New_York") == first
    # from the first occurrence the next fire is tomorrow's, not 06:30 UTC (01:30 EST)
    assert cron_next(conn, "30 1 * * *", first, "America/New_York") == utc(2025, 11, 3, 6, 30)
    # asked during the repeated hour (01:10 EST), 01:30 has already fired
    assert cron_next(conn, "30 1 * * *", utc(2025, 11, 2, 6, 10), "America/New_York") == utc(2025, 11, 3, 6, 30)
    # Hourly fires once per wall-clock hour: 01:00 fires at its first occurrence
    # (05:00 UTC) only, so there are two real hours between 01:00 EDT and
    # 02:00 EST. That is the "a repeated local time fires once" rule applied to
    # every wall time; a fixed-rate schedule should use @every 1 hour instead.
    assert fires(conn, "0 * * * *", utc(2025, 11, 2, 3, 30), 4, "America/New_York") == [
        utc(2025, 11, 2, 4), utc(2025, 11, 2, 5), utc(2025, 11, 2, 7), utc(2025, 11, 2, 8)]
    assert fires(conn, "@every 1 hour", utc(2025, 11, 2, 4), 3, "America/New_York") == [
        utc(2025, 11, 2, 5), utc(2025, 11, 2, 6), utc(2025, 11, 2, 7)]


def test_half_hour_shift(conn: psycopg.Connection) -> None:
    # Lord Howe: 2025-10-05 02:00 +10:30 -> 02:30 +11 at 15:30 UTC the day before
    assert fires(conn, "15 2 * * *", utc(2025, 10, 4, 3), 2, "Australia/Lord_Howe") == [
        utc(2025, 10, 4, 15, 30), utc(2025, 10, 5, 15, 15)]


def test_zone_local_fields(conn: psycopg.Connection) -> None:
    # 09:00 on weekdays in Tokyo (UTC+9, no DST) is 00:00 UTC
    assert fires(conn, "0 9 * * MON-FRI", utc(2025, 1, 3, 1), 2, "Asia/Tokyo") == [
        utc(2025, 1, 6, 0), utc(2025, 1, 7, 0)]
    # day fields are local too: Friday 23:30 in New York is Saturday in UTC
    assert cron_next(conn, "30 23 * * FRI", utc(2025, 1, 1), "America/New_York") == utc(2025, 1, 4, 4, 30)
    # UTC aliases take the fast path and agree with the general one
    for alias in ["Etc/UTC", "utc", "GMT", "Europe/London"]:
        assert cron_next(conn, "17 3 * * *", utc(2025, 1, 1), alias) == utc(2025, 1, 1, 3, 17)


# --- macros, names, @every ---------------------------------------------------

def test_macros(conn: psycopg.Connection) -> None:
    after = utc(2025, 5, 14, 10, 20)                   # a Wednesday
    assert cron_next(conn, "@hourly", after) == utc(2025, 5, 14, 11)
    assert cron_next(conn, "@daily", after) == utc(2025, 5, 15)
    assert cron_next(conn, "@midnight", after) == utc(2025, 5, 15)
    assert cron_next(conn, "@weekly", after) == utc(2025, 5, 18)
    assert cron_next(conn, "@monthly", after) == utc(2025, 6, 1)
    assert cron_next(conn, "@yearly", after) == utc(2026, 1, 1)
    assert cron_next(conn, " @ANNUALLY ", after) == utc(2026, 1, 1)
    for macro, expr in MACROS.items():
        results_eq(conn, "SELECT switchboard._cron_parse(%s) = switchboard._cron_parse(%s)",
                   [(True,)], (macro, expr))


def test_names(conn: psycopg.Connection) -> None:
    assert fires(conn, "0 9 * JAN-MAR MON-FRI", utc(2025, 3, 28, 10), 2) == [
        utc(2025, 3, 31, 9), utc(2026, 1, 1, 9)]
    assert cron_next(conn, "0 9 * jan-mar mon-fri", utc(2025, 3, 28, 10)) == utc(2025, 3, 31, 9)
    assert cron_next(conn, "0 0 * * 7", utc(2025, 1, 1)) == utc(2025, 1, 5)      # Sunday
    assert cron_next(conn, "0 0 * * SUN", utc(2025, 1, 1)) == utc(2025, 1, 5)
    assert cron_next(conn, "0 0 1 Feb,aug *", utc(2025, 3, 1)) == utc(2025, 8, 1)


def test_leap_day(conn: psycopg.Connection) -> None:
    assert fires(conn, "0 0 29 2 *", utc(2025, 3, 1), 3) == [
        utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]
    assert cron_next(conn, "0 0 29 2 *", utc(2096, 3, 1)) == utc(2104, 2, 29)   # 2100 is not leap


def test_every(conn: psycopg.Connection) -> None:
    after = utc(2025, 1, 1, 12, 0, 0, 250000)
    assert cron_next(conn, "@every 90 seconds", after) == after + timedelta(seconds=90)
    assert cron_next(conn, "@every 90s", after) == after + timedelta(seconds=90)
    assert cron_next(conn, "@every 1 second", after) == after + timedelta(seconds=1)
    assert cron_next(conn, "@every 1:30", after) == after + timedelta(hours=1, minutes=30)
    # a day is 24 hours, even across a DST change in the session's zone
    conn.execute("SET LOCAL TimeZone = 'Europe/Berlin'")
    assert cron_next(conn, "@every 1 day", utc(2025, 3, 29, 12)) == utc(2025, 3, 30, 12)
    results_eq(conn, "SELECT switchboard._every_interval('@every 5 minutes'), "
                     "switchboard._every_interval('*/5 * * * *'), switchboard._every_interval('@hourly')",
               [(timedelta(minutes=5), None, None)])


def test_null_schedule(conn: psycopg.Connection) -> None:
    results_eq(conn, "SELECT switchboard.cron_next(NULL, now()), switchboard._every_interval(NULL)",
               [(None, None)])
    conn.execute("SELECT switchboard.cron_validate(NULL, 'UTC')")      # trigger-only: valid


# --- errors ------------------------------------------------------------------

@pytest.mark.parametrize(("expr", "match"), [
    ("61 * * * *", 'invalid cron minute field "61" in "61 * * * *"'),
    ("* 24 * * *", 'invalid cron hour field "24"'),
    ("* * 0 * *", 'invalid cron day-of-month field "0"'),
    ("* * * 13 *", 'invalid cron month field "13"'),
    ("* * * * 8", 'invalid cron day-of-week field "8"'),
    ("* * * * *", None),
    ("* * * *", "expected 5 fields, got 4"),
    ("* * * * * *", "expected 5 fields, got 6"),
    ("", "expected 5 fields, got 0"),
    ("a b c d e", 'invalid cron minute field "a"'),
    ("5-1 * * * *", 'invalid cron minute field "5-1"'),
    ("*/0 * * * *", 'invalid cron minute field "*/0"'),
    ("1-2-3 * * * *", 'invalid cron minute field "1-2-3"'),
    ("1,,2 * * * *", 'invalid cron minute field "1,,2"'),
    ("* * * * FRI-MON", 'invalid cron day-of-week field "FRI-MON"'),
    ("* * * JANUARY *", 'invalid cron month field "JANUARY"'),
    ("* * * * JAN", 'invalid cron day-of-week field "JAN"'),
    ("* * L * *", 'invalid cron day-of-month field "L"'),
    ("@fortnightly", 'unknown cron macro "@fortnightly"'),
    ("@everyday", 'unknown cron macro "@everyday"'),
    ("@every -1 second", "must be positive"),
    ("@every 0 seconds", "must be positive"),
    ("@every 1 month", "months and years have no fixed length"),
    ("@every 1 year 2 days", "months and years have no fixed length"),
    ("@every", "no interval"),
    ("0 0 30 2 *", 'cron expression "0 0 30 2 *" never fires'),
    ("0 0 31 4 *", "never fires"),
    ("0 0 31 11 *", "never fires"),
    ("0 0 30,31 2 */2", "never fires"),
])
def test_invalid(conn: psycopg.Connection, expr: str, match: str | None) -> None:
    if match is None:                                  # the control: valid, so no error
        conn.execute("SELECT switchboard.cron_next(%s)", (expr,))
        conn.execute("SELECT switchboard.cron_validate(%s)", (expr,))
        return
    exc = throws_ok(conn, "SELECT switchboard.cron_next(%s, now())", "22023", (expr,), match=match)
    assert exc.diag.message_hint, f"no HINT for {expr!r}"
    throws_ok(conn, "SELECT switchboard.cron_validate(%s, 'UTC')", "22023", (expr,), match=match)


def test_field_errors_name_field_and_expression(conn: psycopg.Connection) -> None:
    exc = throws_ok(conn, "SELECT switchboard.cron_next(%s)", "22023", ("0 9 * * MON-FUN",),
                    match='invalid cron day-of-week field "MON-FUN" in "0 9 * * MON-FUN"')
    assert "SUN-SAT" in exc.diag.message_hint


def test_never_firing_or_rule_is_fine(conn: psycopg.Connection) -> None:
    # day 30 never occurs in February, but with both day fields restricted the
    # Mondays still fire
    assert cron_next(conn, "0 0 30 2 MON", utc(2025, 1, 1)) == utc(2025, 2, 3)


def test_unknown_zone(conn: psycopg.Connection) -> None:
    # cron_next keeps PostgreSQL's own 22023 (it may not open a subtransaction:
    # it is PARALLEL SAFE); cron_validate, the gate for stored tasks, adds the HINT
    throws_ok(conn, "SELECT switchboard.cron_next('* * * * *', now(), 'Mars/Olympus')", "22023",
              match="Mars/Olympus")
    exc = throws_ok(conn, "SELECT switchboard.cron_validate('* * * * *', 'Mars/Olympus')", "22023",
                    match='unknown time zone "Mars/Olympus"')
    assert "pg_timezone_names" in exc.diag.message_hint
    throws_ok(conn, "SELECT switchboard.cron_validate('@daily', NULL)", "22023", match="time zone")


def test_validate_every_text(conn: psycopg.Connection) -> None:
    exc = throws_ok(conn, "SELECT switchboard.cron_validate('@every banana')", "22023",
                    match='"banana" is not an interval')
    assert exc.diag.message_hint
    # cron_next itself leaves PostgreSQL's error in place (see above)
    throws_ok(conn, "SELECT switchboard.cron_next('@every banana')", "22007", match="banana")
    conn.execute("SELECT switchboard.cron_validate('@every 5 minutes', 'Europe/Berlin')")


# --- privileges ----------------------------------------------------------------

def test_privileges(conn: psycopg.Connection) -> None:
    for sig in ["switchboard.cron_next(text, timestamptz, text)", "switchboard.cron_validate(text, text)",
                "switchboard._cron_parse(text)", "switchboard._cron_field(text, integer, text)",
                "switchboard._every_interval(text)"]:
        function_privs_are(conn, sig, "switchboard_app", ["EXECUTE"])
        function_privs_are(conn, sig, "public", [])


def test_app_role_can_call(app_url: str) -> None:
    with psycopg.connect(app_url) as c:
        assert cron_next(c, "0 9 * * MON-FRI", utc(2025, 1, 3, 10), "Europe/Berlin") == utc(2025, 1, 6, 8)
        c.execute("SELECT switchboard.cron_validate('@every 1 minute', 'UTC')")


def test_role_without_grant_cannot_call(conn: psycopg.Connection) -> None:
    conn.execute("CREATE ROLE sb_cron_nobody")
    conn.execute("GRANT USAGE ON SCHEMA switchboard TO sb_cron_nobody")
    conn.execute("SET LOCAL ROLE sb_cron_nobody")
    throws_ok(conn, "SELECT switchboard.cron_next('* * * * *')", "42501", match="cron_next")


# --- speed ---------------------------------------------------------------------

def test_sparse_schedules_jump_rather_than_walk(conn: psycopg.Connection) -> None:
    """Minute-by-minute search would take seconds per call on these; field jumps take microseconds."""
    t0 = time.perf_counter()
    row = conn.execute(
        """SELECT count(switchboard.cron_next(e, timestamptz '2025-01-01' + i * interval '7 hours'))
             FROM generate_series(1, 500) i,
                  (VALUES ('0 0 29 2 *'), ('0 0 29 2 */3'), ('15 14 31 * *'), ('0 0 1 1 *')) v(e)""",
    ).fetchone()
    assert row == (2000,)
    assert time.perf_counter() - t0 < 10  # ~0.1 s here; a minute walk would take minutes
