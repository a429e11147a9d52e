"""The relay's reads are coalesced: at most one event read per SWITCHBOARD_RELAY_READ_GAP.

Every replica reads every event it is woken for (the trust boundary: a NOTIFY is
a hint, the event is read from the database). Without a gap a steady event rate
made a replica read back to back, so its statements grew with the rate. The
bound is by construction -- an event read starts no sooner than the gap after
the previous one started -- so it can be counted exactly: with a 0.2 s gap, 16
publishers committing 800 events as fast as they can cause at most
elapsed / 0.2 + 1 reads, and every event still reaches the socket once, in order.
"""

from __future__ import annotations

import threading
import time

import psycopg
from test_hostile_notify import scrape, value

from harness import make_user

GAP = 0.2
PUBLISHERS, EACH = 16, 50


def test_event_reads_are_at_most_one_per_gap_and_lose_nothing(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "gia")
    s = server_factory(env={"SWITCHBOARD_RELAY_READ_GAP": str(GAP)})
    ws = s.ws(s.login("gia"))
    ws.drain(0.5)
    before = scrape(s.base)
    errors: list[BaseException] = []

    def publish(k: int) -> None:
        try:
            with psycopg.connect(db, autocommit=True) as c:
                for i in range(EACH):
                    c.execute("SELECT switchboard.notify_user(%s, 'gap.n', %s)",
                              (uid, f'{{"k": {k}, "i": {i}}}'))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.monotonic()
    threads = [threading.Thread(target=publish, args=(k,)) for k in range(PUBLISHERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    got: list[tuple[int, int, int]] = []
    while len(got) < PUBLISHERS * EACH:
        f = ws.recv_until(lambda f: f.get("event") == "gap.n", timeout=30)
        got.append((f["id"], f["payload"]["k"], f["payload"]["i"]))
    elapsed = time.monotonic() - t0
    reads = value(scrape(s.base), "switchboard_relay_reads_total") - value(before, "switchboard_relay_reads_total")
    print(f"\nread gap {GAP} s: {len(got)} events in {elapsed:.2f} s took {reads:.0f} event reads "
          f"(bound {elapsed / GAP + 1:.0f})", flush=True)
    # every event once; each publisher's events in its commit order
    assert len(set(got)) == PUBLISHERS * EACH
    for k in range(PUBLISHERS):
        assert [i for _, kk, i in got if kk == k] == list(range(EACH))
    assert all(f.get("event") != "gap.n" for f in ws.drain(0.5))     # and nothing twice
    assert 1 <= reads <= elapsed / GAP + 1, (reads, elapsed)
