#!/usr/bin/env python3
"""Issue 35, item 3: what a maintenance pass costs, Switchboard's own partition upkeep
against pg_partman's, on the same cluster in the same run.

    python bench/partman_ab.py [--calls 300] [--rounds 3]

Needs the Debian package postgresql-15-partman (pg_partman 4.7; a benchmark peer
only, never used by the product). One throwaway cluster, one database cloned from
the migrated template. Each side is called in its steady state, when every
partition it wants already exists (what almost every 10-second sweep meets):

- runs, Switchboard: ``switchboard.runs_partitions_ensure(3)`` (day partitions of
  task_runs_history, 3 days ahead);
- runs, pg_partman: ``partman.run_maintenance('public.pm_runs', false, false)`` on
  a table of task_runs_history's columns, ``PARTITION BY RANGE (finished_at)``,
  ``create_parent(... 'native', 'daily', p_premake => 3)``, retention 7 days;
- events, Switchboard: ``switchboard.events_partitions_ensure('5 minutes')``;
- events, pg_partman: the same on ``public.pm_events`` (events' columns,
  ``PARTITION BY RANGE (id)``, interval 10000 ids, premake 2).

Rounds alternate A B B A per pair; each call is timed on the client (one
autocommit statement on a warm connection). Reported: median and p95 µs per call
and the ratio Switchboard / pg_partman. Raw results: bench/results/partman_ab.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Cluster, loadavg, log, machine_info, pct, write_json

import psycopg

PARTMAN_SETUP = """
CREATE SCHEMA partman;
CREATE EXTENSION pg_partman SCHEMA partman;
CREATE TABLE public.pm_runs (LIKE switchboard.task_runs_history INCLUDING DEFAULTS)
    PARTITION BY RANGE (finished_at);
SELECT partman.create_parent('public.pm_runs', 'finished_at', 'native', 'daily', p_premake => 3);
UPDATE partman.part_config SET retention = '7 days', retention_keep_table = false
 WHERE parent_table = 'public.pm_runs';
CREATE TABLE public.pm_events (LIKE switchboard.events_default INCLUDING DEFAULTS)
    PARTITION BY RANGE (id);
SELECT partman.create_parent('public.pm_events', 'id', 'native', '10000', p_premake => 2);
"""

SIDES = {
    "runs": ("SELECT switchboard.runs_partitions_ensure(3)",
             "SELECT partman.run_maintenance('public.pm_runs', false, false)"),
    "events": ("SELECT switchboard.events_partitions_ensure('5 minutes')",
               "SELECT partman.run_maintenance('public.pm_events', false, false)"),
}


def timed(conn: psycopg.Connection[Any], sql: str, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        conn.execute(sql)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cluster = Cluster()
    try:
        db = cluster.new_db("sb_partman")
        url = cluster.url(db)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(PARTMAN_SETUP)
            partman_version = c.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'").fetchone()[0]  # type: ignore[index]
        res: dict[str, Any] = {"machine": machine_info(cluster), "calls": args.calls, "rounds": args.rounds,
                               "pg_partman": partman_version, "sides": {}}
        with psycopg.connect(url, autocommit=True) as conn:
            for table, (ours, theirs) in SIDES.items():
                for sql in (ours, theirs):      # warm-up: plans cached, anything missing created
                    timed(conn, sql, 20)
                samples: dict[str, list[float]] = {"switchboard": [], "pg_partman": []}
                for r in range(args.rounds):
                    order = [("switchboard", ours), ("pg_partman", theirs)]
                    for name, sql in order if r % 2 == 0 else order[::-1]:
                        samples[name] += timed(conn, sql, args.calls)
                row = {name: {"median_us": round(statistics.median(v), 1), "p95_us": round(pct(v, 95), 1)}
                       for name, v in samples.items()}
                row["ratio_median"] = round(row["switchboard"]["median_us"] / row["pg_partman"]["median_us"], 3)
                res["sides"][table] = row
                log(f"{table}: switchboard median {row['switchboard']['median_us']} µs "
                    f"(p95 {row['switchboard']['p95_us']}), pg_partman {row['pg_partman']['median_us']} µs "
                    f"(p95 {row['pg_partman']['p95_us']}): {row['ratio_median']}x  load {loadavg():.1f}")
        write_json(RESULTS / "partman_ab.json", res)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
