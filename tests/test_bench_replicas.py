"""bench/replicas.py's arithmetic: which pg_stat_statements rows are relay statements,
and how they become per-replica rates. The run itself (real replicas, minutes of
load) is not a test; these helpers decide what its table says."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from replicas import classify, derived, per_event_ms, per_replica, pgbench_processed, pgbench_script  # noqa: E402

READ = ("SELECT tick, id, ephemeral, user_id, room, event, sender, payload, ts "
        "FROM switchboard.relay_read_v2($1::bigint, $2::bigint, $3::bigint[], $4::integer)")


def test_classify_names_each_relay_statement() -> None:
    assert classify(READ) == "read"
    assert classify("SELECT switchboard.event_tick() AS tick") == "tick"
    assert classify("SELECT first_tick, last_tick, reaped_through, publishers_notify "
                    "FROM switchboard.event_window()") == "window"
    assert classify("SELECT $1") == "liveness"
    assert classify("BEGIN") == "begin"
    assert classify("COMMIT") == "commit"
    assert classify("SELECT * FROM switchboard.claim_due_tasks($1, $2, $3)") == "other"


def test_per_replica_counts_a_tick_round_trip_as_three_statements() -> None:
    rows = [
        ("sb_rep_0", READ, 100), ("sb_rep_0", "SELECT switchboard.event_tick() AS tick", 90),
        ("sb_rep_0", "BEGIN", 95), ("sb_rep_0", "COMMIT", 95), ("sb_rep_0", "SELECT $1", 10),
        ("sb_rep_1", READ, 20),
        ("postgres", READ, 1000),                       # not a replica: ignored
    ]
    out = per_replica(rows, ["sb_rep_0", "sb_rep_1", "sb_rep_2"], seconds=10.0)
    # sb_rep_0: 100 reads + 3 x 90 ticks + 10 liveness = 380 in 10 s; sb_rep_1: 20; sb_rep_2: 0.
    assert out["relay_per_s_max"] == 38.0
    assert out["relay_per_s_mean"] == round((38.0 + 2.0 + 0.0) / 3, 1)
    assert out["total_relay_per_s"] == 40.0
    assert out["reads_per_s_mean"] == 4.0
    assert out["ticks_per_s_max"] == 9.0
    assert out["all_per_s_max"] == 39.0                 # every statement of the role, BEGIN/COMMIT included


def test_per_event_ms() -> None:
    assert per_event_ms(1.5, 3000) == 0.5
    assert per_event_ms(1.5, 0) is None


def test_derived_events_and_cost_per_read() -> None:
    # 3 replicas, 10 reads/s each for 5 s = 50 reads per replica covering 1,000 events;
    # their backends spent 0.3 s over 150 reads.
    s = {"reads_per_s_mean": 10.0, "window_s": 5.0, "delivered": 1000, "pg_cpu_replica_backends_s": 0.3}
    assert derived(3, s) == {"events_per_read": 20.0, "pg_us_per_read": 2000}
    assert derived(3, s | {"reads_per_s_mean": 0.0}) == {"events_per_read": None, "pg_us_per_read": None}


def test_pgbench_script_and_count() -> None:
    script = pgbench_script(["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"])
    assert script.startswith("\\set k random(1, 2)\n")
    assert "[:k]" in script and '{"k": -1}' in script
    assert pgbench_processed("scaling factor: 1\nnumber of transactions actually processed: 9876\n") == 9876
    try:
        pgbench_processed("connection to server failed")
    except RuntimeError:
        pass
    else:
        raise AssertionError("a pgbench failure must not read as zero events")
