"""Per-handler options, named queues and priorities in SQL (V0030): what a handler's
registration stores (set_handler_options) is what enqueue(), the claims and
finish_run() honour, and every bad value is refused with 22023 naming it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from pgtap import throws_ok


def _opts(c: psycopg.Connection, handler: str, options: str) -> None:
    c.execute("SELECT switchboard.set_handler_options(%s, %s::jsonb)", (handler, options))


@pytest.mark.parametrize(("options", "match"), [
    ('{"queue": "Emails"}', "invalid queue name"),
    ('{"queue": 7}', "queue"),
    ('{"prio": 1}', 'unknown handler option "prio"'),
    ('{"priority": 1.5}', "priority"),
    ('{"priority": 101}', "priority"),
    ('{"max_attempts": 0}', "max_attempts"),
    ('{"backoff_base": 0}', "backoff_base"),
    ('{"backoff_base": "1s"}', "backoff_base"),
    ('{"backoff_cap": 1e400}', "backoff_cap"),
    ('{"backoff_base": 10, "backoff_cap": 5}', "backoff_cap"),
    ('{"backoff_jitter": 1.5}', "backoff_jitter"),
    ('{"timeout": -1}', "timeout"),
    ('[1]', "JSON object"),
])
def test_a_bad_option_is_refused_naming_it_and_nothing_is_stored(conn: psycopg.Connection, options: str,
                                                                  match: str) -> None:
    exc = throws_ok(conn, "SELECT switchboard.set_handler_options('opt.bad', %s::jsonb)", "22023",
                    (options,), match=match)
    assert exc.diag.message_hint, "every refusal carries a HINT"
    assert len(str(exc)) < 400, "a huge value is not echoed back whole"
    assert conn.execute("SELECT count(*) FROM switchboard.handler_options WHERE handler = 'opt.bad'"
                        ).fetchone() == (0,)


def test_enqueue_takes_the_handlers_options_unless_the_caller_names_its_own(conn: psycopg.Connection) -> None:
    with conn.transaction(force_rollback=True):
        _opts(conn, "opt.mail", '{"queue": "emails", "priority": 5, "max_attempts": 7}')
        row = conn.execute("SELECT queue, priority, max_attempts FROM switchboard.enqueue('opt.mail')").fetchone()
        assert row == ("emails", 5, 7)
        row = conn.execute("SELECT queue, priority, max_attempts FROM switchboard.enqueue('opt.mail', "
                           "max_attempts => 2, priority => -3, queue => 'default')").fetchone()
        assert row == ("default", -3, 2)
        # a handler without options: the old defaults; the 0.2.0 call by position still resolves
        row = conn.execute("SELECT queue, priority, max_attempts FROM "
                           "switchboard.enqueue('opt.plain', '{}', now(), NULL, 4)").fetchone()
        assert row == ("default", 0, 4)
        # another handler may use a queue some handler names
        assert conn.execute("SELECT queue FROM switchboard.enqueue('opt.plain', queue => 'emails')"
                            ).fetchone() == ("emails",)


def test_an_unknown_queue_or_a_bad_priority_is_refused_and_queues_nothing(conn: psycopg.Connection) -> None:
    before = conn.execute("SELECT count(*) FROM switchboard.task_runs").fetchone()
    exc = throws_ok(conn, "SELECT switchboard.enqueue('opt.x', queue => 'nowhere')", "22023",
                    match='queue "nowhere" does not exist')
    assert "handler_options" in (exc.diag.message_hint or "")
    throws_ok(conn, "SELECT switchboard.enqueue('opt.x', queue => 'Bad Name')", "22023", match="invalid queue")
    throws_ok(conn, "SELECT switchboard.enqueue('opt.x', priority => 101)", "22023", match="priority 101")
    throws_ok(conn, "SELECT switchboard.enqueue('opt.x', max_attempts => 0)", "22023", match="max_attempts")
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs").fetchone() == before


def test_the_claim_takes_the_highest_priority_first_then_the_oldest(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        ids = {}
        for name, prio in (("low", -5), ("mid", 0), ("high", 9), ("mid2", 0)):
            ids[c.execute("SELECT id FROM switchboard.enqueue('opt.p', %s::jsonb, now() - interval '1 minute', "
                          "priority => %s)", (f'{{"n": "{name}"}}', prio)).fetchone()[0]] = name
        order = []
        for _ in range(4):
            rid = c.execute("SELECT id FROM switchboard.claim_due_tasks('w', '60 seconds', 1)").fetchone()[0]
            order.append(ids[rid])
        assert order == ["high", "mid", "mid2", "low"]


def test_named_queues_are_claimed_only_by_their_own_slots(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")   # no maintenance tick in the way
        _opts(c, "opt.mail", '{"queue": "emails"}')
        mail = {c.execute("SELECT id FROM switchboard.enqueue('opt.mail')").fetchone()[0] for _ in range(5)}
        plain = {c.execute("SELECT id FROM switchboard.enqueue('opt.plain')").fetchone()[0] for _ in range(3)}
        # the three-argument claim serves the default queue only (as a 0.2.0 replica does)
        got = {r[0] for r in c.execute("SELECT id FROM switchboard.claim_due_tasks('w1', '60 seconds', 100)")}
        assert got == plain
        # at most slots[i] of queues[i]
        got = [r[0] for r in c.execute("SELECT id FROM switchboard.claim_due_tasks('w2', '60 seconds', "
                                       "'{default,emails}', '{10,2}')")]
        assert len(got) == 2 and set(got) <= mail
        got2 = {r[0] for r in c.execute("SELECT id FROM switchboard.claim_due_tasks('w2', '60 seconds', "
                                        "'{emails}', '{10}')")}
        assert got2 == mail - set(got)
        for bad, match in ((("{emails}", "{1,2}"), "one length"), (("{emails}", "{-1}"), "invalid slots"),
                           (("{emails}", "{1001}"), "invalid slots"), (("{emails}", "{NULL}"), "invalid slots")):
            throws_ok(c, "SELECT * FROM switchboard.claim_due_tasks('w', '60 seconds', %s::text[], %s::integer[])",
                      "22023", bad, match=match)


def test_racing_queue_claims_take_each_run_exactly_once(db: str) -> None:
    n_runs, n_workers = 300, 8
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")   # jobs only: 300 runs, counted
        _opts(c, "opt.race", '{"queue": "race"}')
        c.execute("SELECT switchboard.enqueue('opt.race', jsonb_build_object('i', i), "
                  "priority => (i %% 7) - 3) FROM generate_series(1, %s) i", (n_runs // 2,))
        c.execute("SELECT switchboard.enqueue('opt.plain', jsonb_build_object('i', i)) "
                  "FROM generate_series(1, %s) i", (n_runs // 2,))
    claimed: list[list[int]] = [[] for _ in range(n_workers)]
    start = threading.Barrier(n_workers)

    def worker(i: int) -> None:
        with psycopg.connect(db, autocommit=True) as c:
            start.wait()
            while True:
                rows = c.execute("SELECT id FROM switchboard.finish_and_claim(%s, '{}'::bigint[], NULL, "
                                 "'60 seconds', '{default,race}', '{2,3}')", (f"w{i}",)).fetchall()
                if not rows:
                    return
                claimed[i] += [r[0] for r in rows]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    every = [rid for ids in claimed for rid in ids]
    assert len(every) == n_runs and len(set(every)) == n_runs, "every run claimed exactly once"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE status = 'running'").fetchone() == (n_runs,)


def test_a_handler_that_moves_queue_takes_its_backlog_while_claims_race(db: str) -> None:
    """V0034: set_handler_options() with a new queue moves the handler's queued runs out of
    the old one (which no replica serves once no handler names it) while a rolling update
    is under way: half the workers still claim the old queue, half the new one. Every run
    is claimed exactly once, none is left in the old queue, and a run enqueued into a
    queue the caller chose stays there."""
    n_runs, n_workers = 400, 6
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        _opts(c, "opt.mover", '{"queue": "before"}')
        _opts(c, "opt.other", '{"queue": "chosen"}')
        c.execute("SELECT switchboard.enqueue('opt.mover', jsonb_build_object('i', i)) "
                  "FROM generate_series(1, %s) i", (n_runs,))
        kept = c.execute("SELECT id FROM switchboard.enqueue('opt.mover', '{}', queue => 'chosen')").fetchone()[0]
    claimed: list[list[int]] = [[] for _ in range(n_workers)]
    start = threading.Barrier(n_workers + 1)

    def worker(i: int) -> None:
        with psycopg.connect(db, autocommit=True) as c:
            start.wait()
            deadline = time.monotonic() + 60     # a stranded run shows as fewer than n_runs claims
            while sum(map(len, claimed)) < n_runs and time.monotonic() < deadline:
                rows = c.execute("SELECT id FROM switchboard.claim_due_tasks(%s, '60 seconds', %s::text[], "
                                 "'{2}')", (f"w{i}", ["before" if i % 2 else "after"])).fetchall()
                claimed[i] += [r[0] for r in rows]
                if not rows:
                    time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    with psycopg.connect(db, autocommit=True) as c:
        start.wait()
        assert c.execute("SELECT switchboard.set_handler_options('opt.mover', '{\"queue\": \"after\"}')"
                         ).fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'opt.mover' "
                         "AND status = 'queued' AND queue = 'before'").fetchone() == (0,)
    for t in threads:
        t.join(120)
    every = [rid for ids in claimed for rid in ids]
    assert len(every) == len(set(every)) == n_runs, "every run claimed exactly once, none stranded"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT status, queue FROM switchboard.task_runs WHERE id = %s", (kept,)).fetchone() \
            == ("queued", "chosen")
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE status = 'queued' "
                         "AND handler = 'opt.mover'").fetchone() == (1,)


def test_a_failed_run_waits_its_handlers_backoff_and_keeps_queue_and_priority(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        _opts(c, "opt.slow", '{"queue": "slow", "priority": 4, "max_attempts": 3, '
                             '"backoff_base": 10, "backoff_cap": 30, "backoff_jitter": 0.5}')
        rid = c.execute("SELECT id FROM switchboard.enqueue('opt.slow')").fetchone()[0]
        c.execute("SELECT switchboard.claim_due_tasks('w', '60 seconds', '{slow}', '{1}')")
        assert c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'boom')", (rid,)).fetchone() == (True,)
        retry = c.execute("SELECT id, attempt, queue, priority, run_at - finished, max_attempts FROM "
                          "switchboard.task_runs r, (SELECT finished_at AS finished FROM switchboard.task_runs "
                          "WHERE id = %s) f WHERE retry_of = %s", (rid, rid)).fetchone()
        rid2, attempt, queue, priority, wait, max_attempts = retry
        assert (attempt, queue, priority, max_attempts) == (2, "slow", 4, 3)
        # attempt 1: min(30, 10 * 2^1) = 20 s, less up to half of it
        assert timedelta(seconds=10) <= wait <= timedelta(seconds=20), wait
        # the cap: attempt 2 waits min(30, 40) less up to half
        delays = [c.execute("SELECT switchboard._retry_delay('opt.slow', 2)").fetchone()[0] for _ in range(50)]
        assert all(timedelta(seconds=15) <= d <= timedelta(seconds=30) for d in delays)
        assert len(set(delays)) > 1, "jitter spreads the waits"
        # a handler without options: 2^attempt seconds, capped at an hour, no jitter
        assert c.execute("SELECT switchboard._retry_delay('opt.none', 3), switchboard._retry_delay('opt.none', 99)"
                         ).fetchone() == (timedelta(seconds=8), timedelta(hours=1))


def test_finish_run_with_retry_false_fails_for_good(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        rid = c.execute("SELECT id FROM switchboard.enqueue('opt.perm', max_attempts => 5)").fetchone()[0]
        c.execute("SELECT switchboard.claim_due_tasks('w', '60 seconds', 1)")
        assert c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'bad args', false)",
                         (rid,)).fetchone() == (True,)
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (rid,)).fetchone() == ("failed",)
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE retry_of = %s", (rid,)).fetchone() == (0,)
        throws_ok(c, "SELECT switchboard.finish_run(1, 'w', false, NULL, 'x', NULL)", "22023")


def test_the_stored_options_are_read_back_and_a_restart_writes_nothing(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        _opts(c, "opt.view", '{"queue": "emails", "timeout": 30, "backoff_jitter": 0.25}')
        row = c.execute("SELECT queue, priority, max_attempts, backoff_base, backoff_cap, backoff_jitter, timeout "
                        "FROM switchboard.handler_options WHERE handler = 'opt.view'").fetchone()
        assert row == ("emails", 0, 3, timedelta(seconds=1), timedelta(hours=1), 0.25, timedelta(seconds=30))
        # the same registration again writes nothing (a restart is not an update) ...
        before = c.execute("SELECT xmin::text FROM switchboard.handler_options WHERE handler = 'opt.view'").fetchone()
        _opts(c, "opt.view", '{"queue": "emails", "timeout": 30, "backoff_jitter": 0.25}')
        assert c.execute("SELECT xmin::text FROM switchboard.handler_options WHERE handler = 'opt.view'"
                         ).fetchone() == before
        # ... and a changed one replaces the whole row (a key left out takes its default)
        _opts(c, "opt.view", '{"priority": 3}')
        assert c.execute("SELECT queue, priority, timeout FROM switchboard.handler_options "
                         "WHERE handler = 'opt.view'").fetchone() == ("default", 3, None)


def test_the_queue_claim_still_takes_due_ticks_and_rescues_expired_leases(db: str) -> None:
    """The four-argument claim takes every queue's share in one UPDATE only when the
    default queue's own rules allow it: a due tick ahead of the queue, or an expired
    lease, goes through the default queue's claim (ticks, rescue) first."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        tid = c.execute("SELECT id FROM switchboard.create_task('opt.tick', '@every 1 hour', 'noop')").fetchone()[0]
        c.execute("UPDATE switchboard.tasks SET next_run_at = now() - interval '1 hour' WHERE id = %s", (tid,))
        _opts(c, "opt.mail", '{"queue": "emails"}')
        job = c.execute("SELECT id FROM switchboard.enqueue('opt.plain')").fetchone()[0]
        mail = c.execute("SELECT id FROM switchboard.enqueue('opt.mail')").fetchone()[0]
        rows = c.execute("SELECT id, task_id, queue FROM switchboard.claim_due_tasks('w1', '60 seconds', "
                         "'{default,emails}', '{2,1}')").fetchall()
        assert {r[0] for r in rows} >= {job, mail} and any(r[1] == tid for r in rows), rows
        # an expired lease is rescued (abandoned, retried) by the same call
        c.execute("UPDATE switchboard.task_runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                  (mail,))
        c.execute("SELECT * FROM switchboard.claim_due_tasks('w2', '60 seconds', '{default,emails}', '{1,1}')")
        assert c.execute("SELECT status FROM switchboard.task_runs WHERE id = %s", (mail,)).fetchone() == ("abandoned",)
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE retry_of = %s", (mail,)).fetchone() == (1,)


def _buffers(plan: dict) -> int:
    p = plan["Plan"]
    return int(p.get("Shared Hit Blocks", 0)) + int(p.get("Shared Read Blocks", 0))


def test_claims_walk_the_index_head_after_an_analyze_that_saw_no_queued_run(db: str) -> None:
    """Autoanalyze between bursts sees a table of finished runs: the planner then believes
    about one run is queued, and reading every due run through task_runs_queued plus a
    sort by (priority DESC, run_at, id) looked as cheap as the ordered walk of
    task_runs_ready -- a claim read the whole backlog (bench/queues_ab.py
    --analyzed-history). Counted in buffers, so it holds on any machine."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET is_active = false")
        _opts(c, "opt.qa", '{"queue": "qa"}')
        c.execute("""INSERT INTO switchboard.task_runs_hot (handler, args, status, trigger, max_attempts, run_at,
                                                       finished_at, queue, priority)
                     SELECT CASE WHEN i % 2 = 0 THEN 'noop' ELSE 'opt.qa' END, '{}', 'running', 'enqueue', 3,
                            now() - interval '1 hour', NULL, CASE WHEN i % 2 = 0 THEN 'default' ELSE 'qa' END,
                            (i % 11) - 5
                       FROM generate_series(1, 60000) i""")
        c.execute("ANALYZE switchboard.task_runs_hot")      # what autoanalyze saw: nothing queued
        c.execute("TRUNCATE switchboard.task_runs_hot")     # the runs moved out; ANALYZE of an
        c.execute("VACUUM ANALYZE switchboard.task_runs_hot")  # empty table keeps those statistics
        c.execute("""INSERT INTO switchboard.task_runs_hot (handler, args, status, trigger, max_attempts, run_at,
                                                       queue, priority)
                     SELECT CASE WHEN i % 2 = 0 THEN 'noop' ELSE 'opt.qa' END, '{}', 'queued', 'enqueue', 3,
                            now() - interval '1 minute', CASE WHEN i % 2 = 0 THEN 'default' ELSE 'qa' END,
                            (i % 11) - 5
                       FROM generate_series(1, 60000) i""")
        backlog_pages = c.execute("SELECT pg_relation_size('switchboard.task_runs_hot') / 8192").fetchone()[0]
        assert backlog_pages > 600
        for call in ("claim_due_task('w1')", "claim_due_tasks('w2', '60 seconds', 4)",
                     "claim_due_tasks('w3', '60 seconds', '{default,qa}', '{2,3}')"):
            c.execute(f"SELECT * FROM switchboard.{call}")
            used = [_buffers(c.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM switchboard.{call}"
                                       ).fetchone()[0][0]) for _ in range(6)]
            assert max(used) < backlog_pages / 4, (call, used, backlog_pages)


def test_a_huge_queue_or_handler_name_is_refused_without_being_echoed_whole(conn: psycopg.Connection) -> None:
    for sql in ("SELECT switchboard.enqueue('opt.x', queue => repeat('q', 1000000))",
                "SELECT switchboard.enqueue(repeat('h', 1000000))",
                "SELECT switchboard.set_handler_options('opt.x', jsonb_build_object('queue', repeat('q', 1000000)))"):
        exc = throws_ok(conn, sql, "22023")
        assert len(str(exc)) < 2000, len(str(exc))
