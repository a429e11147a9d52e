"""How fast is switchboard.cron_next, next to croniter's get_next?

cron_next runs inside every scheduler claim, so its cost per call matters.
This starts a throwaway PostgreSQL, applies the real migrations to a fresh
database, and for each expression:

- PL/pgSQL: one statement that calls cron_next N times on instants 7 minutes
  apart (`SELECT count(cron_next(expr, t0 + i * 7 min)) FROM generate_series`),
  the schedule passed as a parameter so every call parses it, as a claim
  does. Best of --repeat runs, wall time of the statement / N.
- croniter: `croniter(expr, t).get_next(datetime)` on the same instants (it
  parses every time as well). Best of --repeat runs.

It also checks that both give the same answers on the first 200 instants.
Prints a table and writes bench/results/cron.json.

    python bench/cron_bench.py [--n 20000] [--croniter-n 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server"))

import psycopg
from croniter import croniter
from switchboard.migrate import migrate
from switchboard.pgtest import ThrowawayPostgres

T0 = datetime(2025, 1, 1, tzinfo=UTC)
STEP = timedelta(minutes=7)
CASES = [
    ("*/5 * * * *", "UTC"),
    ("0 9 * * MON-FRI", "UTC"),
    ("30 2 1,15 * *", "UTC"),
    ("0 0 29 2 *", "UTC"),
    ("@hourly", "UTC"),
    ("15 14 1 * *", "UTC"),
    ("0 9 * * MON-FRI", "Europe/Berlin"),
]
SQL = """SELECT count(switchboard.cron_next(e.expr, %(t0)s + i * interval '7 minutes', e.tz))
           FROM generate_series(1, %(n)s) i, (SELECT %(expr)s::text AS expr, %(tz)s::text AS tz) e"""
SAMPLE = """SELECT array_agg(switchboard.cron_next(%(expr)s, %(t0)s + i * interval '7 minutes', %(tz)s) ORDER BY i)
              FROM generate_series(1, 200) i"""


def time_pg(conn: psycopg.Connection, expr: str, tz: str, n: int, repeat: int) -> float:
    params = {"t0": T0, "n": n, "expr": expr, "tz": tz}
    conn.execute(SQL, {**params, "n": 100})                       # warm: plan, plpgsql compile
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        (count,) = conn.execute(SQL, params).fetchone()
        best = min(best, time.perf_counter() - start)
        assert count == n
    return best / n * 1e6


def time_croniter(expr: str, tz: str, n: int, repeat: int) -> float:
    zone = UTC if tz == "UTC" else ZoneInfo(tz)
    starts = [(T0 + i * STEP).astimezone(zone) for i in range(1, n + 1)]
    best = float("inf")
    for _ in range(repeat):
        begin = time.perf_counter()
        for t in starts:
            croniter(expr, t).get_next(datetime)
        best = min(best, time.perf_counter() - begin)
    return best / n * 1e6


def same_answers(conn: psycopg.Connection, expr: str, tz: str) -> bool:
    (got,) = conn.execute(SAMPLE, {"expr": expr, "t0": T0, "tz": tz}).fetchone()
    zone = UTC if tz == "UTC" else ZoneInfo(tz)
    want = [croniter(expr, (T0 + i * STEP).astimezone(zone)).get_next(datetime) for i in range(1, 201)]
    return got == want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="cron_next calls per expression")
    ap.add_argument("--croniter-n", type=int, default=3000, help="croniter calls per expression")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (best is kept)")
    args = ap.parse_args()

    pg = ThrowawayPostgres()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE cron_bench")
        url = pg.url("cron_bench")
        migrate(url)
        rows = []
        with psycopg.connect(url, autocommit=True) as conn:
            server = conn.execute("SHOW server_version").fetchone()[0]
            for expr, tz in CASES:
                pg_us = time_pg(conn, expr, tz, args.n, args.repeat)
                ci_us = time_croniter(expr, tz, args.croniter_n, args.repeat)
                rows.append({
                    "expr": expr, "timezone": tz,
                    "pg_us_per_call": round(pg_us, 2), "croniter_us_per_call": round(ci_us, 2),
                    "speedup": round(ci_us / pg_us, 1), "same_answers": same_answers(conn, expr, tz),
                })
    finally:
        pg.stop()

    print(f"PostgreSQL {server}, croniter {version('croniter')}, Python {platform.python_version()}; "
          f"{args.n} cron_next / {args.croniter_n} croniter calls per row, best of {args.repeat}")
    head = f"{'expression':<18} {'zone':<14} {'cron_next us':>12} {'croniter us':>12} {'speedup':>8}  same"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['expr']:<18} {r['timezone']:<14} {r['pg_us_per_call']:>12.2f} "
              f"{r['croniter_us_per_call']:>12.2f} {r['speedup']:>7.1f}x  {r['same_answers']}")

    out = ROOT / "bench" / "results" / "cron.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "cron_next vs croniter.get_next",
        "postgres": server, "croniter": version("croniter"), "python": platform.python_version(),
        "calls_per_row": {"cron_next": args.n, "croniter": args.croniter_n}, "repeat": args.repeat,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
