"""Resuming a socket: replay what it missed, then live, with no gap and no duplicate.

The one place that decides how a socket goes from "behind" to "live". The
WebSocket handler calls ``resume`` for the handshake's ``after=`` and for the
``resume`` action.
"""

from __future__ import annotations

from .db import Database
from .sockets import Client, frame, frame_from_row

REPLAY_PAGE = 200   # events per events_since() call during a resume


async def resume(db: Database, client: Client, after: int, stall: float) -> None:
    """Replay what was missed, then live, with no gap and no duplicate.

    Live events are buffered while the replay runs; both are de-duplicated by
    event id (ids follow commit order, so the replay plus the buffer cover
    everything after `after`). The replay is paged (REPLAY_PAGE events per
    events_since() call) and streamed with back-pressure: each frame waits for
    room in the socket's send queue, so an absence of any length inside the
    retention window replays completely, at the client's pace (a client that
    stops reading for ``stall`` seconds is closed 1013). If the live
    buffer fills meanwhile, its stored events are dropped and one more page is
    fetched: they were committed before their NOTIFY arrived, so that page has
    them. A cursor below the event horizon gets resume_gap first.
    """
    if not client.resuming:  # (a handshake-time resume is already buffering)
        client.resuming = True
        client.buffer = []
    client.refetch = False
    replayed = 0
    try:
        horizon = await db.event_horizon()
        if after < horizon:
            client.offer(frame("resume_gap", {"after": after, "horizon": horizon}), replay=True)
        cursor = after
        while True:
            rows = await db.events_since(client.user_id, cursor, sorted(client.rooms), REPLAY_PAGE)
            for r in rows:
                if not await client.offer_wait(frame_from_row(r), stall, replay=True):
                    return                  # closed (too slow, or going away)
            replayed += len(rows)
            if rows:
                cursor = rows[-1]["id"]
            if len(rows) == REPLAY_PAGE:
                continue
            # The buffered live events, oldest first; new arrivals keep going to the
            # buffer until it is empty, so nothing live can overtake them.
            while client.buffer:
                client.buffer.sort(key=lambda f: (f.get("id") is None, f.get("id") or 0))
                f = client.buffer.pop(0)
                if not await client.offer_wait(f, stall, replay=True):
                    return
            if not client.refetch:
                break
            client.refetch = False          # live events were dropped: look once more
    except BaseException:
        buffered, client.buffer, client.resuming = client.buffer, [], False
        for f in buffered:
            client.offer(f)
        raise
    client.resuming = False
    if client.cursor < after:
        client.cursor = after
    client.offer(frame("resumed", {"after": after, "replayed": replayed}))
