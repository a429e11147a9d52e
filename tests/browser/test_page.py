"""The page at / in a real browser (Debian's Chromium, driven by Playwright), across replicas.

Two real `switchboard serve` processes share one Postgres; the browser reaches
them through ``RoundRobinProxy``, a layer-4 stand-in for the load balancer, so
the page only ever talks to its own origin (as in production: the server has
no CORS). Which replica the page's socket lands on is the balancer's choice;
the test reads it from the page (the hello frame's replica) and calls that
one "home", the other one "other". Events and tool calls are sent through
"other", so every delivery crosses replicas; then "home" gets SIGTERM.

No sleeps: every wait is on DOM state (Playwright's expect) or on a process.
If Playwright or Chromium is missing the test fails, it never skips:
tests/browser/install.sh installs both.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from harness import ROOT, auth, make_user, probe_token, seal_event_partition
from lbproxy import RoundRobinProxy

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("SWITCHBOARD_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
PASSWORD = "pw-" + "s" * 12
WAIT = 15_000  # ms: generous upper bounds for DOM waits; they return as soon as the state is reached


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(f"Playwright for Python is not installed ({exc}); run tests/browser/install.sh",
                    pytrace=False)
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; run tests/browser/install.sh (apt-get install chromium)",
                    pytrace=False)
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, timeout=60_000)
        except Exception as exc:
            pytest.fail(f"cannot launch {CHROMIUM}: {exc}", pytrace=False)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = ctx.new_page()
    pg.js_errors = []  # uncaught exceptions in the page's script
    pg.on("pageerror", lambda e: pg.js_errors.append(str(e)))
    yield pg
    ctx.close()


def shot(page, name: str) -> Path:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def replica_id(server) -> str:  # type: ignore[no-untyped-def]
    r = httpx.get(server.base + "/me", timeout=10, headers=auth(probe_token()))
    assert r.status_code == 200, r.text
    return r.json()["replica"]


def publish(server, token: str, **body) -> int:  # type: ignore[no-untyped-def]
    r = httpx.post(server.base + "/events", headers=auth(token), json=body, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def tool_call(server, token: str, user_id: str, name: str, args: object, timeout_ms: int = 10_000) -> httpx.Response:
    return httpx.post(server.base + "/tools/call", headers=auth(token), timeout=timeout_ms / 1000 + 30,
                      json={"user_id": user_id, "name": name, "args": args, "timeout_ms": timeout_ms})


def log_in(page, username: str, password: str = PASSWORD) -> None:  # type: ignore[no-untyped-def]
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_label("Password").press("Enter")  # Enter submits the form


def row(page, event_id: int):  # type: ignore[no-untyped-def]
    return page.locator(f'#event-rows tr[data-id="{event_id}"]')


def test_page_across_replicas_failover_resume_and_tool_calls(page, server_factory, db) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    alice = make_user(db, "alice")
    r1, r2 = server_factory(name="r1"), server_factory(name="r2")
    replicas = {replica_id(r1): r1, replica_id(r2): r2}
    proxy = RoundRobinProxy([("127.0.0.1", r1.port), ("127.0.0.1", r2.port)]).start()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        admin = r2.login("admin")
        r = httpx.put(f"{r2.base}/rooms/lobby/members/{alice}", headers=auth(admin), timeout=30)
        assert r.status_code == 204, r.text
        conn = page.locator("#conn")

        # -- log in and connect, through the balancer -----------------------------------
        page.goto(proxy.base + "/")
        expect(conn).to_have_attribute("data-state", "offline")
        expect(page.get_by_label("Username")).to_be_focused()
        shot(page, "01-login")
        log_in(page, "alice")
        expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
        expect(page.locator("#me")).to_have_text("alice")
        home_id = page.locator("#replica").inner_text()
        assert home_id in replicas, (home_id, list(replicas))
        home = replicas[home_id]
        other_id, other = next((k, v) for k, v in replicas.items() if k != home_id)

        # -- join a room with the keyboard (focus moved to the room field after login) --------
        room_field = page.get_by_label("Room name")
        expect(room_field).to_be_focused()
        room_field.type("lobby")
        room_field.press("Enter")
        expect(page.locator('#rooms li[data-room="lobby"]')).to_have_attribute("data-status", "joined",
                                                                              timeout=WAIT)

        # -- events published by a request the *other* replica serves reach the page ------------
        e1 = publish(other, admin, user_id=alice, event="order.shipped", payload={"order": 41})
        e2 = publish(other, admin, room="lobby", event="room.message", payload={"text": "hello lobby"})
        expect(row(page, e1)).to_have_count(1, timeout=WAIT)
        expect(row(page, e2)).to_have_count(1, timeout=WAIT)
        expect(row(page, e1)).to_contain_text("order.shipped")
        expect(row(page, e1)).to_contain_text('{"order":41}')
        expect(row(page, e2)).to_contain_text("lobby")
        expect(row(page, e2)).to_contain_text("hello lobby")

        # -- tool calls on the other replica, answered by the page ----------------------------------
        args = {"text": "ping from the test", "n": [1, 2, 3]}
        r = tool_call(other, admin, alice, "echo", args)
        assert r.status_code == 200, r.text
        assert r.json() == {"result": args}
        before = time.time() * 1000
        r = tool_call(other, admin, alice, "time", {})
        assert r.status_code == 200, r.text
        browser_time = r.json()["result"]
        assert abs(browser_time["epoch_ms"] - before) < 60_000 and browser_time["iso"].endswith("Z")
        r = tool_call(other, admin, alice, "no-such-tool", {})
        assert r.status_code == 200 and "unknown tool" in r.json()["result"]["error"]
        expect(page.locator('#tool-calls li[data-tool="echo"]')).to_have_attribute("data-answered", "true")
        shot(page, "02-connected-events-and-tools")

        # `confirm` asks the person; answered with the keyboard
        pending = pool.submit(tool_call, other, admin, alice, "confirm", {"message": "Deploy to production?"},
                              20_000)
        allow = page.get_by_role("button", name="Allow")
        expect(allow).to_be_visible(timeout=WAIT)
        expect(page.locator(".prompt")).to_contain_text("Deploy to production?")
        shot(page, "03-tool-confirm-prompt")
        allow.focus()
        page.keyboard.press("Enter")
        r = pending.result(timeout=30)
        assert r.status_code == 200, r.text
        assert r.json() == {"result": {"confirmed": True}}
        expect(page.locator(".prompt")).to_have_count(0)

        # -- SIGTERM the page's replica; publish while the page is disconnected ----------------------
        # hold(): the balancer parks new connections, so the page provably stays
        # disconnected until release() -- no race, no sleep.
        proxy.hold()
        home.proc.send_signal(signal.SIGTERM)
        expect(conn).to_have_attribute("data-state", "reconnecting", timeout=WAIT)
        expect(page.locator("#notices")).to_contain_text("server restarting")
        expect(page.locator("#replica")).to_have_text("\u2014")
        expect(page.locator("#replica-was")).to_have_text(f"(was {home_id})")
        e3 = publish(other, admin, user_id=alice, event="order.delivered", payload={"order": 41})
        e4 = publish(other, admin, room="lobby", event="room.message", payload={"text": "while you were away"})
        expect(conn).to_have_attribute("data-state", "reconnecting")
        assert row(page, e3).count() == 0 and row(page, e4).count() == 0
        shot(page, "04-reconnecting")
        assert home.proc.wait(timeout=60) == 0, home.log()   # drained and exited cleanly

        proxy.release()
        expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
        expect(page.locator("#replica")).to_have_text(other_id)
        expect(row(page, e3)).to_have_count(1, timeout=WAIT)
        expect(row(page, e4)).to_have_count(1, timeout=WAIT)
        expect(row(page, e4)).to_contain_text("while you were away")
        # rejoined the room, and resumed from the last id it had seen (e2): exactly e3 and e4
        expect(page.locator('#rooms li[data-room="lobby"]')).to_have_attribute("data-status", "joined")
        expect(page.locator("#notices")).to_contain_text(
            f"Resumed after event #{e2}: 2 missed event(s) replayed.")
        assert proxy.routed[("127.0.0.1", other.port)] >= 1

        # -- live again on the surviving replica ----------------------------------------------------------
        e5 = publish(other, admin, room="lobby", event="room.message", payload={"text": "back live"})
        expect(row(page, e5)).to_have_count(1, timeout=WAIT)
        r = tool_call(other, admin, alice, "echo", {"after": "failover"})
        assert r.status_code == 200 and r.json() == {"result": {"after": "failover"}}, r.text

        # nothing twice: one row per event id, and exactly the events published
        ids = page.locator("#event-rows tr[data-id]").evaluate_all("rows => rows.map(r => r.dataset.id)")
        counts = Counter(int(i) for i in ids)
        assert counts == Counter({e1: 1, e2: 1, e3: 1, e4: 1, e5: 1}), counts
        # newest first
        assert [int(i) for i in ids] == sorted(counts, reverse=True)
        assert page.locator("#notices li[data-kind=resume_gap]").count() == 0
        shot(page, "05-resumed-on-other-replica")
        assert page.js_errors == []
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        proxy.stop()


def test_page_keyboard_errors_and_manual_reconnect(page, server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """Labels, focus order, Enter submits, login errors, a refused join, Disconnect/Connect + resume."""
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    bob = make_user(db, "bob")
    srv = server_factory(name="solo")
    admin = srv.login("admin")
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    conn = page.locator("#conn")

    page.goto(srv.base + "/")
    assert page.title() == "Switchboard"
    expect(page.get_by_label("Username")).to_be_focused()
    page.keyboard.type("bob")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Password")).to_be_focused()
    page.keyboard.type("wrong-password")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Log in")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("alert")).to_have_text("Wrong username or password.", timeout=WAIT)
    expect(conn).to_have_attribute("data-state", "offline")
    shot(page, "06-login-error")

    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_label("Password").press("Enter")
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
    expect(page.locator("#replica")).to_have_text(replica_id(srv))

    # bob is no member of "secret": the join is refused, shown, and not kept
    page.get_by_label("Room name").fill("secret")
    page.get_by_label("Room name").press("Enter")
    expect(page.locator("#notices")).to_contain_text("not a member of room secret", timeout=WAIT)
    expect(page.locator('#rooms li[data-room="secret"]')).to_have_count(0)
    # an invalid name is refused by the page itself
    page.get_by_label("Room name").fill("no spaces")
    page.get_by_label("Room name").press("Enter")
    expect(page.locator("#notices")).to_contain_text('"no spaces" is not a valid room name')

    e1 = publish(srv, admin, user_id=bob, event="note", payload={"n": 1})
    expect(row(page, e1)).to_have_count(1, timeout=WAIT)

    # Disconnect, miss an event, Connect: resumed from e1, shown once
    page.get_by_role("button", name="Disconnect").click()
    expect(conn).to_have_attribute("data-state", "offline")
    e2 = publish(srv, admin, user_id=bob, event="note", payload={"n": 2})
    page.get_by_role("button", name="Connect").click()
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
    expect(row(page, e2)).to_have_count(1, timeout=WAIT)
    expect(page.locator("#notices")).to_contain_text(f"Resumed after event #{e1}: 1 missed event(s) replayed.")
    expect(row(page, e1)).to_have_count(1)

    # Missed events already reaped (older than the retention window): the page says so
    page.get_by_role("button", name="Disconnect").click()
    expect(conn).to_have_attribute("data-state", "offline")
    publish(srv, admin, user_id=bob, event="note", payload={"n": 3})
    seal_event_partition(db)                       # their partition is full: reap_events may drop it (V0037)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.event_tick()")   # retention counts from the tick that covers it
        assert c.execute("SELECT switchboard.reap_events('0 seconds')").fetchone()[0] >= 1
    page.get_by_role("button", name="Connect").click()
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT)
    expect(page.locator("#notices li[data-kind=resume_gap]")).to_have_count(1, timeout=WAIT)
    expect(page.locator("#notices li[data-kind=resume_gap]")).to_contain_text("Some events were missed")
    shot(page, "07-resume-gap-notice")

    # Log out: back to the login form, nothing of bob's left on the page
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_label("Username")).to_be_focused()
    expect(conn).to_have_attribute("data-state", "offline")
    expect(page.locator("#event-rows tr")).to_have_count(0)
    # the page is self-contained: it asked nothing of any other origin
    assert requests and all(u.startswith(srv.base + "/") or u.startswith(srv.ws_base + "/") for u in requests), requests
    assert page.js_errors == []
