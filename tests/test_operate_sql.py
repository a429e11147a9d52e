"""Operating runs in SQL under contention: cancel vs finish, retry vs a running
retry, pause vs claims in flight. Many connections, outcomes counted; every
call goes through the least-privilege application role the server uses."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from pgtap import race
from psycopg.rows import dict_row


def _setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                       FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")


def _claim_all(c: psycopg.Connection, worker: str, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        got = [r[0] for r in c.execute("SELECT id FROM switchboard.claim_due_tasks(%s, '5 minutes', %s)",
                                        (worker, min(100, n - len(ids))))]
        assert got, "nothing left to claim"
        ids += got
    return sorted(ids)


@pytest.mark.parametrize("ok", [True, False])
def test_cancel_vs_finish_exactly_one_wins(app_url: str, ok: bool) -> None:
    """A running run finished by its worker while an operator cancels it: for every
    run exactly one of the two calls returns true, and the row says which; a failed
    finish that wins queues its retry, a cancel that wins queues none."""
    _setup(app_url)
    n = 60
    with psycopg.connect(app_url, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('op.race') FROM generate_series(1, %s)", (n,))
        ids = _claim_all(c, "w-race", n)
    pairs = 4
    chunks = [ids[i::pairs] for i in range(pairs)]

    def step(i: int, barrier: threading.Barrier) -> dict[int, bool]:
        mine = chunks[i % pairs]
        out = {}
        with psycopg.connect(app_url, autocommit=True) as c:
            barrier.wait()
            for rid in mine:
                if i < pairs:
                    out[rid] = c.execute("SELECT switchboard.finish_run(%s, 'w-race', %s, NULL, 'boom')",
                                         (rid, ok)).fetchone()[0]
                else:
                    out[rid] = c.execute("SELECT switchboard.cancel_run(%s)", (rid,)).fetchone()[0]
        return out

    results = race(2 * pairs, step)
    finished = {k: v for r in results[:pairs] for k, v in r.items()}
    cancelled = {k: v for r in results[pairs:] for k, v in r.items()}
    with psycopg.connect(app_url, row_factory=dict_row) as c:
        rows = {r["id"]: r for r in c.execute("SELECT id, status FROM switchboard.task_runs WHERE id = ANY(%s)",
                                               (ids,))}
        retries = {r["retry_of"] for r in c.execute(
            "SELECT retry_of FROM switchboard.task_runs WHERE retry_of = ANY(%s)", (ids,))}
    wins = {"finish": 0, "cancel": 0}
    for rid in ids:
        assert finished[rid] != cancelled[rid], f"run {rid}: finish={finished[rid]} cancel={cancelled[rid]}"
        if finished[rid]:
            wins["finish"] += 1
            assert rows[rid]["status"] == ("succeeded" if ok else "failed")
            assert (rid in retries) == (not ok)
        else:
            wins["cancel"] += 1
            assert rows[rid]["status"] == "cancelled"
            assert rid not in retries
    assert sum(wins.values()) == n


def test_concurrent_retries_of_one_failed_run_make_one_new_run(app_url: str) -> None:
    _setup(app_url)
    with psycopg.connect(app_url, autocommit=True) as c:
        rid = c.execute("SELECT id FROM switchboard.enqueue('op.retry', '{}', now(), NULL, 1)").fetchone()[0]
        assert _claim_all(c, "w", 1) == [rid]
        assert c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'x')", (rid,)).fetchone()[0]

    def step(i: int, barrier: threading.Barrier) -> str:
        with psycopg.connect(app_url, autocommit=True) as c:
            barrier.wait()
            try:
                c.execute("SELECT id FROM switchboard.retry_run(%s)", (rid,)).fetchone()
                return "retried"
            except psycopg.Error as exc:
                return exc.sqlstate or "?"

    outcomes = race(12, step)
    assert sorted(outcomes) == ["55000"] * 11 + ["retried"], outcomes
    with psycopg.connect(app_url) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE retry_of = %s", (rid,)).fetchone()[0] == 1


def test_retry_vs_a_running_retry(app_url: str) -> None:
    """Operators retry a failed task run while its retry is running and that retry is
    failing at the same instant (its own automatic retry competing with theirs). The
    task never has two active runs: exactly one new run is queued per round, and each
    refused operator gets 55000."""
    _setup(app_url)
    with psycopg.connect(app_url, autocommit=True) as c:
        task = c.execute("SELECT id FROM switchboard.create_task('op.retry.task', NULL, 'op.retry', '{}', 'UTC', 5)"
                         ).fetchone()[0]
        first = c.execute("SELECT id FROM switchboard.create_run_exclusive(%s)", (task,)).fetchone()[0]
        assert _claim_all(c, "w", 1) == [first]
        c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'first failure')", (first,))
        # drop the automatic retry so the operator's retry is the next attempt
        auto = c.execute("SELECT id FROM switchboard.task_runs WHERE retry_of = %s", (first,)).fetchone()[0]
        assert c.execute("SELECT switchboard.cancel_run(%s)", (auto,)).fetchone()[0]
    tally = {"manual": 0, "auto": 0, "refused": 0}
    for round_ in range(8):
        with psycopg.connect(app_url, autocommit=True) as c:
            running = c.execute("SELECT id FROM switchboard.retry_run(%s)", (first,)).fetchone()[0]
            assert _claim_all(c, "w", 1) == [running]
            # while it runs, a retry of the same failed run is refused
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                c.execute("SELECT switchboard.retry_run(%s)", (first,))

        def step(i: int, barrier: threading.Barrier, running: int = running) -> str:
            with psycopg.connect(app_url, autocommit=True) as c:
                barrier.wait()
                if i == 0:
                    assert c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'again')",
                                     (running,)).fetchone()[0]
                    return "finished"
                try:
                    c.execute("SELECT id FROM switchboard.retry_run(%s)", (first,)).fetchone()
                    return "manual"
                except psycopg.errors.ObjectNotInPrerequisiteState:
                    return "refused"

        outcomes = race(6, step)
        with psycopg.connect(app_url, row_factory=dict_row) as c:
            active = c.execute("SELECT id, trigger, retry_of FROM switchboard.task_runs "
                               "WHERE task_id = %s AND status IN ('queued', 'running')", (task,)).fetchall()
            assert len(active) == 1, (round_, outcomes, active)
            new = active[0]
            manual = outcomes.count("manual")
            assert manual in (0, 1)
            if manual:
                assert (new["trigger"], new["retry_of"]) == ("manual_retry", first)
                tally["manual"] += 1
            else:
                assert (new["trigger"], new["retry_of"]) == ("retry", running)
                tally["auto"] += 1
            tally["refused"] += outcomes.count("refused")
        with psycopg.connect(app_url, autocommit=True) as c:
            assert c.execute("SELECT switchboard.cancel_run(%s)", (new["id"],)).fetchone()[0]
    assert tally["manual"] + tally["auto"] == 8
    print("retry vs running retry outcomes:", tally)


def test_pause_vs_claims_in_flight(app_url: str) -> None:
    """Six workers claim as fast as they can while the handler is paused. No claim
    that STARTED after pause_handler() returned takes the handler's work (a claim
    already in flight may); nothing is lost or claimed twice; after resume the rest
    is claimed."""
    _setup(app_url)
    n = 2000
    with psycopg.connect(app_url, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('op.paused') FROM generate_series(1, %s)", (n,))
        c.execute("SELECT switchboard.enqueue('op.other') FROM generate_series(1, 50)")
    stop = threading.Event()
    paused_at: list[float] = []
    log: list[tuple[float, float, list[tuple[int, str]]]] = []   # (start, end, [(id, handler)])
    lock = threading.Lock()

    def worker(i: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(app_url, autocommit=True) as c:
            barrier.wait()
            while not stop.is_set():
                t0 = time.monotonic()
                got = c.execute("SELECT id, handler FROM switchboard.claim_due_tasks(%s, '5 minutes', 1)",
                                (f"w{i}",)).fetchall()
                with lock:
                    log.append((t0, time.monotonic(), got))

    def pauser(i: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(app_url, autocommit=True) as c:
            barrier.wait()
            while True:   # let some claims happen first
                with lock:
                    if sum(len(g) for _, _, g in log) >= 60:
                        break
                time.sleep(0.005)
            assert c.execute("SELECT switchboard.pause_handler('op.paused')").fetchone()[0]
            paused_at.append(time.monotonic())
            time.sleep(1.5)
            stop.set()

    race(7, lambda i, b: pauser(i, b) if i == 6 else worker(i, b))
    t_pause = paused_at[0]
    after = [g for t0, _, g in log if t0 > t_pause]
    straddling = [g for t0, t1, g in log if t0 <= t_pause < t1]
    taken_after = [rid for g in after for rid, h in g if h == "op.paused"]
    assert after, "no claim ran after the pause"
    assert taken_after == [], f"claims started after the pause took {len(taken_after)} paused runs"
    claimed = [rid for _, _, g in log for rid, h in g if h == "op.paused"]
    assert len(claimed) == len(set(claimed))
    with psycopg.connect(app_url, autocommit=True) as c:
        queued = c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'op.paused' "
                           "AND status = 'queued'").fetchone()[0]
        assert queued + len(claimed) == n
        assert queued > 0, "the pause came too late to hold anything"
        assert c.execute("SELECT switchboard.resume_handler('op.paused')").fetchone()[0]
        rest = 0
        while got := c.execute("SELECT count(*) FILTER (WHERE handler = 'op.paused'), count(*) "
                               "FROM switchboard.claim_due_tasks('w-after', '5 minutes', 1000)").fetchone():
            if got[1] == 0:
                break
            rest += got[0]
        assert rest == queued
    print(f"pause vs claims: {len(claimed)} claimed before, {len(straddling)} claims in flight at the pause, "
          f"{len(after)} claims after it took none; {queued} held and claimed after resume")


def _fail_all(c: psycopg.Connection, worker: str, n: int) -> list[int]:
    ids = _claim_all(c, worker, n)
    for rid in ids:
        assert c.execute("SELECT switchboard.finish_run(%s, %s, false, NULL, 'boom')", (rid, worker)).fetchone()[0]
    return ids


def test_bulk_retry_races_retry_each_failed_run_exactly_once(app_url: str) -> None:
    """Eight operators retry "every failed bulk.job" at once, in pages of 7: each failed
    run gets exactly one retry; runs of one queueing lock get one between them; a run
    retried before is skipped (its retry is the newest attempt)."""
    _setup(app_url)
    with psycopg.connect(app_url, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('bulk.job', jsonb_build_object('n', g), now(), NULL, 1) "
                  "FROM generate_series(1, 120) g")
        c.execute("SELECT switchboard.enqueue('bulk.job', '{}', now(), 'lock-' || g, 1) FROM generate_series(1, 5) g")
        failed = _fail_all(c, "w-bulk", 125)
        # Two failed runs that share a queueing lock (the first failed before the second was queued).
        c.execute("SELECT switchboard.enqueue('bulk.job', '{}', now(), 'lock-1', 1)")
        failed += _fail_all(c, "w-bulk", 1)
        # Another handler's failures are not touched.
        c.execute("SELECT switchboard.enqueue('other.job', '{}', now(), NULL, 1)")
        other = _fail_all(c, "w-bulk", 1)[0]
        # One already retried by hand: its retry (queued) is the newest attempt.
        by_hand = c.execute("SELECT id FROM switchboard.retry_run(%s)", (failed[0],)).fetchone()[0]

    def op(i: int, barrier: threading.Barrier) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        with psycopg.connect(app_url, autocommit=True) as c:
            barrier.wait()
            while True:
                page = c.execute("SELECT run_id, retry_id FROM switchboard.retry_runs('failed', 'bulk.job', NULL, NULL, 7)"
                                 ).fetchall()
                out += page
                if not page:
                    return out

    results = race(8, op)
    made = [pair for r in results for pair in r]
    originals = [rid for rid, _ in made]
    assert len(originals) == len(set(originals)), "a run was retried twice"
    with psycopg.connect(app_url) as c:
        per_run = dict(c.execute("SELECT retry_of, count(*) FROM switchboard.task_runs WHERE retry_of IS NOT NULL "
                                 "GROUP BY retry_of").fetchall())
        active_locks = c.execute("SELECT queueing_lock, count(*) FROM switchboard.task_runs WHERE status IN "
                                 "('queued','running') AND queueing_lock IS NOT NULL GROUP BY 1 HAVING count(*) > 1"
                                 ).fetchall()
    assert max(per_run.values()) == 1 and active_locks == []
    assert failed[0] not in originals and per_run[failed[0]] == 1 and by_hand not in originals
    assert other not in originals and other not in per_run
    # 125 + 1 failed: the hand-retried one skipped, lock-1 once (one of its two failures).
    assert len(set(originals)) == 126 - 1 - 1
    with psycopg.connect(app_url, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.retry_runs('failed', 'bulk.job')").fetchone() == (0,)


def test_bulk_cancel_and_its_refusals(app_url: str) -> None:
    _setup(app_url)
    with psycopg.connect(app_url, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('bulk.c', '{}', now() + interval '1 hour') FROM generate_series(1, 30)")
        c.execute("SELECT switchboard.enqueue('bulk.keep', '{}', now() + interval '1 hour')")
        first = [r[0] for r in c.execute("SELECT * FROM switchboard.cancel_runs('queued', 'bulk.c', NULL, NULL, 20)")]
        rest = [r[0] for r in c.execute("SELECT * FROM switchboard.cancel_runs('queued', 'bulk.c')")]
        assert len(first) == 20 and len(rest) == 10 and first == sorted(first) and max(first) < min(rest)
        rows = c.execute("SELECT handler, status, count(*) FROM switchboard.task_runs WHERE handler LIKE 'bulk.%%' "
                         "AND handler <> 'bulk.job' GROUP BY 1, 2 ORDER BY 1").fetchall()
        assert rows == [("bulk.c", "cancelled", 30), ("bulk.keep", "queued", 1)]
        for sql, code, says in (
                ("SELECT switchboard.cancel_runs('failed')", "22023", "queued or running"),
                ("SELECT switchboard.retry_runs('queued')", "22023", "failed, abandoned, cancelled or succeeded"),
                ("SELECT switchboard.retry_runs(NULL)", "22023", "Retry runs that finished"),
                ("SELECT switchboard.retry_runs('failed', 'bad name!')", "22023", "A handler is a name"),
                ("SELECT switchboard.cancel_runs('queued', NULL, NULL, NULL, 0)", "22023", "1 to 10000"),
                ("SELECT switchboard.retry_runs('failed', NULL, 'no-such-task')", "P0002", "Name a task")):
            with pytest.raises(psycopg.Error) as ei:
                c.execute(sql)
            assert ei.value.sqlstate == code and says in (ei.value.diag.message_hint or ""), (sql, ei.value)
