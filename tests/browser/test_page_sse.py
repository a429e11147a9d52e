"""The demo page in Chromium where WebSockets never open (a proxy that blocks upgrades, as the
page sees it): the client falls back to Server-Sent Events read with fetch streaming, joins a
room with a POST and shows user and room events published on another replica.

The page's WebSocket is replaced before any script runs by one that never opens (its close
event comes at once, as for an upgrade a proxy refused); everything else is the real
Chromium and two real replicas."""

from __future__ import annotations

import httpx
import pytest

from harness import auth, make_user
from test_page import WAIT, browser, log_in, page, publish, row  # noqa: F401

pytestmark = pytest.mark.browser

BLOCKED = """
window.__wsAttempts = 0;
window.WebSocket = class {
  constructor(url) {
    window.__wsAttempts++;
    this.readyState = 0; this.onopen = this.onmessage = this.onclose = this.onerror = null;
    setTimeout(() => { this.readyState = 3; this.onclose && this.onclose({ code: 1006, reason: "" }); }, 5);
  }
  send() { throw new Error("not open"); }
  close() {}
};
"""


def test_page_falls_back_to_sse_when_websockets_are_blocked(page, server_factory, db) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    dora = make_user(db, "dora")
    r1, r2 = server_factory(name="r1"), server_factory(name="r2")
    admin = r2.login("admin")
    assert httpx.put(f"{r2.base}/rooms/desk/members/{dora}", headers=auth(admin), timeout=30).status_code == 204
    page.add_init_script(BLOCKED)
    page.goto(r1.base + "/")
    log_in(page, "dora")
    expect(page.locator("#conn")).to_have_attribute("data-state", "connected", timeout=WAIT)
    assert page.evaluate("window.__wsAttempts") >= 2          # the WebSocket was tried first
    page.get_by_label("Room name").fill("desk")
    page.get_by_label("Room name").press("Enter")
    expect(page.locator('#rooms li[data-room="desk"]')).to_have_attribute("data-status", "joined", timeout=WAIT)
    e1 = publish(r2, admin, user_id=dora, event="n", payload={"n": 1})
    e2 = publish(r2, admin, room="desk", event="n", payload={"n": 2})
    expect(row(page, e1)).to_have_count(1, timeout=WAIT)
    expect(row(page, e2)).to_have_count(1, timeout=WAIT)
    streams = [ln for ln in httpx.get(r1.base + "/metrics", timeout=10).text.splitlines()
               if ln.startswith("switchboard_sse_streams_open ")]
    assert streams and float(streams[0].split()[1]) >= 1, streams
