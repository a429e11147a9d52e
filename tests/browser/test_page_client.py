"""The demo page on @switchboard/client: a replica restart and a page reload lose and repeat nothing.

Two real replicas behind the round-robin proxy (the load balancer), Debian's
Chromium driven by Playwright, as in test_page.py. The page's replica is
SIGTERMed and started again on the same port while events are published;
then the page is reloaded and events are published while it is away. The
table must hold every event exactly once; after the reload, exactly the
events published while the page was gone (resumed from the position the
package keeps in sessionStorage), then live ones.

A reload keeps the session when the server has refresh sessions (the page
calls POST auth/refresh on load); on a server without them the test logs in
again, which is what a user of that server does.
"""

from __future__ import annotations

import signal
from collections import Counter

import httpx
import pytest

from harness import Server, auth, make_user
from lbproxy import RoundRobinProxy
from test_page import WAIT, browser, log_in, page, publish, replica_id, row, shot  # noqa: F401

pytestmark = pytest.mark.browser


def table_ids(pg) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(i) for i in pg.locator("#event-rows tr[data-id]").evaluate_all("rows => rows.map(r => r.dataset.id)")]


def test_page_survives_replica_restart_and_reload(page, server_factory, db) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    dora = make_user(db, "dora")
    r1, r2 = server_factory(name="r1"), server_factory(name="r2")
    replicas = {replica_id(r1): r1, replica_id(r2): r2}
    proxy = RoundRobinProxy([("127.0.0.1", r1.port), ("127.0.0.1", r2.port)]).start()
    restarted: Server | None = None
    try:
        admin = r2.login("admin")
        assert httpx.put(f"{r2.base}/rooms/desk/members/{dora}", headers=auth(admin), timeout=30).status_code == 204
        conn = page.locator("#conn")
        page.goto(proxy.base + "/")
        log_in(page, "dora")
        expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
        page.get_by_label("Room name").fill("desk")
        page.get_by_label("Room name").press("Enter")
        expect(page.locator('#rooms li[data-room="desk"]')).to_have_attribute("data-status", "joined", timeout=WAIT)
        home_id = page.locator("#replica").inner_text()
        home = replicas[home_id]
        other = next(v for k, v in replicas.items() if k != home_id)

        e1 = publish(other, admin, user_id=dora, event="n", payload={"n": 1})
        e2 = publish(other, admin, room="desk", event="n", payload={"n": 2})
        expect(row(page, e2)).to_have_count(1, timeout=WAIT)

        # -- the page's replica restarts (SIGTERM, then a new process on the same port) ------------
        proxy.hold()
        home.proc.send_signal(signal.SIGTERM)
        expect(conn).to_have_attribute("data-state", "reconnecting", timeout=WAIT)
        e3 = publish(other, admin, user_id=dora, event="n", payload={"n": 3})
        e4 = publish(other, admin, room="desk", event="n", payload={"n": 4})
        assert home.proc.wait(timeout=60) == 0, home.log()
        restarted = Server(home.db_url, port=home.port, env={k: v for k, v in home.env.items()
                                                             if k.startswith("SWITCHBOARD_")},
                           log_dir=home.log_path.parent, name="r1-again").start()
        proxy.release()
        expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
        expect(row(page, e4)).to_have_count(1, timeout=WAIT)
        expect(page.locator("#notices")).to_contain_text(f"Resumed after event #{e2}: 2 missed event(s) replayed.")
        e5 = publish(restarted, admin, room="desk", event="n", payload={"n": 5})
        expect(row(page, e5)).to_have_count(1, timeout=WAIT)
        assert Counter(table_ids(page)) == Counter({e1: 1, e2: 1, e3: 1, e4: 1, e5: 1})
        shot(page, "08-after-replica-restart")

        # -- a reload: events published while the page is gone arrive once, nothing earlier again ---
        page.reload()
        e6 = publish(other, admin, user_id=dora, event="n", payload={"n": 6})
        e7 = publish(restarted, admin, room="desk", event="n", payload={"n": 7})
        page.wait_for_function("() => ['restored', 'none'].includes(document.body.dataset.session)", timeout=WAIT)
        if page.locator("body").get_attribute("data-session") == "none":   # a server without refresh sessions
            log_in(page, "dora")
        expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
        expect(row(page, e7)).to_have_count(1, timeout=WAIT)
        # resumed from where the page was before the reload (with refresh sessions the page may be
        # back before e6/e7 are published, and then they come live: either way, once each)
        expect(page.locator("#notices")).to_contain_text(f"Resumed after event #{e5}:")
        expect(page.locator('#rooms li[data-room="desk"]')).to_have_attribute("data-status", "joined", timeout=WAIT)
        e8 = publish(other, admin, room="desk", event="n", payload={"n": 8})
        expect(row(page, e8)).to_have_count(1, timeout=WAIT)
        assert table_ids(page) == [e8, e7, e6], "after the reload: the missed events once, then live"
        assert page.locator("#notices li[data-kind=resume_gap]").count() == 0
        shot(page, "09-after-reload")
        assert page.js_errors == []
    finally:
        proxy.stop()
        if restarted is not None:
            try:
                restarted.terminate(timeout=20)
            except Exception:
                restarted.kill()
