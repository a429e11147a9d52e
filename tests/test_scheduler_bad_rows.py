"""One bad task row cannot stop the scheduler (issue 13, item 4).

A DBA can write anything the table's constraints allow into switchboard.tasks
with a plain UPDATE. A task whose next fire time cannot be computed used to
make every claim on every replica raise; now it is parked (no run,
next_run_at one minute ahead, last_error set, counted by status() as
tasks_broken) and everything else keeps being claimed. Rows that are odd but
computable (a handler with odd characters, args that are not an object, a
NULL schedule with a due next_run_at) are claimed like any other: the server
fails the run, the scheduler does not stop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

# (label, schedule, timezone, next_run_at SQL, handler, args) -- every one due now.
UNCOMPUTABLE = [
    ("bogus_zone", "* * * * *", "Bogus/X", "now() - interval '1 second'", "noop", "{}"),
    ("empty_zone", "*/5 * * * *", "", "now() - interval '1 second'", "noop", "{}"),
    ("never_fires", "0 0 30 2 *", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("not_cron", "every tuesday please", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("bad_minute", "61 * * * *", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("six_fields", "* * * * * *", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("every_negative", "@every -5 minutes", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("every_month", "@every 1 month", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("every_nothing", "@every", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("every_garbage", "@every soon", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("unknown_macro", "@fortnightly", "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("odd_zone_chars", "@daily", "Europe/Berlin'; --", "now() - interval '1 second'", "noop", "{}"),
]
# Odd but computable: claimed like any other task (the handler fails, not the scheduler).
COMPUTABLE = [
    ("odd_handler", "@every 1 second", "UTC", "now() - interval '1 second'",
     "x\"; DROP TABLE switchboard.tasks; -- \u00e9\u2603", "{}"),
    ("args_array", "@every 1 second", "UTC", "now() - interval '1 second'", "noop", "[1, 2]"),
    ("args_null", "@every 1 second", "UTC", "now() - interval '1 second'", "noop", "null"),
    ("trigger_only_due", None, "UTC", "now() - interval '1 second'", "noop", "{}"),
    ("lowercase_zone", "* * * * *", "utc", "now() - interval '1 second'", "noop", "{}"),
    ("minus_infinity_cron", "* * * * *", "UTC", "'-infinity'", "noop", "{}"),
    ("minus_infinity_every", "@every 1 minute", "UTC", "'-infinity'", "noop", "{}"),
    ("bc_anchor", "@every 1 minute", "UTC", "'0044-03-15 12:00:00+00 BC'", "noop", "{}"),
    ("far_past_anchor", "@every 1 second", "UTC", "'1970-01-01 00:00:00+00'", "noop", "{}"),
]
NEVER_DUE = [
    ("plus_infinity", "* * * * *", "Bogus/Y", "'infinity'", "noop", "{}"),
    ("null_next", "* * * * *", "Bogus/Z", "NULL", "noop", "{}"),
]


def insert_rows(c: psycopg.Connection, rows: list[tuple]) -> dict[str, str]:
    """Hand-made rows, as a DBA's UPDATE/INSERT would leave them (no validation)."""
    ids = {}
    for label, schedule, tz, next_sql, handler, args in rows:
        ids[label] = str(c.execute(
            "INSERT INTO switchboard.tasks (name, schedule, timezone, handler, args, next_run_at) "
            f"VALUES (%s, %s, %s, %s, %s::jsonb, {next_sql}) RETURNING id",  # next_sql: constants above
            ("bad." + label, schedule, tz, handler, args)).fetchone()[0])
    return ids


def pause_maintenance(c: psycopg.Connection) -> None:
    c.execute("UPDATE switchboard.tasks SET is_active = false WHERE name = 'switchboard.maintenance'")


def claim(c: psycopg.Connection, worker: str = "w1") -> dict | None:
    return c.cursor(row_factory=dict_row).execute(
        "SELECT * FROM switchboard.claim_due_task(%s, '60 seconds')", (worker,)).fetchone()


def status(c: psycopg.Connection) -> dict[str, int]:
    return dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())


def test_each_uncomputable_row_is_parked_with_its_error_and_the_rest_is_claimed(
        conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    bad = insert_rows(conn, UNCOMPUTABLE)
    odd = insert_rows(conn, COMPUTABLE)
    insert_rows(conn, NEVER_DUE)
    jobs = [r[0] for r in conn.execute(
        "SELECT (switchboard.enqueue('noop', jsonb_build_object('i', g), now() - interval '2 seconds')).id "
        "FROM generate_series(1, 5) g").fetchall()]

    claimed = []
    for _ in range(60):
        r = claim(conn)
        if r is None:
            break
        claimed.append(r)
    by_task = Counter(str(r["task_id"]) for r in claimed if r["task_id"] is not None)
    # every job once, every computable odd task once, no parked task at all
    assert sorted(r["id"] for r in claimed if r["task_id"] is None) == sorted(jobs)
    assert {t: by_task[t] for t in odd.values()} == {t: 1 for t in odd.values()}
    assert all(by_task[t] == 0 for t in bad.values()), by_task
    assert claim(conn) is None

    rows = {r["name"][4:]: r for r in conn.cursor(row_factory=dict_row).execute(
        "SELECT name, schedule, timezone, last_error, last_error_at, "
        "CASE WHEN isfinite(next_run_at) THEN next_run_at - now() END AS wait "
        "FROM switchboard.tasks WHERE name LIKE 'bad.%'")}
    for label in bad:
        r = rows[label]
        assert r["last_error"] is not None, label
        assert "SQLSTATE" in r["last_error"], r
        assert r["last_error_at"] is not None
        # re-checked in a minute, not spinning on every claim
        assert 55 <= r["wait"].total_seconds() <= 60, (label, r["wait"])
    # the message names the bad value
    assert "Bogus/X" in rows["bogus_zone"]["last_error"]
    assert "0 0 30 2 *" in rows["never_fires"]["last_error"]
    assert "every tuesday please" in rows["not_cron"]["last_error"]
    for label in list(odd) + [n[0] for n in NEVER_DUE]:
        assert rows[label]["last_error"] is None, (label, rows[label]["last_error"])
    st_ = status(conn)
    assert st_["tasks_broken"] == len(UNCOMPUTABLE)


def test_a_parked_task_heals_after_a_plain_update_without_a_spurious_run(
        conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    ids = insert_rows(conn, UNCOMPUTABLE[:1])       # bogus_zone, "* * * * *"
    assert claim(conn) is None
    tid = ids["bogus_zone"]
    # the DBA fixes it by hand; the re-check comes due (simulated: next_run_at now)
    conn.execute("UPDATE switchboard.tasks SET timezone = 'UTC', next_run_at = now() - interval '1 second' "
                 "WHERE id = %s", (tid,))
    assert claim(conn) is None                          # healed: no run at the re-check instant
    r = conn.cursor(row_factory=dict_row).execute(
        "SELECT last_error, last_error_at, next_run_at, switchboard.cron_next('* * * * *', now()) AS want "
        "FROM switchboard.tasks WHERE id = %s", (tid,)).fetchone()
    assert r["last_error"] is None and r["last_error_at"] is None
    assert r["next_run_at"] == r["want"]                # back on its schedule, from now
    assert status(conn)["tasks_broken"] == 0
    assert conn.execute("SELECT count(*) FROM switchboard.task_runs WHERE task_id = %s",
                        (tid,)).fetchone()[0] == 0


def test_update_task_clears_the_mark_when_it_reschedules(conn: psycopg.Connection) -> None:
    pause_maintenance(conn)
    ids = insert_rows(conn, UNCOMPUTABLE[2:3])          # never_fires
    assert claim(conn) is None
    tid = ids["never_fires"]
    assert conn.execute("SELECT last_error IS NOT NULL FROM switchboard.tasks WHERE id = %s",
                        (tid,)).fetchone()[0]
    conn.execute("SELECT switchboard.update_task(%s, '{\"schedule\": \"@every 10 seconds\"}')", (tid,))
    r = conn.execute("SELECT last_error, next_run_at > now() FROM switchboard.tasks WHERE id = %s",
                     (tid,)).fetchone()
    assert r == (None, True)


# -- fuzz: any text a DBA could write into schedule / timezone --------------------------------------
_schedules = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    st.builds(lambda a, b: f"@every {a} {b}", st.integers(-5, 10**7),
              st.sampled_from(["seconds", "minutes", "hours", "days", "months", "fortnights", ""])),
    st.builds(lambda *f: " ".join(f), *[st.sampled_from(
        ["*", "*/0", "*/7", "0", "59", "60", "1-5", "5-1", "31", "FEB", "MON-SUN", "L", "?", "-1", ""])] * 5),
    st.sampled_from(["@daily", "@hourly", "@reboot", "@every 1 second", "0 0 29 2 *", "0 0 31 4 *"]),
)
_zones = st.one_of(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
                   st.sampled_from(["UTC", "utc", "Europe/Berlin", "America/Sao_Paulo", "Etc/GMT+14",
                                    "Bogus/X", "+05:30", "EST5EDT", "posix/Europe/Paris", " UTC"]))
_anchor = st.sampled_from(["now() - interval '1 second'", "now() - interval '400 days'", "'-infinity'",
                           "'2000-01-01 00:00:00+00'", "'0001-01-01 00:00:00+00 BC'"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=st.one_of(st.none(), _schedules), tz=_zones, anchor=_anchor)
def test_fuzz_no_task_row_can_make_a_claim_raise(conn: psycopg.Connection, schedule: str | None,
                                                  tz: str, anchor: str) -> None:
    schedule = schedule.replace("\x00", "") if schedule is not None else None
    tz = tz.replace("\x00", "")
    with conn.transaction(force_rollback=True):
        pause_maintenance(conn)
        conn.execute("UPDATE switchboard.tasks SET is_active = false")
        tid = str(conn.execute(
            "INSERT INTO switchboard.tasks (name, schedule, timezone, handler, next_run_at) "
            f"VALUES ('fuzz', %s, %s, 'noop', {anchor}) RETURNING id", (schedule, tz)).fetchone()[0])
        job = conn.execute("SELECT (switchboard.enqueue('noop', '{}', now() - interval '2 seconds')).id"
                           ).fetchone()[0]
        got = [claim(conn), claim(conn), claim(conn)]
        ids = [r["id"] for r in got if r is not None and r["task_id"] is None]
        assert ids == [job]                              # the job is claimed, whatever the row holds
        runs = [r for r in got if r is not None and r["task_id"] is not None]
        # next_run_at as text: a huge @every can push it past year 9999, which Postgres
        # stores and Python's datetime cannot hold (the server's loader maps it to NULL).
        t = conn.execute("SELECT last_error, next_run_at::text FROM switchboard.tasks WHERE id = %s",
                         (tid,)).fetchone()
        # either the task fired (once) or it is parked with the error -- never both, never neither
        assert (len(runs) == 1) != (t[0] is not None), (schedule, tz, anchor, runs, t)
        if t[0] is not None:
            assert len(runs) == 0 and "SQLSTATE" in t[0]


# -- many workers, bad rows among good ones ------------------------------------------------------------
def test_four_workers_keep_claiming_everything_else_beside_bad_rows(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        bad = insert_rows(c, UNCOMPUTABLE)
        good = [str(c.execute("SELECT (switchboard.create_task(%s, '@every 1 second', 'noop')).id",
                              (f"good.{i}",)).fetchone()[0]) for i in range(5)]
        jobs = {r[0] for r in c.execute(
            "SELECT (switchboard.enqueue('noop', jsonb_build_object('i', g))).id "
            "FROM generate_series(1, 300) g").fetchall()}
        t0 = c.execute("SELECT now()").fetchone()[0]

    errors: list[str] = []
    claimed: list[dict] = []
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        with psycopg.connect(db, autocommit=True) as w:
            while not stop.is_set():
                try:
                    rows = w.cursor(row_factory=dict_row).execute(
                        "SELECT * FROM switchboard.claim_due_tasks(%s, '30 seconds', 4)", (f"w{i}",)).fetchall()
                except psycopg.Error as exc:
                    errors.append(f"w{i}: {exc.sqlstate} {exc}")
                    time.sleep(0.05)
                    continue
                for r in rows:
                    assert w.execute("SELECT switchboard.finish_run(%s, %s, true)", (r["id"], f"w{i}")
                                     ).fetchone()[0]
                with lock:
                    claimed.extend(rows)
                if not rows:
                    time.sleep(0.05)

    th = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    time.sleep(3.5)
    stop.set()
    for t in th:
        t.join(30)

    assert errors == []
    job_ids = Counter(r["id"] for r in claimed if r["task_id"] is None)
    assert set(job_ids) == jobs and max(job_ids.values()) == 1
    by_task = Counter(str(r["task_id"]) for r in claimed if r["task_id"] is not None)
    for g in good:
        assert by_task[g] >= 2, (g, by_task)               # ~3 ticks in 3.5 s, at least 2 on a busy box
    for b in bad.values():
        assert by_task[b] == 0
    with psycopg.connect(db, autocommit=True) as c:
        broken = c.execute("SELECT count(*) FROM switchboard.tasks WHERE last_error_at >= %s",
                           (t0,)).fetchone()[0]
        assert broken == len(UNCOMPUTABLE)
        assert status(c)["tasks_broken"] == len(UNCOMPUTABLE)


@pytest.mark.parametrize("label", [r[0] for r in UNCOMPUTABLE])
def test_before_the_fix_each_row_raised_in_the_claim(conn: psycopg.Connection, label: str) -> None:
    """The computation itself still raises for every row above (so the test rows really are bad)."""
    row = next(r for r in UNCOMPUTABLE if r[0] == label)
    with pytest.raises(psycopg.Error):
        with conn.transaction():
            conn.execute(f"SELECT switchboard._task_next_fire(%s, %s, {row[3]}, now())", (row[1], row[2]))


# -- a real replica beside bad rows ----------------------------------------------------------------
def test_a_replica_keeps_running_jobs_beside_bad_rows_and_shows_them(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    """Rows Python cannot even load (timestamps at +-infinity) must not fail a claim that
    Postgres committed, nor GET /tasks; a parked task shows its error to the API."""
    import httpx
    from harness import auth, make_user

    make_user(db, "admin", role="admin")
    with psycopg.connect(db, autocommit=True) as c:
        pause_maintenance(c)
        insert_rows(c, UNCOMPUTABLE[:1] + NEVER_DUE[:1])        # bogus zone; next_run_at = 'infinity'
        c.execute("SELECT switchboard.enqueue('noop', '{}', '-infinity')")
        c.execute("SELECT switchboard.enqueue('noop', '{}', now()) FROM generate_series(1, 20)")
    srv = server_factory()
    deadline = time.time() + 20
    with psycopg.connect(db, autocommit=True) as c:
        while time.time() < deadline:
            left = c.execute("SELECT count(*) FROM switchboard.task_runs "
                             "WHERE status IN ('queued', 'running')").fetchone()[0]
            if left == 0:
                break
            time.sleep(0.2)
        runs = dict(c.execute("SELECT status, count(*) FROM switchboard.task_runs GROUP BY 1").fetchall())
    assert runs == {"succeeded": 21}, runs
    h = auth(srv.login("admin"))
    r = httpx.get(srv.base + "/tasks", headers=h, timeout=10)
    assert r.status_code == 200, r.text
    by_name = {t["name"]: t for t in r.json()["tasks"]}
    assert "Bogus/X" in by_name["bad.bogus_zone"]["last_error"]
    assert by_name["bad.plus_infinity"]["next_run_at"] is None and by_name["bad.plus_infinity"]["last_error"] is None
