"""claim_due_tasks / finish_runs: batched, still exactly once, still fenced."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
from psycopg.types.json import Jsonb

from pgtap import throws_ok


def test_batched_claims_race_each_run_exactly_once(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        c.execute("SELECT (switchboard.enqueue('noop')).id FROM generate_series(1, 5000)")
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE status = 'queued'").fetchone()[0] == 5000
    got: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        with psycopg.connect(db, autocommit=True) as c:
            barrier.wait()
            while True:
                ids = [r[0] for r in c.execute(
                    "SELECT id FROM switchboard.claim_due_tasks(%s, '60 seconds', 7)", (f"w{i}",)).fetchall()]
                if not ids:
                    return
                assert len(ids) <= 7
                got[i].extend(ids)
                done = {r[0] for r in c.execute("SELECT * FROM switchboard.finish_runs(%s, %s)",
                                                 (f"w{i}", ids)).fetchall()}
                assert done == set(ids)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    all_ids = [x for g in got for x in g]
    dup = [k for k, v in Counter(all_ids).items() if v > 1]
    assert dup == [] and len(all_ids) == 5000
    with psycopg.connect(db) as c:
        assert c.execute("SELECT status, count(*) FROM switchboard.task_runs GROUP BY 1").fetchall() == [
            ("succeeded", 5000)]


def test_first_unit_follows_claim_due_task_rules_and_finish_runs_is_fenced(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        tid = c.execute("SELECT id FROM switchboard.create_task('tick', '@every 1 hour', 'noop')").fetchone()[0]
        c.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 minute' WHERE id = %s", (tid,))
        c.execute("SELECT switchboard.enqueue('noop') FROM generate_series(1, 3)")
        rows = c.execute("SELECT id, task_id, trigger FROM switchboard.claim_due_tasks('w1', '60 seconds', 10)"
                         ).fetchall()
        # the due tick is older than the queued jobs: it comes first; then the jobs
        assert rows[0][1] == tid and rows[0][2] == "schedule"
        assert [r[2] for r in rows[1:]] == ["enqueue"] * 3
        ids = [r[0] for r in rows]
        # another worker cannot finish w1's runs
        assert c.execute("SELECT count(*) FROM switchboard.finish_runs('w2', %s)", (ids,)).fetchone()[0] == 0
        done = c.execute("SELECT * FROM switchboard.finish_runs('w1', %s, %s)",
                         (ids[:2], [Jsonb({"n": 1}), None])).fetchall()
        assert sorted(r[0] for r in done) == sorted(ids[:2])
        assert c.execute("SELECT result FROM switchboard.task_runs WHERE id = %s", (ids[0],)).fetchone()[0] == {"n": 1}
        assert c.execute("SELECT result FROM switchboard.task_runs WHERE id = %s", (ids[1],)).fetchone()[0] is None
        # finishing twice changes nothing
        assert c.execute("SELECT count(*) FROM switchboard.finish_runs('w1', %s)", (ids[:2],)).fetchone()[0] == 0
        # each result lands on its own run, whatever the order, the arrays' bounds or a repeated id;
        # a run finishes once
        a, b = ids[2], ids[3]
        done = c.execute("SELECT * FROM switchboard.finish_runs('w1', %s::bigint[], %s::jsonb[])",
                         (f"[0:2]={{{b},{a},{b}}}", '[5:7]={"{\\"r\\": \\"b\\"}","{\\"r\\": \\"a\\"}",null}')).fetchall()
        assert sorted(r[0] for r in done) == sorted([a, b])
        got = dict(c.execute("SELECT id, result FROM switchboard.task_runs WHERE id IN (%s, %s)", (a, b)).fetchall())
        assert got == {a: {"r": "a"}, b: {"r": "b"}}
        assert c.execute("SELECT count(*) FROM switchboard.claim_due_tasks('w1', '60 seconds', 10)").fetchone()[0] == 0
        throws_ok(c, "SELECT * FROM switchboard.claim_due_tasks('w1', '60 seconds', 0)", "22023", match="max_runs")
        throws_ok(c, "SELECT * FROM switchboard.finish_runs('w1', '{1,2}', ARRAY['{}'::jsonb])", "22023")
        throws_ok(c, "SELECT * FROM switchboard.finish_runs('w1', '{{1},{2}}', NULL)", "22023", match="one-dimensional")
        throws_ok(c, "SELECT * FROM switchboard.finish_runs('w1', '{1,2}', '{{null},{null}}'::jsonb[])", "22023",
                  match="one-dimensional")


def _buffers(plan: dict) -> int:
    p = plan["Plan"]
    return int(p.get("Shared Hit Blocks", 0)) + int(p.get("Shared Read Blocks", 0))


def test_a_one_handler_backlog_is_claimed_by_walking_the_index_head(db: str) -> None:
    """A queue backlog of one handler (n_distinct = 1 after ANALYZE) made the planner believe
    the paused-handler filter keeps no row: both claims sorted every due queued run (55 ms
    per claim at 150,000 runs; bench/sql.py figure 3a fell to 0.01x of plain SQL). Counted
    in buffers, so it holds on any machine: a claim reads the head of the index, not the
    backlog -- custom plans (first five calls) and the generic plan after them alike."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        c.execute("""INSERT INTO switchboard.task_runs_hot (handler, args, status, trigger, max_attempts, run_at)
                     SELECT 'bulk', '{}', 'queued', 'enqueue', 3, now() - interval '1 minute'
                       FROM generate_series(1, 30000)""")
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot")
        backlog_pages = c.execute("SELECT relpages FROM pg_class WHERE oid = 'switchboard.task_runs_hot'::regclass"
                                  ).fetchone()[0]
        assert backlog_pages > 200
        for call in ("claim_due_task('w1')", "claim_due_tasks('w2', '60 seconds', 4)"):
            c.execute(f"SELECT * FROM switchboard.{call}")     # the first call also reads the catalogs
            used = [_buffers(c.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM switchboard.{call}"
                                       ).fetchone()[0][0]) for _ in range(8)]
            assert max(used) < backlog_pages / 4, (call, used, backlog_pages)


def _nested_claim_calls(c: psycopg.Connection, sql: str, params: tuple = ()) -> tuple[list[tuple], int]:
    """Run one claim in a transaction of its own; the rows it returned and how many times
    it called claim_due_task() (this transaction's function statistics)."""
    c.execute("SET track_functions = 'pl'")
    count = ("SELECT coalesce(pg_stat_get_xact_function_calls("
             "'switchboard.claim_due_task(text, interval)'::regprocedure), 0)")
    with c.transaction():
        # the backend's pending counts (not yet flushed) span transactions: take the difference
        before = c.execute(count).fetchone()[0]
        rows = c.execute(sql, params).fetchall()
        calls = c.execute(count).fetchone()[0] - before
    return rows, calls


def test_a_batch_with_nothing_else_due_is_one_statement_and_takes_the_oldest_in_order(db: str) -> None:
    """V0018: no expired lease, no due tick -> the batch skips claim_due_task() and takes the
    max_runs oldest due queued runs (run_at, id order), never a paused handler's, and still
    fenced by SKIP LOCKED (the race test above runs this path)."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        ids = [r[0] for r in c.execute(
            "SELECT (switchboard.enqueue('noop', '{}', now() - make_interval(secs => 100 - g))).id "
            "FROM generate_series(1, 6) g").fetchall()]
        c.execute("SELECT switchboard.enqueue('noop', '{}', now() + interval '1 hour')")   # not due
        paused = c.execute("SELECT (switchboard.enqueue('held', '{}', now() - interval '1 hour')).id").fetchone()[0]
        c.execute("SELECT switchboard.pause_handler('held')")
        rows, calls = _nested_claim_calls(
            c, "SELECT id, status, worker FROM switchboard.claim_due_tasks('w1', '60 seconds', 4)")
        assert calls == 0
        assert [r[0] for r in rows] == ids[:4] and {(r[1], r[2]) for r in rows} == {("running", "w1")}
        rows, calls = _nested_claim_calls(c, "SELECT id FROM switchboard.claim_due_tasks('w2', '60 seconds', 10)")
        assert calls == 0 and sorted(r[0] for r in rows) == ids[4:]
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (paused,)).fetchone()[0] == "queued"
        rows, calls = _nested_claim_calls(c, "SELECT id FROM switchboard.claim_due_tasks('w2', '60 seconds', 10)")
        assert rows == [] and calls == 0


def test_a_tick_due_behind_the_queue_head_waits_in_the_fast_path(db: str) -> None:
    """Oldest due first, as claim_due_task: a tick that fell due after the queued runs were
    due does not take the batch off the one-statement path; it is claimed once no older
    queued run is left -- or at once, through claim_due_task, when the older ones are all
    locked by other workers."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        older = [r[0] for r in c.execute(
            "SELECT (switchboard.enqueue('noop', '{}', now() - interval '10 minutes')).id "
            "FROM generate_series(1, 5)").fetchall()]
        tid = c.execute("SELECT id FROM switchboard.create_task('tick', '@every 1 hour', 'noop')").fetchone()[0]
        c.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 minute' WHERE id = %s", (tid,))
        rows, calls = _nested_claim_calls(
            c, "SELECT id, task_id FROM switchboard.claim_due_tasks('w1', '60 seconds', 3)")
        assert calls == 0 and [r[0] for r in rows] == older[:3] and all(r[1] is None for r in rows)
        # the two older runs left are locked by another worker: the tick is taken now
        with psycopg.connect(db) as other:
            other.execute("SELECT id FROM switchboard.task_runs_hot WHERE id = ANY(%s) FOR UPDATE", (older[3:],))
            rows, calls = _nested_claim_calls(
                c, "SELECT task_id, trigger FROM switchboard.claim_due_tasks('w1', '60 seconds', 3)")
            assert calls == 1 and rows == [(tid, "schedule")]


def test_an_expired_lease_or_a_due_tick_still_goes_through_claim_due_task(db: str) -> None:
    """The one-statement batch is only for plain queue work: an expired lease is rescued and
    a due tick claimed first, by claim_due_task() as before; bad arguments raise its errors."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        c.execute("SELECT switchboard.enqueue('noop') FROM generate_series(1, 3)")
        stale = c.execute("SELECT id FROM switchboard.claim_due_tasks('gone', '60 seconds', 1)").fetchone()[0]
        c.execute("UPDATE switchboard.task_runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                  (stale,))
        rows, calls = _nested_claim_calls(c, "SELECT id FROM switchboard.claim_due_tasks('w1', '60 seconds', 10)")
        assert calls == 1
        # the rescued run is queued again (attempt 2) and claimed with the others
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE worker = 'gone' AND status = 'running'"
                         ).fetchone()[0] == 0
        assert len(rows) >= 2
        tid = c.execute("SELECT id FROM switchboard.create_task('tick', '@every 1 hour', 'noop')").fetchone()[0]
        c.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 minute' WHERE id = %s", (tid,))
        c.execute("SELECT switchboard.enqueue('noop')")
        rows, calls = _nested_claim_calls(
            c, "SELECT task_id, trigger FROM switchboard.claim_due_tasks('w1', '60 seconds', 10)")
        assert calls == 1 and rows[0] == (tid, "schedule") and [r[1] for r in rows[1:]] == ["enqueue"]
        throws_ok(c, "SELECT * FROM switchboard.claim_due_tasks('', '60 seconds', 5)", "22023", match="worker")
        throws_ok(c, "SELECT * FROM switchboard.claim_due_tasks('w1', '0 seconds', 5)", "22023")


def test_finish_and_claim_finishes_fenced_then_claims_in_one_transaction(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        c.execute("SELECT switchboard.enqueue('noop') FROM generate_series(1, 5)")
        mine = [r[0] for r in c.execute("SELECT id FROM switchboard.claim_due_tasks('w1', '60 seconds', 2)")]
        theirs = c.execute("SELECT id FROM switchboard.claim_due_tasks('w2', '60 seconds', 1)").fetchone()[0]
        rows = c.execute("SELECT id, status, handler, args, worker FROM switchboard.finish_and_claim("
                         "'w1', %s, ARRAY[%s, NULL, NULL]::jsonb[], '60 seconds', 2)",
                         (mine + [theirs], Jsonb({"n": 1}))).fetchall()
        # w1's two runs are finished (thin rows: id and status only); w2's is fenced out
        assert sorted(r[0] for r in rows if r[1] == "succeeded") == sorted(mine)
        assert all(r[2] is None and r[3] is None for r in rows if r[1] == "succeeded")
        claimed = [r for r in rows if r[1] != "succeeded"]
        assert len(claimed) == 2 and {(r[1], r[2], r[4]) for r in claimed} == {("running", "noop", "w1")}
        assert c.execute("SELECT result FROM switchboard.task_runs WHERE id = %s", (mine[0],)).fetchone()[0] == {"n": 1}
        assert c.execute("SELECT status, worker FROM switchboard.task_runs WHERE id = %s", (theirs,)).fetchone() == (
            "running", "w2")
        # max_runs 0 only finishes
        ids = [r[0] for r in claimed]
        rows = c.execute("SELECT id, status FROM switchboard.finish_and_claim('w1', %s, NULL, '60 seconds', 0)",
                         (ids[:1],)).fetchall()
        assert rows == [(ids[0], "succeeded")]
        # a claim that fails rolls the finish back: the run stays running, leased to w1
        throws_ok(c, "SELECT * FROM switchboard.finish_and_claim('w1', %s, NULL, '0 seconds', 1)", "22023",
                  params=(ids[1:],))
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (ids[1],)).fetchone()[0] == "running"
        throws_ok(c, "SELECT * FROM switchboard.finish_and_claim('w1', %s, NULL, '60 seconds', 1001)", "22023",
                  params=(ids[1:],), match="max_runs")


def test_plans_made_on_an_empty_queue_do_not_scan_a_later_burst(db: str) -> None:
    """An idle replica's polls make the cached plans while the queue is empty, where every
    path costs the same; the burst after must still be claimed and finished through the
    primary key and the queue index (V0018: those UPDATEs are planned at each call). Without it the finish was
    a sequential scan under a hash join and the claim a walk of task_runs_by_handler:
    the whole table or index per call. Counted in buffers, so it holds on any machine."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        c.execute("TRUNCATE switchboard.task_runs_hot, switchboard.task_runs_history")
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot")
        for _ in range(12):        # past the five custom plans after which a generic one is cached
            c.execute("SELECT * FROM switchboard.finish_and_claim('w', '{1,2,3,4,5,6,7,8}', NULL, '60 seconds', 8)")
        c.execute("SELECT switchboard.enqueue('noop') FROM generate_series(1, 150000)")
        pages = c.execute("SELECT pg_relation_size('switchboard.task_runs_hot') / current_setting('block_size')::int"
                          ).fetchone()[0]
        assert pages > 1500
        ids = [r[0] for r in c.execute(
            "SELECT id FROM switchboard.finish_and_claim('w', '{}', NULL, '60 seconds', 8)").fetchall()]
        used = []
        for _ in range(4):
            plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM "
                             "switchboard.finish_and_claim('w', %s, NULL, '60 seconds', 8)", (ids,)).fetchone()[0][0]
            used.append(_buffers(plan))
            ids = [r[0] for r in c.execute("SELECT id FROM switchboard.task_runs WHERE worker = 'w' "
                                           "AND status = 'running'").fetchall()]
            assert len(ids) == 8
        # a healthy call (8 finished, 8 claimed, their index entries) reads ~250 buffers
        assert max(used) < pages / 3, (used, pages)
