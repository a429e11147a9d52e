"""The admin run feed: run state changes pushed to the admin sockets that ask for them.

Why not an event per claim and finish: jobs/s is a benchmark target, and a stored
event (notify_admins) or a NOTIFY per claim and per finish would put the event
lock and a pg_notify on the job path. Instead the claim/finish path stays as it
is, and each replica that has at least one admin socket subscribed to the
``runs`` feed polls the database for runs that changed since it last looked,
at most once per ``interval`` (1 s), and sends what it found as one
``run.updated`` frame (id null, not stored, not replayable) to those sockets
only. A replica with no subscriber runs no query at all.

What one poll reads (FEED_SQL, one statement on a pooled connection; each part an
index range bounded by LIMIT ``MAX_RUNS``; docs/how-to/operations/console.md has its plan).
Row versions (``xmin``) are read from the tables, not the ``task_runs`` view (V0036:
queued and running runs in task_runs_hot, finished ones in task_runs_history, where a
finish moves them, so a finish is a new version too):
  * new runs: ``id >`` the highest id seen ``LOOKBACK`` s ago (primary key);
  * claims: running runs with ``started_at`` after the previous poll's
    ``now()`` minus ``LOOKBACK`` (task_runs_running: the running rows only);
  * finishes (succeeded, failed, abandoned, cancelled): ``finished_at`` after
    the same point (task_runs_history_finished);
  * releases (a run handed back to the queue by a stopping replica): queued
    runs whose ``run_at`` is in that window and due (task_runs_queued).
``started_at``/``finished_at`` are the claiming/finishing transaction's
``now()``, not its commit time, so each window reaches ``LOOKBACK`` s back; the
statement returns only ids and row versions (``xmin``: every claim, finish,
cancel or release writes a new one), and a version already sent is not sent
again (a bounded memory). Only when there are new versions does a second
statement (ROWS_SQL) read those runs, at most ``MAX_RUNS``, by primary key.
Indexes are the existing ones: no index and no write was added to task_runs, so
claims and finishes cost what they cost before.

Bounds: at most ``MAX_RUNS`` runs per part and per frame, the error text cut to
``ERROR_CHARS``, the frame kept under ``MAX_FRAME_BYTES``; when a part hit its
LIMIT on rows newer than the previous poll, or the frame was cut, the frame says
``"truncated": true`` and a console re-reads its page (GET /runs). The
subscriber set holds admin sockets of this replica only (members are refused);
the memory of sent states is capped at ``SENT_MAX``. Nothing here is sized by
what an outsider sends.

With a read replica (SWITCHBOARD_READ_DATABASE_URL, data/history.py) the version
scan runs there while it keeps up: its ``now`` is then the replica's last replayed
commit time (the windows follow what the replica has, not the clock), and when the
scan moves between the replica and the primary the id floors start again from the
new side and that frame says ``"truncated": true``. ROWS_SQL stays on the primary
(by primary key: the freshest state of each run).

Subscribing: ``feeds=runs`` in the WebSocket handshake, or the actions
``{"action": "subscribe", "feed": "runs"}`` / ``{"action": "unsubscribe", ...}``
(ws.py), answered with ``subscribed`` ({"feeds": [...]}, the socket's feeds).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from datetime import datetime, timedelta
from typing import Any

from .db import Database
from .metrics import Metrics
from .sockets import Client, encode, frame

LOG = logging.getLogger("switchboard.runfeed")

FEEDS = ("runs",)

# Step 1, every poll: which run versions are in the windows. Only ids and row versions
# (xmin: every claim, finish, cancel or release writes a new one), no formatting.
FEED_SQL = """
WITH p AS (
    SELECT coalesce(%(since)s::timestamptz, now() - %(lookback)s::interval) AS since
), floor AS (
    SELECT coalesce(%(floor)s::bigint, (SELECT max(id) FROM switchboard.task_runs)) AS id
), fresh AS (
    SELECT f.id, f.v, NULL::timestamptz AS at FROM (
        SELECT id, xmin::text::bigint AS v FROM switchboard.task_runs_hot WHERE id > (SELECT id FROM floor)
        UNION ALL
        SELECT id, xmin::text::bigint AS v FROM switchboard.task_runs_history WHERE id > (SELECT id FROM floor)
    ) f ORDER BY f.id DESC LIMIT %(n)s
), claimed AS (
    SELECT id, xmin::text::bigint AS v, started_at AS at FROM switchboard.task_runs_hot
     WHERE status = 'running' AND lease_expires_at IS NOT NULL AND started_at > (SELECT since FROM p)
     ORDER BY started_at DESC LIMIT %(n)s
), finished AS (
    SELECT id, xmin::text::bigint AS v, finished_at AS at FROM switchboard.task_runs_history
     WHERE finished_at > (SELECT since FROM p)
     ORDER BY finished_at DESC LIMIT %(n)s
), released AS (
    SELECT id, xmin::text::bigint AS v, run_at AS at FROM switchboard.task_runs_hot
     WHERE status = 'queued' AND run_at > (SELECT since FROM p) AND run_at <= now()
     ORDER BY run_at DESC LIMIT %(n)s
), hit AS (
    SELECT id, v FROM fresh UNION SELECT id, v FROM claimed UNION SELECT id, v FROM finished
    UNION SELECT id, v FROM released
)
SELECT CASE WHEN pg_is_in_recovery() THEN least(now(), coalesce(pg_last_xact_replay_timestamp(), now()))
            ELSE now() END AS now,
       (SELECT max(id) FROM switchboard.task_runs) AS max_id,
       (SELECT count(*) FROM fresh) AS fresh_n, (SELECT min(id) FROM fresh) AS fresh_min,
       (SELECT count(*) FROM claimed) AS claimed_n, (SELECT min(at) FROM claimed) AS claimed_min,
       (SELECT count(*) FROM finished) AS finished_n, (SELECT min(at) FROM finished) AS finished_min,
       (SELECT count(*) FROM released) AS released_n, (SELECT min(at) FROM released) AS released_min,
       coalesce((SELECT array_agg(id ORDER BY id DESC, v) FROM hit), '{}') AS ids,
       coalesce((SELECT array_agg(v ORDER BY id DESC, v) FROM hit), '{}') AS versions
"""

# Step 2, only when step 1 found versions not sent yet: those runs (at most MAX_RUNS, by
# primary key), as the stored run.updated event shows a run.
ROWS_SQL = """
SELECT coalesce(jsonb_agg(x.run ORDER BY x.id DESC), '[]'::jsonb) AS runs
  FROM unnest(%(ids)s::bigint[]) AS i(id)
 CROSS JOIN LATERAL (
       SELECT v.id, to_jsonb(v) - 'args' - 'result' - 'duration'
                    || jsonb_build_object('error', left(v.error, %(err)s)) AS run
         FROM switchboard.runs v WHERE v.id = i.id) x
"""


class RunFeed:
    """Per replica: the admin sockets subscribed to the runs feed, and the poller."""

    MAX_RUNS = 100             # rows per part of a poll, and runs per frame
    LOOKBACK = 1.5             # s: how far before the previous poll each window reaches
    ERROR_CHARS = 300
    MAX_FRAME_BYTES = 96 * 1024
    SENT_MAX = 5000

    def __init__(self, db: Database, interval: float = 1.0, metrics: Metrics | None = None) -> None:
        self.db = db
        self.interval = interval
        self.metrics = metrics
        self.subscribers: set[Client] = set()
        self.polls = 0             # statements run (tests)
        self._task: asyncio.Task[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self._prev_now: datetime | None = None
        self._prev_max: int | None = None
        self._floors: deque[tuple[float, int]] = deque()   # (loop time, max id then), LOOKBACK s of them
        self._sent: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._where: str | None = None   # where the last version scan ran (replica, primary)
        self._switched = False

    # -- subscriptions (called by ws.py) ------------------------------------------------------
    def subscribe(self, client: Client) -> bool:
        """Add an admin socket; False (and nothing kept) for anyone else."""
        if client.role != "admin" or client.closing is not None:
            return False
        self.subscribers.add(client)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="run-feed")
        return True

    def unsubscribe(self, client: Client) -> None:
        self.subscribers.discard(client)

    def feeds_of(self, client: Client) -> list[str]:
        return ["runs"] if client in self.subscribers else []

    async def stop(self) -> None:
        self.subscribers.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the poller ---------------------------------------------------------------------------
    def _live(self) -> list[Client]:
        # A socket closing, or whose user is no admin any more (a demotion closes it 1008
        # anyway), is dropped here too, so the set never outlives its sockets.
        for c in [c for c in self.subscribers if c.closing is not None or c.role != "admin"]:
            self.subscribers.discard(c)
        return list(self.subscribers)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._live():
                started = loop.time()
                try:
                    await self.poll_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:   # database down, pool timeout: try again next interval
                    LOG.warning("run feed poll failed: %s", exc)
                    self._count("switchboard_runfeed_polls_total", outcome="failed")
                else:
                    self._count("switchboard_runfeed_polls_total", outcome="ok")
                await asyncio.sleep(max(0.05, self.interval - (loop.time() - started)))
        finally:
            self._reset()   # the next activation starts from "now", not from a stale mark

    async def poll_once(self) -> None:
        first = self._prev_now is None
        prev_now, prev_max = self._prev_now, self._prev_max
        row = await self._read_versions()
        # A part that hit its LIMIT with all its rows newer than the previous poll may
        # have left some out: say so (the console re-reads its page).
        truncated = not first and (self._hit_limit(row, prev_now, prev_max) or self._switched)
        new = self._unsent(row["ids"], row["versions"])
        if len(new) > self.MAX_RUNS:        # four parts of up to MAX_RUNS each: a frame holds MAX_RUNS
            new = new[: self.MAX_RUNS]      # newest first (by id): keep the newest
            truncated = True
        runs: list[dict[str, Any]] = []
        if new:
            got = await self.db.fetchone(ROWS_SQL, {"ids": new, "err": self.ERROR_CHARS})
            self.polls += 1
            runs = list(got["runs"]) if got is not None else []
        if not runs and not truncated:
            return
        f, text = self._frame(runs, truncated)
        for c in self._live():
            c.offer(f, text)
            self._count("switchboard_runfeed_frames_total")

    async def _read_versions(self) -> dict[str, Any]:
        """Step 1 (FEED_SQL): the run versions in the windows; moves the windows on."""
        t = asyncio.get_running_loop().time()
        while len(self._floors) > 1 and t - self._floors[1][0] >= self.LOOKBACK:
            self._floors.popleft()
        floor = self._floors[0][1] if self._floors else None
        since = self._prev_now - timedelta(seconds=self.LOOKBACK) if self._prev_now is not None else None
        got, where = await self.db.history.feed_versions(
            FEED_SQL,
            {"floor": floor, "since": since, "lookback": timedelta(seconds=self.LOOKBACK),
             "n": self.MAX_RUNS, "err": self.ERROR_CHARS})
        self.polls += 1
        assert got is not None
        row: dict[str, Any] = got
        # The windows were measured on the other database (the read replica lags the primary):
        # the next ones start from this scan, and this frame says "truncated" (a console re-reads).
        self._switched = self._where is not None and where != self._where
        self._where = where
        if self._switched:
            self._floors.clear()
        self._prev_now = row["now"]
        max_id = int(row["max_id"] or 0)
        self._prev_max = max_id
        self._floors.append((t, max_id))
        return row

    def _hit_limit(self, row: dict[str, Any], prev_now: datetime | None, prev_max: int | None) -> bool:
        """Whether a part of FEED_SQL came back full with rows all newer than the previous poll."""
        n = self.MAX_RUNS
        return (row["fresh_n"] >= n and prev_max is not None and row["fresh_min"] > prev_max) or any(
            row[f"{p}_n"] >= n and prev_now is not None and row[f"{p}_min"] > prev_now
            for p in ("claimed", "finished", "released"))

    def _unsent(self, ids: list[int], versions: list[int]) -> list[int]:
        """The run ids (newest first, once each) with a version not sent yet; remembers them."""
        new: list[int] = []
        for rid, ver in zip(ids, versions):
            key = (rid, ver)
            if key in self._sent:
                continue
            self._sent[key] = None
            if len(self._sent) > self.SENT_MAX:
                self._sent.popitem(last=False)
            if not new or new[-1] != rid:
                new.append(rid)
        return new

    def _frame(self, runs: list[dict[str, Any]], truncated: bool) -> tuple[dict[str, Any], str]:
        """The run.updated frame and its text, cut to MAX_FRAME_BYTES (newest runs kept)."""
        while True:
            f = frame("run.updated", {"feed": "runs", "runs": runs, "truncated": truncated})
            text = encode(f)
            if len(text) <= self.MAX_FRAME_BYTES or not runs:
                return f, text
            runs = runs[: len(runs) // 2]     # newest first: keep the newest half
            truncated = True

    def _count(self, name: str, **labels: str) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, 1.0, **labels)
