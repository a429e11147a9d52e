"""The event bus under a randomized workload: no lock, exact resume (issue 18).

A seeded generator drives 16 publishers (random commit delays of 0-3 s, about
10 % rollbacks, three transactions held open 10 s) against 3 replicas, while
clients disconnect at random points and resume on a random live replica with
the cursor of the last frame they processed; one replica is SIGKILLed midway.
Counted per client, over its whole life across reconnects: lost = 0,
duplicated = 0, and the documented order: the frames' positions never go back
(strictly increasing without the live path: tick, then id), and each
publisher's events arrive in the order it committed them (a transaction that
began after another committed is delivered after it). Run twice: reading only,
and with the verified live path on (V0020: frames sent before the read, v2
cursors, some events too large to go live). Change SEED to explore another
schedule.
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import psycopg
import pytest
from websockets.sync.client import connect

from harness import auth, make_user

SEED = 18
PUBLISHERS = 16
USERS = 6
CLIENTS = 9                 # 3 per replica at the start
RUN_SECONDS = 30            # publishing; then everything is drained
ROOM = "all-hands"


def position(cursor: str) -> tuple[int, int]:
    """The position a cursor names (a v2 cursor: the part before the ids sent ahead)."""
    parts = cursor.split(".")
    if parts[0] == "v2":
        assert len(parts) >= 4, cursor
        return int(parts[1]), (2**63 - 1 if parts[2] == "e" else int(parts[2]))
    assert parts[0] == "v1" and len(parts) in (2, 3), cursor
    return int(parts[1]), (int(parts[2]) if len(parts) == 3 else 2**63 - 1)


class Client(threading.Thread):
    """One browser tab: reconnects at random points, resuming from its cursor."""

    def __init__(self, n: int, user: str, token: str, servers: list, alive: list[bool], seed: int,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"client-{n}")
        self.n, self.user, self.token, self.servers, self.alive = n, user, token, servers, alive
        self.rng = random.Random(seed)
        self.stop_ev = stop
        self.cursor: str | None = None
        self.ids: list[int] = []               # every event frame processed, in order
        self.positions: list[tuple[int, int]] = []
        self.problems: list[str] = []
        self.connects = 0
        self.v2_frames = 0
        self.v2_resumes = 0
        self.replica = n % len(servers)
        self.conn = None

    def _open(self):  # type: ignore[no-untyped-def]
        for _ in range(50):
            live = [i for i, ok in enumerate(self.alive) if ok]
            if self.replica not in live:
                self.replica = self.rng.choice(live)
            s = self.servers[self.replica]
            try:
                r = httpx.post(s.base + "/ws/ticket", headers=auth(self.token), timeout=10)
                r.raise_for_status()
                q = f"ticket={r.json()['ticket']}&rooms={ROOM}"
                if self.cursor is not None:
                    q += f"&cursor={self.cursor}"
                    self.v2_resumes += self.cursor.startswith("v2.")
                conn = connect(f"{s.ws_base}/ws?{q}", open_timeout=10)
                hello = json.loads(conn.recv(timeout=10))
                assert hello["event"] == "hello", hello
                if self.cursor is None:
                    self.cursor = hello["payload"]["cursor"]
                self.connects += 1
                return conn
            except Exception:
                self.replica = self.rng.randrange(len(self.servers))
                time.sleep(0.2)
        raise RuntimeError(f"client {self.n} could not connect")

    def _take(self, f: dict) -> None:
        if f.get("event") == "resume_gap":
            self.problems.append(f"resume_gap: {f}")
        if f.get("id") is None:
            return
        pos = position(f["cursor"])
        live = f["cursor"].startswith("v2.")
        self.v2_frames += live
        # Live frames share the socket's position (their own is not known yet); every
        # other frame moves it forward.
        if self.positions and (pos < self.positions[-1] or (pos == self.positions[-1] and not live)):
            self.problems.append(f"out of order: {pos} after {self.positions[-1]}")
        self.positions.append(pos)
        self.ids.append(f["id"])
        self.cursor = f["cursor"]

    def run(self) -> None:
        try:
            conn = self.conn = self._open()
            next_drop = time.monotonic() + self.rng.uniform(1, 6)
            while True:
                try:
                    f = json.loads(conn.recv(timeout=0.3))
                    self._take(f)
                except TimeoutError:
                    pass
                except Exception:                    # the replica died under us
                    conn = self._reconnect(conn)
                    continue
                if self.stop_ev.is_set():
                    break
                if time.monotonic() >= next_drop:     # a random disconnect, mid-stream
                    conn = self._reconnect(conn, away=self.rng.uniform(0, 1.5))
                    next_drop = time.monotonic() + self.rng.uniform(1, 6)
            self.conn = conn
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.problems.append(f"client crashed: {exc!r}")

    def _reconnect(self, conn, away: float = 0.0):  # type: ignore[no-untyped-def]
        try:
            conn.close()
        except Exception:
            pass
        time.sleep(away)
        self.replica = self.rng.randrange(len(self.servers))
        return self._open()

    def drain(self, expected: set[int], timeout: float) -> None:
        """Read until every expected event arrived (or timeout)."""
        deadline = time.monotonic() + timeout
        conn = self.conn if self.conn is not None else self._open()
        while not expected <= set(self.ids) and time.monotonic() < deadline:
            try:
                self._take(json.loads(conn.recv(timeout=0.5)))
            except TimeoutError:
                continue
            except Exception:
                conn = self._reconnect(conn)
        self.conn = conn


@pytest.mark.parametrize("live", [False, True], ids=["read", "live"])
def test_randomized_publishers_resuming_clients_and_a_killed_replica(server_factory, db: str, live: bool) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED)
    users = [make_user(db, f"u{i}") for i in range(USERS)]
    with psycopg.connect(db, autocommit=True) as c:
        for u in users:
            c.execute("SELECT switchboard.add_room_member(%s, %s)", (ROOM, u))
        if live:   # messages up to 300 bytes go live; the 5 % "large" events are barriers
            c.execute("SELECT switchboard.event_live_path(true, 300)")
    env = {"SWITCHBOARD_WS_QUEUE_SIZE": "2000"}
    servers = [server_factory(env=env, name=f"r{i}") for i in range(3)]
    alive = [True, True, True]
    tokens = {u: servers[0].login(f"u{i}") for i, u in enumerate(users)}
    stop_clients = threading.Event()
    clients = [Client(n, users[n % USERS], tokens[users[n % USERS]], servers, alive, rng.randrange(1 << 30),
                      stop_clients) for n in range(CLIENTS)]
    for cl in clients:
        cl.start()
    deadline = time.monotonic() + 60
    while not all(cl.connects for cl in clients) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(cl.connects for cl in clients)

    committed: list[tuple[str | None, int]] = []     # (user or None for the room, id)
    by_publisher: list[list[int]] = [[] for _ in range(PUBLISHERS)]   # in commit order
    lock = threading.Lock()
    errors: list[str] = []
    stop_pub = threading.Event()
    holders = set(rng.sample(range(PUBLISHERS), 3))  # these hold one transaction open 10 s

    def publisher(i: int, seed: int) -> None:
        prng = random.Random(seed)
        held = i not in holders
        try:
            with psycopg.connect(db) as p:
                while not stop_pub.is_set():
                    mine: list[tuple[str | None, int]] = []
                    for _ in range(prng.randint(1, 6)):
                        body = json.dumps({"p": i, "pad": "x" * (400 if prng.random() < 0.05 else 0)})
                        if prng.random() < 0.2:
                            eid = p.execute("SELECT switchboard.notify_room(%s, 'r', %s)",
                                            (ROOM, body)).fetchone()[0]
                            mine.append((None, eid))
                        else:
                            u = prng.choice(users)
                            eid = p.execute("SELECT switchboard.notify_user(%s, 'u', %s)",
                                            (u, body)).fetchone()[0]
                            mine.append((u, eid))
                    if not held and prng.random() < 0.1:
                        held = True
                        time.sleep(10)
                    elif prng.random() < 0.25:
                        time.sleep(prng.uniform(0, 3))
                    else:
                        time.sleep(prng.uniform(0, 0.05))
                    if prng.random() < 0.1:
                        p.rollback()
                    else:
                        p.commit()
                        with lock:
                            committed.extend(mine)
                        by_publisher[i].extend(e for _, e in mine)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"publisher {i}: {exc!r}")

    pubs = [threading.Thread(target=publisher, args=(i, rng.randrange(1 << 30)), daemon=True)
            for i in range(PUBLISHERS)]
    for t in pubs:
        t.start()
    time.sleep(RUN_SECONDS / 2)
    servers[1].kill()                 # SIGKILL: no goodbye, its sockets just drop
    alive[1] = False
    time.sleep(RUN_SECONDS / 2)
    stop_pub.set()
    for t in pubs:
        t.join(30)
    assert not errors, errors
    stop_clients.set()
    for cl in clients:
        cl.join(30)

    per_user = {u: {e for (t, e) in committed if t in (u, None)} for u in users}
    total = len(committed)
    assert total > 1000, total
    for cl in clients:
        cl.drain(per_user[cl.user], timeout=30)
    report = []
    for cl in clients:
        want = per_user[cl.user]
        got = cl.ids
        lost = want - set(got)
        dup = len(got) - len(set(got))
        extra = set(got) - want
        at = {e: k for k, e in enumerate(got)}
        for i, seq in enumerate(by_publisher):   # each publisher's events, in its commit order
            mine = [e for e in seq if e in at]
            if [at[e] for e in mine] != sorted(at[e] for e in mine):
                cl.problems.append(f"publisher {i}'s events out of commit order")
        report.append((cl.n, len(want), len(got), len(lost), dup, len(extra), cl.connects, cl.problems[:3],
                       cl.v2_frames, cl.v2_resumes))
    print(f"live={live}: client, expected, received, lost, duplicated, unexpected, connections, problems, "
          "v2 frames, v2 resumes")
    for row in report:
        print(*row)
    assert all(r[3] == 0 and r[4] == 0 and r[5] == 0 and not r[7] for r in report), report
    assert sum(r[6] for r in report) >= CLIENTS * 3, "the clients should have reconnected often"
    if live:   # the live path was exercised: frames sent ahead, and resumes from such cursors
        assert sum(r[8] for r in report) > total // 10, report
        assert sum(r[9] for r in report) > 0, report
    else:
        assert sum(r[8] for r in report) == 0, report
    for cl in clients:
        cl.conn.close()


def test_a_publisher_open_30_seconds_holds_back_nobody(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """One transaction publishes and stays open 30 s: 100 other publications commit
    meanwhile without waiting or failing, and each reaches the socket live, before the
    open one ends. Then the open one's event arrives, once, after them."""
    uid = make_user(db, "watcher")
    make_user(db, "boss", role="admin")
    s = server_factory()
    h = auth(s.login("boss"))
    # No client keepalive: this test reads nothing for ~20 s while it publishes, and what
    # it proves is delivery (recv's own timeouts catch a stall). In CI10, at load ~20,
    # the websockets client's 20 s ping went unanswered and it closed the socket itself.
    ws = connect(f"{s.ws_base}/ws?ticket={s.ticket(s.login('watcher'))}", open_timeout=10, ping_interval=None)
    assert json.loads(ws.recv(timeout=10))["event"] == "hello"
    slow = psycopg.connect(db)
    try:
        held = slow.execute("SELECT switchboard.notify_user(%s, 'slow', '{}')", (uid,)).fetchone()[0]
        opened = time.monotonic()
        ids, waits, frames = [], [], []
        for n in range(100):
            t0 = time.monotonic()
            r = httpx.post(s.base + "/events", headers=h, timeout=30,
                           json={"user_id": uid, "event": "fast", "payload": {"n": n}})
            waits.append(time.monotonic() - t0)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
            time.sleep(0.15)
        while len(frames) < 100:
            f = json.loads(ws.recv(timeout=10))
            if f.get("id") is not None:
                frames.append(f)
        # All 100 arrived while the held transaction is still open (it commits only below),
        # however long that took on a loaded box: delivery never waited for it. (A bound on
        # the elapsed time here proved nothing more and failed at load average ~11.)
        assert [f["id"] for f in frames] == ids        # all of them, live, in order
        assert max(waits) < 5, max(waits)              # nobody waited for the open transaction
        assert sorted(waits)[len(waits) // 2] < 1
        time.sleep(max(0.0, 30 - (time.monotonic() - opened)))
        slow.commit()
        f = json.loads(ws.recv(timeout=10))
        assert f["id"] == held and f["event"] == "slow"
        assert position(f["cursor"]) > position(frames[-1]["cursor"])
    finally:
        slow.close()
        ws.close()


def test_silent_publishers_are_delivered_by_the_relays_ticker(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """publishers_notify off: no publisher NOTIFYs; the replicas' ticker polls, and one
    {"tick": k} per batch wakes them. Every event still arrives, once, in order."""
    uid = make_user(db, "hush")
    with psycopg.connect(db, autocommit=True) as su:
        su.execute("UPDATE switchboard.event_ticker SET publishers_notify = false")
    servers = [server_factory(env={"SWITCHBOARD_EVENT_TICK_INTERVAL": "0.02"}, name=f"t{i}") for i in range(2)]
    tok = servers[0].login("hush")
    socks = []
    for s in servers:
        socks.append(connect(f"{s.ws_base}/ws?ticket={s.ticket(tok)}", open_timeout=10))
        assert json.loads(socks[-1].recv(timeout=10))["event"] == "hello"
    with psycopg.connect(db, autocommit=True) as lst:
        lst.execute("LISTEN switchboard_events")
        ids: list[int] = []

        def publish(k: int) -> None:
            with psycopg.connect(db) as p:
                for _ in range(20):
                    eid = p.execute("SELECT switchboard.notify_user(%s, 'q', '{}')", (uid,)).fetchone()[0]
                    p.commit()
                    ids.append(eid)
        threads = [threading.Thread(target=publish, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for ws in socks:
            got = []
            while len(got) < len(ids):
                f = json.loads(ws.recv(timeout=10))
                if f.get("id") is not None:
                    got.append(f)
            assert sorted(f["id"] for f in got) == sorted(ids)
            cursors = [position(f["cursor"]) for f in got]
            assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
        notes = [json.loads(n.payload) for n in lst.notifies(timeout=1.0)]
        assert notes and all(set(n) == {"tick"} for n in notes), notes[:5]
        assert len(notes) <= len(ids)
    for ws in socks:
        ws.close()
