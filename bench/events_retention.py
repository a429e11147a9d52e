#!/usr/bin/env python3
"""Issue 35, item 2: events retention by dropping a partition against today's batched row DELETE.

    python bench/events_retention.py [--events 1000000] [--publishers 4] [--rounds 1]

One throwaway PostgreSQL (the suite's settings) migrated with the real migrations
(events partitioned by id, V0037); two clones of the template, the same N events in
each, in the same run:

- drop: the N events fill one partition exactly (event_partitioning.min_span = N, the
  partition created for them); reap_events('5 minutes', 10000) drops it whole.
- rows: the range partitions are detached, so the same N events land in
  events_default, where reap_events still deletes row by row in batches of 10000
  (the pre-V0037 statement, on a heap with the same five indexes): called until it
  returns less than 10000, as maintenance's handler does.

The rows are loaded with one INSERT ... SELECT (payload {"n": i}, ~40 bytes), ticked,
the tick aged past keep, VACUUM ANALYZE, CHECKPOINT. Measured: wall seconds of the
reap, WAL bytes (pg_current_wal_lsn before/after), dead tuples left
(pg_stat_user_tables after pg_stat_force_next_flush), and for the rows side the
VACUUM the dead tuples oblige (seconds, WAL). Then publish throughput while the reap
runs: P publisher connections call notify_user in autocommit for 3 s, the reap starts
at 1 s; each publish's latency is recorded: the longest publish (the stall) and the
publishes per second during the reap against before it.
Raw results: bench/results/events_retention.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Cluster, log, machine_info, write_json

import psycopg

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
BATCH = 10_000


def _detach_ranges(c: psycopg.Connection, only_empty: bool) -> None:
    last = c.execute("SELECT switchboard._event_id_allocated()").fetchone()[0]
    for (name,) in c.execute("SELECT partition_name FROM switchboard.event_partitions() WHERE NOT is_default "
                             "AND (NOT %s OR from_id > %s)", (only_empty, last)).fetchall():
        c.execute(f"ALTER TABLE switchboard.events DETACH PARTITION switchboard.{name}")
        c.execute(f"DROP TABLE switchboard.{name}")


def prepare(url: str, n: int, mode: str) -> str:
    """N events, ticked and aged past keep; returns a user id for the publishers."""
    with psycopg.connect(url, autocommit=True) as c:
        uid = c.execute("SELECT switchboard.create_user('bench', %s)", (ARGON,)).fetchone()[0]
        last = c.execute("SELECT switchboard._event_id_allocated()").fetchone()[0]
        if mode == "drop":
            _detach_ranges(c, only_empty=True)
            lo = last + 1
            c.execute(f"CREATE TABLE switchboard.events_p{lo} (LIKE switchboard.events INCLUDING DEFAULTS "
                      "INCLUDING CONSTRAINTS INCLUDING COMMENTS)")
            c.execute(f"ALTER TABLE switchboard.events ATTACH PARTITION switchboard.events_p{lo} "
                      f"FOR VALUES FROM ({lo}) TO ({lo + n})")
            c.execute("UPDATE switchboard.event_partitioning SET min_span = %s", (max(n, 100),))
            # the partitions ahead, for the publishers (not timed)
            c.execute("SELECT switchboard.events_partitions_ensure('0 seconds')")
        else:
            _detach_ranges(c, only_empty=False)
        t0 = time.monotonic()
        c.execute("INSERT INTO switchboard.events (id, room, event, payload) "
                  "SELECT nextval('switchboard.event_id_seq'), 'bench', 'x', jsonb_build_object('n', i) "
                  "FROM generate_series(1, %s) i", (n,))
        log(f"  {mode}: loaded {n} events in {time.monotonic() - t0:.1f} s")
        if mode == "rows":
            # After the load: partitions ahead for the publishers, above the loaded ids.
            c.execute("UPDATE switchboard.event_partitioning SET min_span = 1000000")
            c.execute("SELECT switchboard.events_partitions_ensure('0 seconds')")
        while c.execute("SELECT switchboard.event_tick()").fetchone()[0] < 0:
            time.sleep(0.01)
        c.execute("UPDATE switchboard.event_ticks SET created_at = created_at - interval '1 hour'")
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")
    return str(uid)


def reap(url: str, stats: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        t0 = time.monotonic()
        calls, total = 0, 0
        while True:
            got = c.execute("SELECT switchboard.reap_events('5 minutes', %s)", (BATCH,)).fetchone()[0]
            calls += 1
            total += got
            if got < BATCH or (got > BATCH and calls > 1):
                break
        stats["reap_s"] = time.monotonic() - t0
        stats["reap_wal_bytes"] = int(c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                                (lsn0,)).fetchone()[0])
        stats["reap_calls"] = calls
        stats["reaped"] = total


def dead_and_vacuum(url: str, stats: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.7)
        stats["dead_tuples"] = int(c.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'switchboard' "
            "AND relname LIKE 'events%'").fetchone()[0])
        stats["events_left"] = c.execute("SELECT count(*) FROM switchboard.events").fetchone()[0]
        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        t0 = time.monotonic()
        c.execute("VACUUM switchboard.events")
        stats["vacuum_s"] = time.monotonic() - t0
        stats["vacuum_wal_bytes"] = int(c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                                  (lsn0,)).fetchone()[0])


def publish_loop(url: str, uid: str, stop: threading.Event, lat: list[tuple[float, float]],
                 lock: threading.Lock) -> None:
    """notify_user in autocommit until stop is set; each publish's (start, seconds) into lat."""
    with psycopg.connect(url, autocommit=True) as p:
        while not stop.is_set():
            t = time.monotonic()
            p.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
            with lock:
                lat.append((t, time.monotonic() - t))


def publish_during(url: str, uid: str, publishers: int, stats: dict[str, Any]) -> None:
    """Publishers for 3 s; the reap starts at 1 s in this thread."""
    stop = threading.Event()
    lat: list[tuple[float, float]] = []     # (start, seconds)
    lock = threading.Lock()
    threads = [threading.Thread(target=publish_loop, args=(url, uid, stop, lat, lock)) for _ in range(publishers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(1.0)
    r0 = time.monotonic()
    reap(url, stats)
    r1 = time.monotonic()
    time.sleep(max(0.0, 2.0 - (r1 - r0)))
    stop.set()
    for t in threads:
        t.join(30)
    before = [d for s, d in lat if start + 0.2 <= s < r0]
    during = [d for s, d in lat if r0 <= s < r1]
    stats["publish_per_s_before"] = len(before) / max(1e-9, r0 - start - 0.2)
    stats["publish_per_s_during_reap"] = len(during) / max(1e-9, r1 - r0)
    stats["publish_max_s_before"] = max(before) if before else None
    stats["publish_max_s_during_reap"] = max((d for s, d in lat if r0 - 0.5 <= s < r1), default=None)
    stats["publish_p50_ms_before"] = 1000 * statistics.median(before) if before else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    cluster = Cluster()
    out: dict[str, Any] = {"machine": machine_info(cluster), "events": args.events, "rounds": []}
    try:
        for r in range(args.rounds):
            rnd: dict[str, Any] = {}
            for mode in (("drop", "rows") if r % 2 == 0 else ("rows", "drop")):
                log(f"round {r + 1}: {mode}")
                stats: dict[str, Any] = {}
                # alone: time, WAL, dead tuples, VACUUM (no other writer in the WAL figure)
                name = cluster.new_db(f"sb_ret_{mode}")
                url = cluster.url(name)
                prepare(url, args.events, mode)
                reap(url, stats)
                dead_and_vacuum(url, stats)
                cluster.drop_db(name)
                # again, with publishers: their throughput and their longest publish
                name = cluster.new_db(f"sb_ret_{mode}_pub")
                url = cluster.url(name)
                uid = prepare(url, args.events, mode)
                during: dict[str, Any] = {}
                publish_during(url, uid, args.publishers, during)
                stats.update({k: v for k, v in during.items() if k.startswith("publish")})
                stats["reap_s_with_publishers"] = during["reap_s"]
                log(f"  {mode}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in stats.items()))
                rnd[mode] = stats
                cluster.drop_db(name)
            rnd["ratio_time_rows_over_drop"] = rnd["rows"]["reap_s"] / rnd["drop"]["reap_s"]
            rnd["ratio_wal_rows_over_drop"] = rnd["rows"]["reap_wal_bytes"] / max(1, rnd["drop"]["reap_wal_bytes"])
            log(f"  rows/drop: time x{rnd['ratio_time_rows_over_drop']:.1f}, "
                f"WAL x{rnd['ratio_wal_rows_over_drop']:.1f}")
            out["rounds"].append(rnd)
    finally:
        cluster.stop()
    write_json(RESULTS / "events_retention.json", out)


if __name__ == "__main__":
    main()
