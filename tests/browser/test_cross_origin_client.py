"""@switchboard/client in a single-page app on another origin, in Chromium, through CORS.

The app is served by a plain static server on its own port (another origin,
like a Vite dev server on :5173 beside the API) with its own copy of the built
package, as an app bundles it. The replica allows that origin
(SWITCHBOARD_ALLOWED_ORIGINS). In the page: log in (the refresh cookie is
set cross-origin: credentials 'include' on the session endpoints), refresh,
call the API with the bearer token, open the socket and receive an event, log
out. A page on an origin that is not allowed cannot even log in.

Needs the server side of issue 19 (CORS and refresh sessions, COORD sessions
contract); on a server without them this test fails, by design.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT, free_port, make_user
from test_page import PASSWORD, WAIT, browser, page, publish  # noqa: F401

pytestmark = pytest.mark.browser

APP = """<!doctype html><html><head><meta charset="utf-8"><title>Other-origin app</title></head>
<body><p id="ready">loading</p>
<script type="module">
import { SwitchboardClient, HttpError } from "./switchboard-client.js";
window.HttpError = HttpError;
window.makeClient = (url) => {
  const sb = new SwitchboardClient({ url, storage: null });
  window.got = [];
  sb.on("event", (e) => window.got.push(e.id));
  return sb;
};
document.getElementById("ready").textContent = "ready";
</script></body></html>
"""


class StaticSite:
    """A static web server for one directory on 127.0.0.1:<port>: another origin."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "StaticSite":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript"}

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "app"
    d.mkdir()
    (d / "index.html").write_text(APP)
    shutil.copy(ROOT / "server" / "switchboard" / "static" / "switchboard-client.js", d / "switchboard-client.js")
    yield d


def test_app_on_another_origin_logs_in_refreshes_and_connects(page, server_factory, db, app_dir) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from playwright.sync_api import expect

    make_user(db, "admin", role="admin")
    erin = make_user(db, "erin")
    with StaticSite(app_dir) as allowed, StaticSite(app_dir) as foreign:
        srv = server_factory(name="cors", env={"SWITCHBOARD_ALLOWED_ORIGINS": allowed.origin})
        admin = srv.login("admin")
        api = srv.base + "/"

        page.goto(allowed.origin + "/index.html")
        expect(page.locator("#ready")).to_have_text("ready", timeout=WAIT)
        out = page.evaluate("""async ([api, password]) => {
            const sb = window.sb = makeClient(api);
            const login = await sb.login("erin", password);
            const refreshed = await sb.refresh();          // the cookie set cross-origin comes back
            const me = await sb.http("GET", "me");         // bearer token, CORS
            return { login, refreshed, me, token: sb.accessToken };
        }""", [api, PASSWORD])
        assert out["login"]["user_id"] == erin and out["login"]["role"] == "member"
        assert out["refreshed"]["user_id"] == erin
        assert out["refreshed"]["access_token"] != out["login"]["access_token"]
        assert out["me"]["user_id"] == erin
        assert out["token"] == out["refreshed"]["access_token"]

        page.evaluate("() => new Promise((ok) => { window.sb.on('connected', ok); window.sb.connect(); })")
        e1 = publish(srv, admin, user_id=erin, event="hello.from.api", payload={"n": 1})
        page.wait_for_function(f"() => window.got.includes({e1})", timeout=WAIT)

        closed = page.evaluate("""() => new Promise((ok) => {
            window.sb.on('closed', (s) => ok(s));
            window.sb.logout();
        })""")
        assert closed["to"] == "closed"
        after = page.evaluate("""async () => {
            try { await window.sb.refresh(); return "refreshed"; }
            catch (e) { return e instanceof HttpError ? e.status : String(e); }
        }""")
        assert after == 401, after   # the session ended with the logout

        # -- an origin that is not allowed: the browser refuses the answer, so no login ------------
        page.goto(foreign.origin + "/index.html")
        expect(page.locator("#ready")).to_have_text("ready", timeout=WAIT)
        refused = page.evaluate("""async ([api, password]) => {
            const sb = makeClient(api);
            try { await sb.login("erin", password); return "logged in"; }
            catch (e) { return e instanceof HttpError ? e.status : String(e); }
        }""", [api, PASSWORD])
        assert refused == 0, refused   # 0: no readable answer (a CORS refusal looks like a network error)
        assert page.js_errors == []
