"""Resuming a socket: replay what it missed, then live, exactly once, in order.

The one place that decides how a socket goes from "behind" to "live". The
WebSocket handler calls ``resume`` for the handshake (``cursor=`` / ``after=``)
and for the ``resume`` action; the relay's own catch-up after a LISTEN outage
is the same read (events after a position) on its side.

The stream is ordered by position (tick, id) (cursor.py). A resume:
1. turns what the client sent into a position: a cursor decodes to one; a bare
   event id N (the previous release's cursor) becomes (batch(N), N) -- exact
   for a client that processed frames in delivery order -- or, when N is not
   retained (reaped, or never seen by this cluster), a resume_gap;
2. if events after the position may have been reaped (event_window()), sends
   resume_gap and continues from the oldest retained tick;
3. replays events_since_v2(position .. through the newest tick T), paged, with
   back-pressure, while live frames for this socket are buffered; with a read
   replica (data/history.py) that keeps up, the pages up to the newest tick R it
   has replayed come from the replica and the primary continues from the last
   position sent through T (complete: a tick is taken after every event it
   covers committed, and a standby replays commits in order, so every event of a
   tick <= R is on the replica);
4. sends the buffered live frames after (T, END), in position order, dropping
   those at or before (T, END) (the replay had them), and turns live.
The relay read everything through T before or after the buffer started; any
batch after T reaches the socket live (it was registered before T was read),
so replay + buffer cover every event after the position exactly once.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from . import cursor
from .cursor import END, Position
from .data.events import EventQueries
from .db import Database
from .rows import UNREADABLE
from .sockets import Client, frame, replay_frame

LOG = logging.getLogger("switchboard.resume")

REPLAY_PAGE = 200   # events per events_since_v2() call during a resume
# A resume spanning fewer ticks than this stays on the primary (the live window: a read
# replica saves nothing on a few pages, and costs a round trip to ask what it has).
REPLICA_MIN_TICKS = 20


async def start_position(db: Database, after: Position | int) -> tuple[Position, bool]:
    """The position to replay from, and whether the client must be told resume_gap."""
    win = await db.event_window()
    gap_from = (int(win["first_tick"]), END)
    if isinstance(after, int):
        if after == 0:
            # "I have seen nothing": everything retained, after resume_gap only if an
            # event was actually reaped. Reaped ticks that held no event (reaped_through
            # still 0) lose nothing, so they are no reason to make the client reload.
            return gap_from, int(win["reaped_through"]) > 0
        else:
            tick = await db.event_batch(after)
            if tick is None:
                return gap_from, True       # not retained (or unknown): reload
            pos = (tick, after)
    else:
        pos = after
    if cursor.is_gap(pos, int(win["first_tick"])):
        return gap_from, True
    return pos, False


async def resume(db: Database, client: Client, after: Position | int, stall: float,
                 ahead: tuple[int, ...] = (), quiet: bool = False) -> None:
    """Replay what was missed after ``after`` (a position, or a bare event id), then live.

    ``ahead``: the ids a v2 cursor names (events sent live beyond its position, before
    their position was known): the client has them, so the replay skips them, and they
    stay in this socket's cursor until a read or this replay places them.

    Streamed with back-pressure: each frame waits for room in the socket's send
    queue, so an absence of any length inside the retention window replays
    completely, at the client's pace (a client that stops reading for ``stall``
    seconds is closed 1013). If the live buffer fills meanwhile, its stored events
    are dropped and the replay runs once more from where it stopped: they were in a
    tick before the relay read them, so that read has them. One resume at a time per
    socket (the relay's own catch-up of a slow socket, or the client's resume action).
    ``quiet``: no "resumed" frame (the relay's catch-up: the client asked for nothing)."""
    async with client.resume_lock:
        if not client.resuming:  # (a handshake-time or relay catch-up is already buffering)
            client.resuming = True
            client.buffer = []
        client.refetch = False
        shown: Any = after if isinstance(after, int) else cursor.encode(after, ahead)
        _take_ahead(client, ahead)
        try:
            replayed = await _replay(db, client, after, shown, stall)
        except BaseException:
            buffered, client.buffer, client.resuming = client.buffer, [], False
            for bpos, f in buffered:
                client.offer(f, pos=bpos)
            raise
        client.resuming = False
        if replayed >= 0 and not quiet:
            here = client.cursor()
            client.offer(frame("resumed", {"after": shown, "replayed": replayed, "cursor": here}, cursor=here))


def _take_ahead(client: Client, ahead: tuple[int, ...]) -> None:
    for eid in ahead:
        if eid not in client.sent_ids and eid not in client.ahead:
            client.sent_ids[eid] = None
            if len(cursor.encode(client.position, client.ahead + [eid])) <= cursor.MAX_LEN:
                client.ahead.append(eid)


async def _replay(db: Database, client: Client, after: Position | int, shown: Any, stall: float) -> int:
    """Replay pages, then the buffered live frames, until nothing was dropped meanwhile.
    How many events were replayed; -1 if the socket closed (too slow, or going away)."""
    pos, gap = await start_position(db, after)
    if gap:
        win = await db.event_window()
        client.offer(frame("resume_gap", {"after": shown, "horizon": int(win["reaped_through"]),
                                          "cursor": cursor.encode(pos)}, cursor=cursor.encode(pos)),
                     replay=True)
    replayed = 0
    while True:
        through = int((await db.event_window())["last_tick"])
        n, pos = await _replica_pages(db, client, pos, through, stall)
        m, pos = (n, pos) if n < 0 else await _pages(db, client, pos, through, stall)
        if m < 0:
            return -1
        replayed += n + m
        pos = max(pos, (through, END))
        if client.position < pos:
            client.position = pos
        if not client.refetch and not await _flush_buffer(client, pos, stall):
            return -1
        if not client.refetch:
            return replayed
        # Live events were dropped from the buffer (it filled): what it holds now no longer
        # follows what was sent, and sending it would move the position past the dropped
        # ones. Drop its stored events too and read again from the last frame sent.
        client.refetch = False
        client.buffer = [b for b in client.buffer if b[0] is None]
        pos = client.position


async def _replica_pages(db: Database, client: Client, pos: Position, through: int,
                         stall: float) -> tuple[int, Position]:
    """The part of the replay the read replica has (data/history.py), when one is usable and
    holds at least REPLICA_MIN_TICKS of it: pages there up to its newest replayed tick; the
    primary then continues from the last position sent. A read failing there ends this part
    early, at the last position sent: nothing is skipped, the primary reads the rest."""
    src = await db.history.replay_source(pos[0], through, REPLICA_MIN_TICKS)
    if src is None:
        return 0, pos
    reader, upto = src
    progress: list[Any] = [pos, 0]
    try:
        out = await _pages(reader, client, pos, upto, stall, progress)
    except (psycopg.Error, OSError) as exc:
        db.history.failed(exc)
        return progress[1], progress[0]
    db.history.served("resume", "replica")
    return out


async def _pages(db: EventQueries, client: Client, pos: Position, through: int,
                 stall: float, progress: list[Any] | None = None) -> tuple[int, Position]:
    """Pages of events_since_v2 through tick ``through``, sent with back-pressure: how many
    were sent (-1: the socket closed) and the last position. ``progress`` is kept at
    [position, sent] before each read (where a failed read on the replica left off)."""
    replayed = 0
    while True:
        if progress is not None:
            progress[0], progress[1] = pos, replayed
        rows = await db.events_since_v2(client.user_id, pos, sorted(client.rooms), through, REPLAY_PAGE)
        for r in rows:
            pos = r.position
            if r.payload is UNREADABLE:
                # skipped, as the relay skips it (EventStream._payload)
                LOG.warning("resume skipped event %d: its payload is nested too deep to parse", r.id)
                continue
            rpos, f = replay_frame(r)
            if client.has(r.id):
                client.confirm(r.id, rpos)   # the client has it (sent live, or earlier)
                continue
            if not await client.offer_wait(f, stall, replay=True, pos=rpos):
                return -1, pos
            replayed += 1
        if len(rows) < REPLAY_PAGE:
            return replayed, pos


async def _flush_buffer(client: Client, pos: Position, stall: float) -> bool:
    """The buffered live frames, in position order; new arrivals keep going to the
    buffer until it is empty, so nothing live can overtake them. Stops before the next
    frame once the buffer overflowed (client.refetch): the caller reads again."""
    while client.buffer and not client.refetch:
        client.buffer.sort(key=lambda b: (b[0] is None, b[0] or (0, 0)))
        bpos, f = client.buffer.pop(0)
        if bpos is not None and bpos <= pos:
            continue                    # the replay had it
        if not await client.offer_wait(f, stall, replay=True, pos=bpos):
            return False
    return True
