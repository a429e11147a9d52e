"""/console in a real browser (Debian's Chromium driven by Playwright), on real data.

Two real `switchboard serve` processes share one PostgreSQL: c1 serves the
console with its scheduler off, c2 claims and runs everything, so every claim
and finish the page shows happened on the other replica. The data is made
through the public HTTP API: a scheduled task (Europe/Paris), a run that failed
(handler `fail`, one attempt), a run that is running (handler `sleep`), a
member with a socket in a room. The console, served by one replica, is driven
mostly from the keyboard:

- overview: the status() figures, both replicas with their readiness, the
  handlers (served / paused);
- tasks: the task with its zone and next fire; the editor's live preview of the
  next 5 fires (GET /console/cron-next) changes as the schedule is typed and
  shows SQL's refusal for a bad one; saving PATCHes the task;
- runs: Retry on the failed run and Cancel on the running one are clicked
  with the page's periodic refresh switched off and never reloaded, so what
  changes came from the actions' responses or the WebSocket; a retry and a
  cancel made by another operator on the other replica appear through stored
  `run.updated` events; the scheduler's own transitions on the other replica
  (the retry claimed and failing; a triggered run claimed, then succeeding)
  appear through the admin run feed's `run.updated` frames; the page then
  agrees with GET /runs;
- live: sockets and users online per replica, the room with its member online.

A screenshot of every view is saved under test-artifacts/console/.
No sleeps: every wait is on DOM state (Playwright's expect) or on the API.
"""

from __future__ import annotations

import json

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import ROOT, auth, make_user, probe_token

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("SWITCHBOARD_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts" / "console"
PASSWORD = "pw-" + "s" * 12
WAIT = 20_000  # ms: upper bounds for DOM waits; they return as soon as the state is reached


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(f"Playwright for Python is not installed ({exc}); run tests/browser/install.sh",
                    pytrace=False)
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; run tests/browser/install.sh", pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    pg.js_errors = []
    pg.on("pageerror", lambda e: pg.js_errors.append(str(e)))
    yield pg
    ctx.close()


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def api(server: Any, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, server.base + path, headers=auth(token), timeout=30, **kw)


def wait_for(pred: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def task_run(server: Any, token: str, task_id: str, status: str) -> dict:
    def latest() -> dict | None:
        runs = api(server, token, "GET", f"/tasks/{task_id}/runs?limit=1").json()["runs"]
        return runs[0] if runs and runs[0]["status"] == status else None
    return wait_for(latest, f"a {status} run of task {task_id}")


def log_in(page: Any, username: str) -> None:
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_label("Password").press("Enter")


def test_console_views_and_run_actions_on_real_data(page: Any, server_factory: Any, db: str) -> None:
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    alice = make_user(db, "alice")
    r1 = server_factory(name="c1", env={"SWITCHBOARD_SCHEDULER": "off"})  # the console's replica claims nothing
    r2 = server_factory(name="c2")
    admin = r1.login("admin")

    # -- the data, through the API -------------------------------------------------------
    def create(name: str, handler: str, **extra: Any) -> str:
        r = api(r1, admin, "POST", "/tasks", json={"name": name, "handler": handler, **extra})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    create("nightly-report", "noop", schedule="0 3 * * *", timezone="Europe/Paris")
    flaky = create("flaky-import", "fail", args={"message": "upstream said 503"}, max_attempts=1)
    long = create("long-export", "sleep", args={"seconds": 300})
    short = create("short-job", "sleep", args={"seconds": 3})
    for tid in (flaky, long):
        assert api(r1, admin, "POST", f"/tasks/{tid}/trigger").status_code == 202
    failed = task_run(r1, admin, flaky, "failed")
    running = task_run(r1, admin, long, "running")
    assert api(r2, admin, "PUT", f"/rooms/ops/members/{alice}").status_code == 204
    alice_ws = r2.ws(r2.login("alice"))
    try:
        # -- log in ------------------------------------------------------------------------
        page.goto(r1.base + "/console")
        expect(page.get_by_label("User name")).to_be_focused()
        log_in(page, "admin")
        expect(page.locator("#who")).to_have_text("admin")
        expect(page.locator("#conn")).to_contain_text("live via", timeout=WAIT)

        # -- overview ----------------------------------------------------------------------
        expect(page.locator("#tab-overview")).to_have_attribute("aria-selected", "true")
        expect(page.locator("#figures [data-item=runs_failed] dd")).to_have_text("1", timeout=WAIT)
        expect(page.locator("#figures [data-item=runs_running] dd")).to_have_text("1")
        expect(page.locator("#replicas tbody tr")).to_have_count(2, timeout=WAIT)
        expect(page.locator("#handlers tr[data-handler=fail]")).to_contain_text("served")
        expect(page.locator("#failover [data-item=db_timeline] dd")).to_have_text("1")
        shot(page, "1-overview")
        # Pause and resume a handler (POST /handlers/noop/pause|resume), from the keyboard.
        noop = page.locator("#handlers tr[data-handler=noop]")
        noop.get_by_role("button", name="Pause handler noop").focus()
        page.keyboard.press("Enter")
        expect(noop).to_contain_text("paused", timeout=WAIT)
        handlers = {h["name"]: h for h in api(r2, admin, "GET", "/handlers").json()["handlers"]}
        assert handlers["noop"]["paused"] is True
        noop.get_by_role("button", name="Resume handler noop").click()
        expect(noop.get_by_role("button", name="Pause handler noop")).to_be_visible(timeout=WAIT)
        handlers = {h["name"]: h for h in api(r2, admin, "GET", "/handlers").json()["handlers"]}
        assert handlers["noop"]["paused"] is False

        # -- tasks, from the keyboard --------------------------------------------------------
        page.keyboard.press("2")
        expect(page.locator("#tab-tasks")).to_be_focused()
        nightly = page.locator("#tasks tr[data-task=nightly-report]")
        expect(nightly).to_contain_text("Europe/Paris")
        expect(nightly).to_contain_text("0 3 * * *")
        expect(page.locator("#tasks tr[data-task=flaky-import]")).to_contain_text("failed")
        shot(page, "2-tasks")
        # Pause and resume the task (PATCH is_active).
        nightly.get_by_role("button", name="Pause nightly-report").click()
        expect(nightly.get_by_role("button", name="Resume nightly-report")).to_be_visible(timeout=WAIT)
        tasks = {x["name"]: x for x in api(r1, admin, "GET", "/tasks").json()["tasks"]}
        assert tasks["nightly-report"]["is_active"] is False
        nightly.get_by_role("button", name="Resume nightly-report").click()
        expect(nightly.get_by_role("button", name="Pause nightly-report")).to_be_visible(timeout=WAIT)
        nightly.get_by_role("button", name="Edit nightly-report").focus()
        page.keyboard.press("Enter")
        schedule = page.get_by_label("Schedule", exact=False)
        expect(schedule).to_be_focused()
        preview = page.locator("#preview-list li")
        expect(preview).to_have_count(5, timeout=WAIT)
        expect(preview.first).to_contain_text(":00:00Z")  # 03:00 in Paris, shown in UTC
        schedule.fill("*/15 * * * *")
        expect(preview).to_have_count(5, timeout=WAIT)
        fires = preview.all_inner_texts()
        minutes = {f.split(" ")[1][3:5] for f in fires}
        assert minutes <= {"00", "15", "30", "45"}, fires
        schedule.fill("61 * * * *")
        expect(page.locator("#preview-error")).to_be_visible(timeout=WAIT)
        schedule.fill("*/15 * * * *")
        expect(preview).to_have_count(5, timeout=WAIT)
        shot(page, "2-tasks-editor")
        schedule.press("Enter")  # submits the editor
        expect(page.locator("#editor")).not_to_be_visible()
        expect(nightly).to_contain_text("*/15 * * * *", timeout=WAIT)

        # -- runs: retry and cancel, seen live ------------------------------------------------
        page.keyboard.press("3")
        expect(page.locator("#tab-runs")).to_have_attribute("aria-selected", "true")
        failed_row = page.locator(f'#runs tr[data-run="{failed["id"]}"]')
        running_row = page.locator(f'#runs tr[data-run="{running["id"]}"]')
        expect(failed_row).to_have_attribute("data-status", "failed", timeout=WAIT)
        expect(running_row).to_have_attribute("data-status", "running")
        expect(failed_row).to_contain_text("upstream said 503")
        shot(page, "3-runs")
        # From here on the page refreshes only when told ("r"): what changes before
        # that came from the actions' responses or from run.updated frames.
        page.evaluate("clearInterval(window.switchboardConsole.state.timer); window.notReloaded = true")

        failed_row.get_by_role("button", name=f"Retry run {failed['id']}").click()
        retry_row = page.locator("#runs tbody tr", has_text=f"retry of {failed['id']}")
        expect(retry_row).to_have_count(1, timeout=WAIT)
        retry_id = retry_row.get_attribute("data-run")

        running_row.get_by_role("button", name=f"Cancel run {running['id']}").focus()
        page.keyboard.press("Enter")
        expect(running_row).to_have_attribute("data-status", "cancelled", timeout=WAIT)
        expect(running_row.get_by_role("button", name=f"Retry run {running['id']}")).to_be_visible()

        # Another operator acts on the other replica: the page hears it over its
        # WebSocket only (run.updated to every admin socket, on any replica).
        r = api(r2, admin, "POST", f"/runs/{running['id']}/retry")
        assert r.status_code == 201, r.text
        other_id = r.json()["run"]["id"]
        other_row = page.locator(f'#runs tr[data-run="{other_id}"]')
        expect(other_row).to_have_count(1, timeout=WAIT)
        expect(other_row).to_contain_text(f"retry of {running['id']}")
        assert api(r2, admin, "POST", f"/runs/{other_id}/cancel").status_code == 200
        expect(other_row).to_have_attribute("data-status", "cancelled", timeout=WAIT)
        # A run whose retry is listed offers no second Retry (the API would say 409).
        expect(running_row.get_by_role("button", name=f"Retry run {running['id']}")).to_have_count(0)

        # The scheduler's transitions on the other replica arrive over the admin run
        # feed: the retry, claimed by c2, fails there, and the row follows without a
        # refresh. A run triggered through c2 shows up, then is claimed (running, on
        # c2), then succeeds -- all without a reload.
        r2_replica = api(r2, admin, "GET", "/me").json()["replica"]
        expect(retry_row).to_have_attribute("data-status", "failed", timeout=WAIT)
        expect(retry_row).to_contain_text(r2_replica)
        assert api(r1, admin, "GET", f"/runs/{retry_id}").json()["run"]["status"] == "failed"
        assert api(r2, admin, "POST", f"/tasks/{short}/trigger").status_code == 202
        short_row = page.locator("#runs tbody tr", has_text="short-job")
        expect(short_row).to_have_attribute("data-status", "running", timeout=WAIT)
        expect(short_row).to_contain_text(r2_replica)
        shot(page, "3-runs-claim-live")
        expect(short_row).to_have_attribute("data-status", "succeeded", timeout=WAIT)
        assert page.evaluate("window.notReloaded === true")   # same document: nothing reloaded
        shot(page, "3-runs-after-retry-and-cancel")

        # The API agrees with what the page shows.
        runs = {str(r["id"]): r for r in api(r2, admin, "GET", "/runs?limit=50").json()["runs"]}
        assert runs[str(running["id"])]["status"] == "cancelled"
        assert runs[str(other_id)]["status"] == "cancelled"
        retries = [r for r in runs.values() if str(r.get("retry_of")) == str(failed["id"])]
        assert len(retries) == 1 and retries[0]["status"] == "failed", retries
        for rid, r in runs.items():
            row = page.locator(f'#runs tr[data-run="{rid}"]')
            if row.count():
                expect(row).to_have_attribute("data-status", r["status"])

        # A run's detail (GET /runs/{id}): arguments, error, attempts and timings as text.
        failed_row.get_by_role("button", name=f"Details of run {failed['id']}").click()
        detail = page.locator("#run-detail")
        expect(detail).to_be_visible()
        expect(page.locator("#run-detail-title")).to_have_text(f"Run {failed['id']} · fail")
        expect(detail.locator('dd[data-field="attempt"]')).to_have_text("1 of 1")
        expect(detail.locator('dd[data-field="status"]')).to_have_text("failed")
        expect(detail.locator('dd[data-field="task"]')).to_have_text("flaky-import")
        assert json.loads(page.locator("#run-detail-args").inner_text()) == {"message": "upstream said 503"}
        expect(page.locator("#run-detail-error")).to_contain_text("upstream said 503")
        expect(detail.get_by_role("button", name="Retry")).to_have_count(0)   # its retry is listed already
        shot(page, "3-run-detail")
        detail.get_by_role("button", name="Close").click()
        expect(detail).not_to_be_visible()

        # Filter by status, with the keyboard ("/" focuses the filter).
        page.keyboard.press("Escape")
        page.locator("body").focus()
        page.keyboard.press("/")
        expect(page.locator("#filter-status")).to_be_focused()
        page.locator("#filter-status").select_option("cancelled")  # a change applies the filter
        expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)
        expect(page.locator('#runs tbody tr[data-status="cancelled"]')).to_have_count(2)
        expect(running_row).to_be_visible()
        expect(other_row).to_be_visible()
        # Retry every cancelled run at once (POST /runs/retry with the filter), confirmed.
        bulk = page.locator("#runs-bulk")
        expect(bulk).to_have_text("Retry all matching")
        page.once("dialog", lambda d: d.accept())
        bulk.click()
        # Of the two cancelled runs, one is the other's retry: only the newest attempt goes.
        expect(page.locator("#toast")).to_contain_text("1 run retried", timeout=WAIT)
        retried = {str(r["retry_of"]) for r in api(r2, admin, "GET", "/runs?limit=100").json()["runs"]
                   if r.get("trigger") == "manual_retry"}
        assert str(other_id) in retried, retried

        # -- live ---------------------------------------------------------------------------
        page.locator("#tab-runs").focus()
        page.keyboard.press("ArrowRight")  # the tab bar: Left/Right move between views
        expect(page.locator("#tab-live")).to_be_focused()
        expect(page.locator("#live-replicas tbody tr")).to_have_count(2, timeout=WAIT)
        r2_id = httpx.get(r2.base + "/me", headers=auth(probe_token()), timeout=10).json()["replica"]
        r2_row = page.locator(f'#live-replicas tr[data-replica="{r2_id}"]')
        expect(r2_row).to_contain_text("alice", timeout=WAIT)
        room = page.locator("#live-rooms tr[data-room=ops]")
        expect(room.locator("td").nth(1)).to_have_text("1")
        expect(room.locator("td").nth(2)).to_have_text("1")
        shot(page, "4-live")

        # A reload keeps the session (the client's POST /auth/refresh with the HttpOnly
        # cookie; the access token was in memory only) and reconnects the socket.
        page.reload()
        expect(page.locator("#who")).to_have_text("admin", timeout=WAIT)
        expect(page.locator("#tab-live")).to_have_attribute("aria-selected", "true")
        expect(page.locator("#conn")).to_contain_text("live via", timeout=WAIT)
        assert page.evaluate("window.notReloaded") is None
        assert page.js_errors == []
    finally:
        alice_ws.close()


def test_console_refuses_members_and_its_reads_are_admin_only(page: Any, server_factory: Any, db: str) -> None:
    from playwright.sync_api import expect

    make_user(db, "bob")
    srv = server_factory(name="c3")
    r = httpx.get(srv.base + "/console", timeout=10)
    assert r.status_code == 200 and "frame-ancestors 'none'" in r.headers["content-security-policy"]
    bob = srv.login("bob")
    for path in ("/console/live", "/console/cron-next?schedule=@hourly"):
        assert httpx.get(srv.base + path, timeout=10).status_code == 401, path
        assert api(srv, bob, "GET", path).status_code == 403, path
    page.goto(srv.base + "/console")
    log_in(page, "bob")
    expect(page.locator("#login-error")).to_contain_text("not an administrator")
    assert page.js_errors == []
