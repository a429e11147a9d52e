"""switchboard.partitions and partition_health(): the DBA's view of both partitioned
tables (task_runs_history by day, V0036; events by id, V0037)."""

from __future__ import annotations

import psycopg


def test_the_view_lists_both_tables_and_the_figures_follow_the_layout(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        rows = c.execute("SELECT parent, partition, is_default, range_from, range_to FROM switchboard.partitions"
                         ).fetchall()
        parents = {r[0] for r in rows}
        assert parents == {"task_runs_history", "events"}, rows
        defaults = {r[1] for r in rows if r[2]}
        assert defaults == {"task_runs_history_default", "events_default"}
        assert all(r[3] is None and r[4] is None for r in rows if r[2])
        days = [r for r in rows if r[0] == "task_runs_history" and r[1].startswith("task_runs_history_p")]
        assert days and all(r[4] is not None for r in days)
        health = dict(c.execute("SELECT item, value FROM switchboard.partition_health()").fetchall())
        assert health["run_history_default_rows"] == 0 and health["events_default_rows"] == 0
        assert health["run_partitions_ahead_seconds"] > 86400          # created days ahead
        assert health["event_partitions_ahead_ids"] > 0
        # A finished run with no day partition lands in the DEFAULT: the figure says so.
        c.execute("INSERT INTO switchboard.task_runs_history (id, handler, status, trigger, finished_at) "
                  "VALUES (-1, 'x', 'succeeded', 'manual', now() + interval '400 days')")
        health = dict(c.execute("SELECT item, value FROM switchboard.partition_health()").fetchall())
        assert health["run_history_default_rows"] == 1
        c.execute("DELETE FROM switchboard.task_runs_history WHERE id = -1")
