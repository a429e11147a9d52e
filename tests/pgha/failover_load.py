"""Load that keeps running while PostgreSQL fails over, and the checks that follow.

Built on the HA kit (tests/ha/hakit.py: Trio, StreamClient, wait_until,
ready_all); what is new here is that *the database* goes away, so an outcome
can be in doubt: a POST that failed mid-COMMIT may or may not have committed.
The loads therefore never retry a number: each number is sent once, recorded
as acknowledged (2xx) or in doubt, and the truth is read from the new primary
afterwards. The checks are then exact:

- every acknowledged event is in the database (synchronous replication held),
  and every client received exactly the events that committed, once each;
- every acknowledged job has a succeeded run, and no two executions of one job
  overlap in time (from pgha_job_log, written by the handler itself);
- every HTTP answer is 2xx or a retryable 4xx/503 with a JSON body -- never 500.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psycopg
from hakit import PASSWORD, StreamClient, Trio, auth
from psycopg.types.json import Jsonb


@dataclass
class HttpLog:
    """Every HTTP answer the loads got, by status; bodies of the non-2xx ones."""

    statuses: Counter[int] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)        # 500s, or errors without a JSON body
    transport_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, what: str, r: httpx.Response) -> None:
        with self.lock:
            self.statuses[r.status_code] += 1
            if r.status_code >= 500 and r.status_code != 503 and r.status_code != 504:
                self.bad.append(f"{what}: {r.status_code} {r.text[:300]}")
            elif r.status_code >= 400:
                try:
                    body = r.json()
                    ok = isinstance(body, dict) and "title" in body
                except ValueError:
                    ok = False
                if not ok:
                    self.bad.append(f"{what}: {r.status_code} without a JSON error body: {r.text[:300]}")

    def transport(self) -> None:
        with self.lock:
            self.transport_errors += 1


class _Loop(threading.Thread):
    def __init__(self, interval: float, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.interval = interval
        self._halt = threading.Event()
        self.crash: str | None = None

    def step(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.step()
                self._halt.wait(self.interval)
        except Exception as exc:  # noqa: BLE001 - the test asserts crash is None
            self.crash = repr(exc)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class EventPublisher(_Loop):
    """POST /events {n} round-robin over the replicas; each n is sent exactly once."""

    def __init__(self, trio: Trio, admin_token: str, user_id: str, event: str, log: HttpLog,
                 interval: float = 0.03) -> None:
        super().__init__(interval, f"publisher-{event}")
        self.trio, self.h, self.user_id, self.event, self.log = trio, auth(admin_token), user_id, event, log
        self.n = 0
        self.acked: dict[int, int] = {}      # n -> event id
        self.doubt: list[int] = []
        self.ok_times: list[float] = []      # monotonic time of every acknowledged publish
        self.http = httpx.Client(timeout=10)

    def step(self) -> None:
        s = self.trio.rr()
        n, self.n = self.n, self.n + 1
        try:
            r = self.http.post(s.base + "/events", headers=self.h,
                               json={"user_id": self.user_id, "event": self.event, "payload": {"n": n}})
        except httpx.HTTPError:
            self.log.transport()
            self.doubt.append(n)
            return
        self.log.record("POST /events", r)
        if r.status_code == 202:
            self.acked[n] = r.json()["id"]
            self.ok_times.append(time.monotonic())
        else:
            self.doubt.append(n)

    def stop(self) -> None:
        super().stop()
        self.http.close()


class JobEnqueuer(_Loop):
    """enqueue('pgha.job', {n}) straight in SQL (transactional enqueue), over the multi-host URL."""

    def __init__(self, url: str, tag: str, interval: float = 0.1, seconds: float = 0.4) -> None:
        super().__init__(interval, f"enqueuer-{tag}")
        self.url, self.tag, self.seconds = url, tag, seconds
        self.n = 0
        self.acked: dict[int, int] = {}      # n -> run id
        self.doubt: list[int] = []
        self.conn: psycopg.Connection | None = None

    def step(self) -> None:
        n = self.n
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
        except psycopg.Error:
            return                                    # nothing sent: n is not used up
        self.n += 1
        try:
            row = self.conn.execute(
                "SELECT id FROM switchboard.enqueue('pgha.job', %s, max_attempts => 20)",
                (Jsonb({"n": n, "tag": self.tag, "seconds": self.seconds}),)).fetchone()
            self.acked[n] = row[0]
        except psycopg.Error:
            self.doubt.append(n)
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None

    def stop(self) -> None:
        super().stop()
        if self.conn is not None:
            self.conn.close()


class LoginLoop(_Loop):
    """A user logging in (round-robin) and listing tasks, as the web frontend does."""

    def __init__(self, trio: Trio, username: str, log: HttpLog, interval: float = 0.1) -> None:
        super().__init__(interval, f"login-{username}")
        self.trio, self.username, self.log = trio, username, log
        self.logins = 0
        self.http = httpx.Client(timeout=10)

    def step(self) -> None:
        s = self.trio.rr()
        try:
            r = self.http.post(s.base + "/auth/login", json={"username": self.username, "password": PASSWORD})
            self.log.record("POST /auth/login", r)
            if r.status_code != 200:
                return
            self.logins += 1
            r = self.http.get(self.trio.rr().base + "/tasks", headers=auth(r.json()["access_token"]))
            self.log.record("GET /tasks", r)
        except httpx.HTTPError:
            self.log.transport()

    def stop(self) -> None:
        super().stop()
        self.http.close()


# -- the truth, read from the (new) primary ------------------------------------------------------
def sql_retry(url: str, query: str, params: tuple = (), timeout: float = 60) -> list[tuple]:
    """Run a query on the current primary, waiting through a failover."""
    deadline = time.time() + timeout
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as c:
                cur = c.execute(query, params)
                return cur.fetchall() if cur.description else []
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def committed_numbers(url: str, user_id: str, event: str) -> dict[int, int]:
    rows = sql_retry(url, "SELECT (payload->>'n')::int, id FROM switchboard.events "
                          "WHERE user_id = %s AND event = %s", (user_id, event))
    out: dict[int, int] = {}
    for n, eid in rows:
        assert n not in out, f"number {n} committed twice ({out[n]}, {eid})"
        out[n] = eid
    return out


def numbers_of(c: StreamClient, event: str) -> Counter[int]:
    """The numbers of one stream (event label) a client received, once per event id."""
    with c.lock:
        by_id = {eid: f for _, eid, f in c.frames if f.get("event") == event}
    return Counter(f["payload"]["n"] for f in by_id.values())


def check_events(pub: EventPublisher, clients: list[StreamClient], url: str, user_id: str,
                 timeout: float = 20) -> dict[str, int]:
    """Acknowledged => committed; every client got exactly the committed numbers, once each."""
    committed = committed_numbers(url, user_id, pub.event)
    lost = {n: eid for n, eid in pub.acked.items() if committed.get(n) != eid}
    assert lost == {}, f"acknowledged events missing after the failover: {lost}"
    want = set(committed)
    for c in clients:
        c.wait_for(lambda c: want <= set(numbers_of(c, pub.event)), timeout)
    for c in clients:
        got = numbers_of(c, pub.event)
        missing = sorted(want - set(got))
        extra = sorted(set(got) - want)
        dups = sorted(n for n, k in got.items() if k > 1)
        assert c.client_errors == [], c.client_errors
        assert missing == [], f"{c.name} missed committed numbers {missing[:20]} (of {len(want)})"
        assert extra == [], f"{c.name} got numbers that never committed: {extra}"
        assert dups == [], f"{c.name} got numbers twice under different ids: {dups}"
        assert c.per_conn_dups == [], f"{c.name}: one socket got an id twice: {c.per_conn_dups}"
    return {"published": pub.n, "acked": len(pub.acked), "in_doubt": len(pub.doubt),
            "in_doubt_committed": sum(1 for n in pub.doubt if n in committed), "committed": len(want)}


def check_jobs(enq: JobEnqueuer, url: str, timeout: float = 60) -> dict[str, int]:
    """Every acknowledged job succeeded; no two executions of one job overlapped."""
    acked = set(enq.acked)

    def succeeded() -> set[int]:
        rows = sql_retry(url, "SELECT DISTINCT (args->>'n')::int FROM switchboard.task_runs "
                              "WHERE handler = 'pgha.job' AND args->>'tag' = %s AND status = 'succeeded'",
                         (enq.tag,))
        return {r[0] for r in rows}
    deadline = time.time() + timeout
    done = succeeded()
    while not acked <= done and time.time() < deadline:
        time.sleep(0.3)
        done = succeeded()
    assert acked <= done, f"acknowledged jobs that never succeeded: {sorted(acked - done)[:20]}"
    log = sql_retry(url, "SELECT l.n, l.run_id, l.worker, l.started_at, l.ended_at FROM public.pgha_job_log l "
                         "JOIN switchboard.task_runs r ON r.id = l.run_id WHERE r.args->>'tag' = %s "
                         "ORDER BY l.n, l.started_at", (enq.tag,))
    by_n: dict[int, list[tuple]] = {}
    for row in log:
        by_n.setdefault(row[0], []).append(row)
    overlaps = []
    for n, runs in by_n.items():
        for a, b in zip(runs, runs[1:]):
            if b[3] < a[4]:
                overlaps.append((n, a[1:], b[1:]))
    assert overlaps == [], f"one job ran on two workers at once: {overlaps[:5]}"
    executions = Counter(row[0] for row in log)
    return {"enqueued_acked": len(acked), "in_doubt": len(enq.doubt),
            "executions": sum(executions.values()), "ran_more_than_once": sum(1 for k in executions.values() if k > 1),
            "workers": len({row[2] for row in log})}


def check_ticks(url: str, task_id: str, outages: list[tuple[float, float]]) -> dict[str, int]:
    """No tick was scheduled twice; a tick missing from the 1-second grid lies inside an
    outage window.

    A tick may have more than one run only as a documented retry: a run whose finish
    was lost in the failover keeps its lease until it expires, is rescued as
    `abandoned` and replaced by attempt + 1 (same scheduled_for, retry_of set) --
    at-least-once, not a second scheduling. Two runs of one tick that the scheduler
    created (retry_of NULL), or a retry of a run that did not fail, is the bug this
    check exists for."""
    rows = sql_retry(url, "SELECT extract(epoch FROM scheduled_for)::float8, id, retry_of, status "
                          "FROM switchboard.task_runs WHERE task_id = %s ORDER BY 1, attempt", (task_id,))
    by_tick: dict[float, list[tuple]] = {}
    for r in rows:
        by_tick.setdefault(r[0], []).append(r)
    twice, retried = [], 0
    for tick, runs in by_tick.items():
        status = {r[1]: r[3] for r in runs}
        if sum(1 for r in runs if r[2] is None) != 1 or any(
                r[2] is not None and status.get(r[2]) not in ("abandoned", "failed") for r in runs):
            twice.append((tick, [(str(r[1]), str(r[2]), r[3]) for r in runs]))
        retried += sum(1 for r in runs if r[2] is not None)
    assert twice == [], f"cron ticks that ran twice: {twice}"
    rows = [(tick, len(runs)) for tick, runs in sorted(by_tick.items())]
    ticks = [r[0] for r in rows]
    lost = []
    for a, b in zip(ticks, ticks[1:]):
        t = a + 1
        while t < b - 0.5:
            if not any(lo - 2 <= t <= hi + 2 for lo, hi in outages):
                lost.append(t)
            t += 1
    assert lost == [], f"cron ticks missing outside any outage: {lost}"
    return {"ticks": len(ticks), "retried_after_a_lost_finish": retried}


def listen_sessions(url: str) -> int:
    return sql_retry(url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'switchboard-listen'")[0][0]


def frames_summary(clients: list[StreamClient]) -> str:
    return "; ".join(f"{c.name}: ports {c.conn_ports} codes {c.close_codes} failures {c.connect_failures}"
                     for c in clients)


# Figures measured by this run (failover times, throughput), printed at the end of every
# pytest run by tests/pgha/conftest.py (pytest_terminal_summary), captured output or not.
FIGURES: dict[str, dict] = {}


def dumps(d: dict) -> str:
    return json.dumps(d, sort_keys=True)
