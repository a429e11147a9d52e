"""Multi-replica HA kit: one PostgreSQL, three `switchboard serve` processes.

Every replica is a separate OS process on its own loopback port (as on separate
nodes). The test drives them like a load balancer would: round-robin over the
replicas currently in rotation. Short leases and intervals come from the
environment (HA_ENV); the production defaults are untouched.

Helpers
- ``Publisher``: a thread that POSTs a numbered stream of events round-robin to
  the replicas in rotation. A replica is taken out of rotation under the
  publisher's lock, so no request is ever in flight to a replica the test is
  about to kill or stop: every POST either clearly committed (202) or clearly
  failed, and each number is published exactly once.
- ``StreamClient``: a thread with one WebSocket at a time that reconnects to
  another live replica on close/loss and sends ``resume`` with its cursor.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
from harness import Server, auth, make_user
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

APP_LOGIN = "sb_app_login"  # the least-privilege login role tests/conftest.py creates

HA_ENV = {
    "SWITCHBOARD_LEASE_SECONDS": "2",
    "SWITCHBOARD_POLL_INTERVAL": "0.2",
    "SWITCHBOARD_HEARTBEAT_INTERVAL": "0.5",
    "SWITCHBOARD_LISTEN_CHECK_INTERVAL": "0.5",
    "SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "3",
    # The module trio logs in a lot from one IP; test 4 sets its own limits on its own trio.
    "SWITCHBOARD_LOGIN_IP_BURST": "100000",
    "SWITCHBOARD_LOGIN_IP_RATE": "1000",
    # ... and as the same users on every replica (each replica's client has its own
    # device cookies, so the per-username bucket is paid on first contact).
    "SWITCHBOARD_LOGIN_USER_BURST": "100000",
    "SWITCHBOARD_LOGIN_USER_RATE": "1000",
    "SWITCHBOARD_WS_MAX_SOCKETS_PER_USER": "100",
    "SWITCHBOARD_LOG_LEVEL": "INFO",
}
PASSWORD = "pw-" + "s" * 12
_counter = itertools.count()


def app_url_for(url: str) -> str:
    return url.replace("postgres@", f"{APP_LOGIN}@", 1)


def superuser_url(url: str) -> str:
    return url.replace(f"{APP_LOGIN}@", "postgres@", 1)


class Trio:
    """N replicas plus a load balancer's view of them: who is in rotation."""

    def __init__(self, db_url: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.db_url = db_url                      # superuser URL (test-side SQL)
        self.app_url = app_url_for(db_url)        # what the replicas use
        self.log_dir = log_dir
        self.env = {**HA_ENV, **(env or {})}
        self.servers: list[Server] = []           # every replica ever started (for teardown)
        self.rotation: list[Server] = []          # the ones the "load balancer" sends to
        self._rr = itertools.count()
        self.lock = threading.Lock()

    # -- replicas -------------------------------------------------------------------
    def start(self, n: int = 1, wait: bool = True, **kw) -> list[Server]:  # type: ignore[no-untyped-def]
        """Start n replicas at once (Popen all, then wait for each to be ready)."""
        new = []
        url = kw.pop("url", None) or self.app_url
        for _ in range(n):
            k = next(_counter)
            s = Server(url, env=self.env, log_dir=self.log_dir, name=f"ha{k}", **kw)
            s.start(wait=False)
            new.append(s)
            self.servers.append(s)
        if wait:
            for s in new:
                s.wait_ready(60)
            with self.lock:
                self.rotation.extend(new)
        return new

    def out_of_rotation(self, s: Server) -> None:
        with self.lock:
            if s in self.rotation:
                self.rotation.remove(s)

    def live(self) -> list[Server]:
        with self.lock:
            return list(self.rotation)

    def rr(self) -> Server:
        """The next replica in rotation (round-robin, like a load balancer)."""
        with self.lock:
            return self.rotation[next(self._rr) % len(self.rotation)]

    def __getitem__(self, i: int) -> Server:
        return self.live()[i]

    def stop_all(self) -> None:
        """SIGTERM every replica still running (all at once), then wait for each."""
        running = [s for s in self.servers if s.proc and s.proc.poll() is None]
        for s in running:
            s.proc.send_signal(signal.SIGTERM)
        for s in running:
            try:
                s.proc.wait(timeout=20)   # one SIGTERM only: a second one may land in finalisation
                s._log.close()
            except Exception:  # noqa: BLE001 - did not drain in time
                s.kill()

    # -- SQL and users ------------------------------------------------------------------
    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.db_url, autocommit=True) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else []

    def user(self, name: str, role: str = "member") -> str:
        return make_user(self.db_url, name, PASSWORD, role)

    def login(self, name: str) -> str:
        return self.rr().login(name, PASSWORD)


def replica_of_worker(servers: list[Server], worker: str) -> Server | None:
    """The replica whose process runs `worker` ("host:pid:rand")."""
    pid = int(worker.split(":")[1])
    for s in servers:
        if s.proc is not None and s.pid == pid:
            return s
    return None


# -- a numbered stream and a resuming client ----------------------------------------------------
class Publisher(threading.Thread):
    """POSTs events {"n": 0, 1, 2, ...} to one user, round-robin over the trio's rotation.

    Each number is published exactly once. Strict mode (default): any failed
    request is an error -- for tests that take a replica out of rotation (under
    trio.lock, so nothing is in flight to it) before killing it. Lenient mode
    (``retry=True``), for a replica SIGTERMed while still in rotation: a failed
    request is looked up in switchboard.events; if it did not commit it is sent
    again to the next replica, and it is recorded in ``failed_uncommitted``.
    """

    def __init__(self, trio: Trio, admin_token: str, user_id: str, interval: float = 0.02,
                 event: str = "num", retry: bool = False) -> None:
        super().__init__(daemon=True)
        self.trio, self.h, self.user_id, self.interval, self.event = trio, auth(admin_token), user_id, interval, event
        self.retry = retry
        self.n = 0
        self._k = 0
        self.ids: dict[int, int] = {}       # number -> event id
        self.by_port: Counter[int] = Counter()
        self.errors: list[str] = []
        self.failed_uncommitted: list[str] = []
        self.failed_committed: list[str] = []
        self._halt = threading.Event()
        self.http = httpx.Client(timeout=10)   # keep-alive: a publish costs ~2 ms, not a handshake

    def _committed(self, n: int) -> int | None:
        rows = self.trio.sql("SELECT id FROM switchboard.events WHERE user_id = %s AND event = %s "
                             "AND payload->>'n' = %s", (self.user_id, self.event, str(n)))
        assert len(rows) <= 1, rows
        return rows[0][0] if rows else None

    def publish_one(self) -> None:
        for _ in range(100):
            # Held for the whole request: once the test holds trio.lock to take a replica
            # out of rotation, no request to that replica is in flight.
            with self.trio.lock:
                rot = self.trio.rotation
                s = rot[self._k % len(rot)]
                self._k += 1
                err = None
                try:
                    r = self.http.post(s.base + "/events", headers=self.h,
                                       json={"user_id": self.user_id, "event": self.event,
                                             "payload": {"n": self.n}})
                    if r.status_code == 202:
                        self.ids[self.n] = r.json()["id"]
                        self.by_port[s.port] += 1
                        self.n += 1
                        return
                    err = f"n={self.n} on :{s.port}: {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    err = f"n={self.n} on :{s.port}: {type(exc).__name__}: {exc}"
            if not self.retry:
                self.errors.append(err)
                raise RuntimeError(err)
            time.sleep(0.2)  # let a statement that did reach Postgres finish before looking
            eid = self._committed(self.n)
            if eid is not None:
                self.failed_committed.append(err)
                self.ids[self.n] = eid
                self.n += 1
                return
            self.failed_uncommitted.append(err)
        self.errors.append(f"n={self.n}: gave up")
        raise RuntimeError(self.errors[-1])

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.publish_one()
                self._halt.wait(self.interval)
        except Exception as exc:  # noqa: BLE001 - the test asserts errors == []
            if not self.errors:
                self.errors.append(repr(exc))

    def stop(self) -> int:
        self._halt.set()
        self.join(30)
        self.http.close()
        return self.n


class StreamClient(threading.Thread):
    """One user's browser tab: one socket at a time, reconnecting with resume.

    The cursor is the highest event id that is safe to resume after. Frames that
    arrive on a new socket before its "resumed" ack are live events that overtook
    the replay; they advance the cursor only once "resumed" arrived (otherwise a
    socket lost between them and the replay would skip the replayed ids).
    """

    def __init__(self, token: str, pick: Callable[[StreamClient], Server], name: str = "client") -> None:
        super().__init__(daemon=True, name=name)
        self.token, self.pick = token, pick
        self.cursor = 0
        self.frames: list[tuple[int, int, dict]] = []   # (connection no, id, frame)
        self.conn_ports: list[int] = []
        self.close_codes: list[int | None] = []
        self.per_conn_dups: list[tuple[int, int]] = []
        self.unacked_losses = 0       # sockets lost before their "resumed" ack
        self.connect_failures = 0
        self.client_errors: list[str] = []
        self.current: Server | None = None
        self._conn = None
        self._halt = threading.Event()
        self.connected = threading.Event()
        self.lock = threading.Lock()

    # numbers received, with multiplicity, de-duplicated by event id only across
    # sockets whose replay was legitimately requested twice (see unacked_losses)
    def numbers(self) -> Counter[int]:
        with self.lock:
            by_id = {}
            for _, eid, f in self.frames:
                by_id.setdefault(eid, f)
            return Counter(f["payload"]["n"] for f in by_id.values() if "n" in (f.get("payload") or {}))

    def raw_ids(self) -> Counter[int]:
        with self.lock:
            return Counter(eid for _, eid, _f in self.frames)

    def wait_for(self, pred: Callable[[StreamClient], bool], timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred(self):
                return True
            time.sleep(0.05)
        return pred(self)

    def drop(self) -> None:
        """Lose the current socket (as a network blip would)."""
        c = self._conn
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - already closed
                pass

    def stop(self) -> None:
        self._halt.set()
        self.drop()
        self.join(10)

    def run(self) -> None:
        conn_no = 0
        while not self._halt.is_set():
            try:
                s = self.pick(self)
                r = httpx.post(s.base + "/ws/ticket", headers=auth(self.token), timeout=5)
                if r.status_code != 201:
                    raise RuntimeError(f"ticket: {r.status_code}")
                conn = connect(f"{s.ws_base}/ws?ticket={r.json()['ticket']}", open_timeout=5)
            except Exception:  # noqa: BLE001 - a replica going away: try another
                self.connect_failures += 1
                self._halt.wait(0.1)
                continue
            conn_no += 1
            self._conn, self.current = conn, s
            self.conn_ports.append(s.port)
            after = self.cursor
            acked = False
            pending = after
            seen: set[int] = set()
            try:
                hello = json.loads(conn.recv(timeout=5))
                assert hello["event"] == "hello", hello
                conn.send(json.dumps({"action": "resume", "after": after}))
                self.connected.set()
                while not self._halt.is_set():
                    try:
                        f = json.loads(conn.recv(timeout=0.5))
                    except TimeoutError:
                        continue
                    eid = f.get("id")
                    if eid is not None:
                        if eid in seen:
                            self.per_conn_dups.append((conn_no, eid))
                        seen.add(eid)
                        with self.lock:
                            self.frames.append((conn_no, eid, f))
                        pending = max(pending, eid)
                        if acked:
                            self.cursor = max(self.cursor, eid)
                    elif f.get("event") == "resumed":
                        acked = True
                        self.cursor = max(self.cursor, pending)
                    elif f.get("event") == "resume_gap":
                        raise AssertionError(f"resume_gap after {after}: {f}")
                self.close_codes.append(None)
            except ConnectionClosed as exc:
                self.close_codes.append(exc.rcvd.code if exc.rcvd else None)
                if not acked:
                    self.unacked_losses += 1
            except Exception as exc:  # noqa: BLE001 - recorded; the test asserts none
                self.close_codes.append(-1)
                self.client_errors.append(f"conn {conn_no} on :{s.port}: {exc!r}")
            finally:
                self.connected.clear()
                self._conn = None
                try:
                    conn.close()
                except Exception:  # noqa: BLE001, S110 - already closed
                    pass


def exactly_once(numbers: Counter[int], n: int) -> tuple[list[int], list[int]]:
    """(missing, duplicated) numbers of 0..n-1."""
    missing = [i for i in range(n) if numbers[i] == 0]
    dups = [i for i, c in numbers.items() if c > 1]
    return missing, dups


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def ready_status(s: Server) -> int:
    try:
        return httpx.get(s.base + "/healthz/ready", timeout=3).status_code
    except httpx.HTTPError:
        return 0


def ready_all(servers: list[Server]) -> list[int]:
    """/healthz/ready of every replica, probed in parallel (a 503 can take the ping's 2 s)."""
    out = [0] * len(servers)

    def one(i: int) -> None:
        out[i] = ready_status(servers[i])
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(servers))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out


def rss_report(label: str, servers: list[Server]) -> dict[int, int]:
    out = {s.port: s.rss_kib() for s in servers}
    print(f"\nRSS {label}: " + ", ".join(f":{p}={v / 1024:.1f} MiB" for p, v in out.items()), flush=True)
    return out
