"""@switchboard/client as a user gets it: `npm pack` of the package directory alone, installed
from the tarball into a fresh project.

The package is packed from a COPY of clients/js with no Switchboard tree around it (so a
build that still reads ../../server fails here), its node_modules linked to the checkout's
(the dev tools: typescript, esbuild; nothing is downloaded). The tarball is installed with
`npm install --offline` (the package has no runtime dependencies), then:

  (a) an ESM .mjs file imports it with node (and require() where node can require ESM);
  (b) a TypeScript consumer compiles under tsc --strict, moduleResolution nodenext and bundler,
      with the shipped .d.ts checked too (skipLibCheck off);
  (c) it connects to a real replica (clients/js/test/replicas.py: a throwaway PostgreSQL and
      a real `switchboard serve`) and receives an event, and a room event through a room handle;
  (d) every relative link of the packed README resolves inside the tarball.

And the vendored AsyncAPI document (clients/js/asyncapi.json, what the build reads) is the
server's: a stale copy fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT

JS = ROOT / "clients" / "js"
TSC = JS / "node_modules" / "typescript" / "bin" / "tsc"


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, "npm_config_update_notifier": "false"})


def show(out: subprocess.CompletedProcess) -> str:
    return f"exit {out.returncode}\n--- stdout ---\n{out.stdout[-8000:]}\n--- stderr ---\n{out.stderr[-6000:]}"


def test_the_vendored_asyncapi_document_is_the_servers() -> None:
    """The package builds from its own copy of the protocol; it must be the one the server serves."""
    served = ROOT / "server" / "switchboard" / "static" / "asyncapi.json"
    vendored = JS / "asyncapi.json"
    assert vendored.read_bytes() == served.read_bytes(), \
        "clients/js/asyncapi.json is stale: run `npm run vendor:asyncapi` (or `npm run regen`) in clients/js and commit it"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node/npm are not installed; scripts/test.sh installs nodejs (Node >= 20)", pytrace=False)
    stamp = JS / "node_modules" / ".package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < (JS / "package-lock.json").stat().st_mtime:
        out = run(["npm", "ci", "--no-audit", "--no-fund"], JS)
        assert out.returncode == 0, show(out)
    base = tmp_path_factory.mktemp("js-package")
    # The package directory alone: no server/, no docs/ beside it; git-ignored outputs left out.
    pkg = base / "pkg"
    shutil.copytree(JS, pkg, ignore=shutil.ignore_patterns("node_modules", "dist", "*.tgz"))
    (pkg / "node_modules").symlink_to(JS / "node_modules", target_is_directory=True)
    out = run(["npm", "pack", "--pack-destination", str(base)], pkg)
    assert out.returncode == 0, show(out)
    tarballs = list(base.glob("switchboard-client-*.tgz"))
    assert len(tarballs) == 1, (tarballs, show(out))
    # The copy's build regenerated its frame types from the vendored document: the same as the checkout's.
    assert (pkg / "src" / "frames.ts").read_text() == (JS / "src" / "frames.ts").read_text()
    unpacked = base / "unpacked"
    with tarfile.open(tarballs[0]) as t:
        t.extractall(unpacked, filter="data")
    app = base / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "consumer", "private": True, "type": "module"}))
    out = run(["npm", "install", str(tarballs[0]), "--offline", "--no-audit", "--no-fund"], app)
    assert out.returncode == 0, show(out)
    return {"tgz": tarballs[0], "unpacked": unpacked / "package", "app": app}


def test_the_tarball_ships_the_build_and_nothing_of_the_checkout(packed: dict[str, Path]) -> None:
    with tarfile.open(packed["tgz"]) as t:
        names = set(t.getnames())
    for f in ("package/package.json", "package/README.md", "package/asyncapi.json", "package/dist/index.js",
              "package/dist/index.d.ts", "package/dist/client.d.ts", "package/dist/errors.d.ts",
              "package/dist/room.d.ts"):
        assert f in names, f"{f} is not in the tarball: {sorted(names)}"
    assert not [n for n in names if n.startswith(("package/test/", "package/scripts/", "package/node_modules/",
                                                  "package/examples/"))], sorted(names)
    pkg = json.loads((packed["unpacked"] / "package.json").read_text())
    assert not pkg.get("dependencies"), "no runtime dependencies"
    assert "prepack" in pkg["scripts"]


def test_a_mjs_file_imports_the_installed_package(packed: dict[str, Path]) -> None:
    app = packed["app"]
    (app / "esm.mjs").write_text("""
import * as sb from "@switchboard/client";
import { createRequire } from "node:module";
const names = Object.keys(sb).sort();
let required = null;
if (process.features.require_module) required = Object.keys(createRequire(import.meta.url)("@switchboard/client")).sort();
const e = new sb.AuthError("session_ended", "session ended", { closeCode: 1008 });
console.log(JSON.stringify({ names, required, auth: [e instanceof sb.SwitchboardError, e instanceof Error, e.name, e.code] }));
""")
    out = run(["node", "esm.mjs"], app)
    assert out.returncode == 0, show(out)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("SwitchboardClient", "HttpError", "StreamError", "SwitchboardStream", "SwitchboardError", "AuthError",
                 "ForbiddenError", "GoneError", "RateLimitedError", "ServerGoingAwayError", "SERVER_MESSAGES"):
        assert name in got["names"], got
    assert got["auth"] == [True, True, "AuthError", "session_ended"]
    if got["required"] is not None:   # node >= 20.19 / 22.12: require() of the ES module through "default"
        assert got["required"] == got["names"]


CONSUMER_TS = """
import { AuthError, RateLimitedError, SwitchboardClient, type AppEvent, type EventFrame, type StateChange }
  from "@switchboard/client";

interface Events {
  "chat.message": { text: string };
  "chat.deleted": { messageId: number };
}

export function consumer(): SwitchboardClient<Events> {
  const sb = new SwitchboardClient<Events>({ urls: ["http://a.test/", "http://b.test/"], storage: null });
  sb.on("event", (e) => {
    if (e.event === "chat.message") { const t: string = e.payload.text; console.log(t); }
    else { const n: number = e.payload.messageId; console.log(n); }
  });
  const room = sb.room("ops");
  room.on("chat.deleted", (e: AppEvent<Events, "chat.deleted">) => console.log(e.payload.messageId));
  // @ts-expect-error not an event of the map
  room.on("chat.unknown", () => {});
  sb.on("closed", (c: StateChange) => { if (c.error instanceof AuthError) console.log(c.error.code, c.code); });
  sb.on("retry", ({ error }) => { if (error instanceof RateLimitedError) console.log(error.retryAfter); });
  const plain = new SwitchboardClient({ url: "http://a.test/" });
  plain.on("event", (e: EventFrame) => console.log(e.payload));
  return sb;
}
"""


@pytest.mark.parametrize("resolution", ["nodenext", "bundler"])
def test_a_typescript_consumer_compiles_strict_against_the_installed_types(packed: dict[str, Path],
                                                                           resolution: str) -> None:
    app = packed["app"]
    (app / "consumer.ts").write_text(CONSUMER_TS)
    module = "nodenext" if resolution == "nodenext" else "es2022"
    (app / f"tsconfig.{resolution}.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "target": "es2022", "module": module,
                            "moduleResolution": resolution, "lib": ["es2022", "dom"], "types": [],
                            "skipLibCheck": False},
        "files": ["consumer.ts"],
    }))
    out = run(["node", str(TSC), "-p", f"tsconfig.{resolution}.json"], app)
    assert out.returncode == 0, show(out)


LIVE_MJS = """
// The installed package against a real replica: log in, connect, receive an event and a room event.
import { SwitchboardClient } from "@switchboard/client";

const env = JSON.parse(process.argv[2]);
const WAIT = 30_000;
const admin = await (await fetch(env.proxy + "/auth/login", { method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ username: "admin", password: env.password }) })).json();
const call = async (method, path, body) => {
  const r = await fetch(env.proxy + path, { method, body: body === undefined ? undefined : JSON.stringify(body),
    headers: { Authorization: `Bearer ${admin.access_token}`, "Content-Type": "application/json" } });
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
  return r.status === 204 ? null : r.json();
};
const alice = env.users.alice.id;
await call("PUT", `/rooms/pkg/members/${alice}`);

const sb = new SwitchboardClient({ url: env.proxy, storage: null });
await sb.login("alice", env.password);
const events = [];
const inRoom = [];
sb.on("event", (e) => events.push({ id: e.id, event: e.event, room: e.room, payload: e.payload }));
const pkg = sb.room("pkg");
pkg.on("note", (e) => inRoom.push(e.id));
const until = (pred, what) => new Promise((res, rej) => {
  if (pred()) return res();
  const offs = ["event", "state", "room"].map((n) => sb.on(n, () => { if (pred()) { done(); res(); } }));
  const t = setTimeout(() => { done(); rej(new Error(`timed out waiting for ${what}`)); }, WAIT);
  const done = () => { clearTimeout(t); offs.forEach((f) => f()); };
});
sb.connect();
await until(() => sb.state === "connected" && pkg.state === "joined", "connected with the room joined");
const own = (await call("POST", "/events", { user_id: alice, event: "hello", payload: { n: 1 } })).id;
const room = (await call("POST", "/events", { room: "pkg", event: "note", payload: { n: 2 } })).id;
await until(() => events.length >= 2, "both events");
sb.disconnect();
console.log(JSON.stringify({ own, room, events, inRoom, state: sb.state }));
"""


@pytest.fixture(scope="module")
def replica() -> Iterator[dict]:
    proc = subprocess.Popen([sys.executable, str(JS / "test" / "replicas.py"), "--replicas", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "replicas.py exited before it was ready"
        yield json.loads(line)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_installed_package_receives_events_from_a_real_replica(packed: dict[str, Path], replica: dict) -> None:
    app = packed["app"]
    (app / "live.mjs").write_text(LIVE_MJS)
    out = run(["node", "--experimental-websocket", "live.mjs", json.dumps(replica)], app, timeout=120)
    assert out.returncode == 0, show(out)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["events"] == [
        {"id": got["own"], "event": "hello", "room": None, "payload": {"n": 1}},
        {"id": got["room"], "event": "note", "room": "pkg", "payload": {"n": 2}},
    ]
    assert got["inRoom"] == [got["room"]]
    assert got["state"] == "closed"


def _anchor(heading: str) -> str:
    """GitHub's (and npm's) anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_packed_readme_resolves_inside_the_tarball(packed: dict[str, Path]) -> None:
    root = packed["unpacked"].resolve()
    text = (root / "README.md").read_text()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)   # links in code blocks are code
    anchors = {_anchor(h) for h in re.findall(r"^#{1,6}\s+(.+)$", prose, re.M)}
    links = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", prose, re.M)
    assert links, "the README links nothing (the check would check nothing)"
    broken = []
    for link in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I):   # https:, mailto: -- absolute, not ours to resolve
            continue
        path, _, frag = link.partition("#")
        if not path:
            if frag not in anchors:
                broken.append(f"{link}: no such heading")
            continue
        target = (root / path).resolve()
        if not target.is_relative_to(root) or not target.exists():
            broken.append(f"{link}: not in the package")
    assert not broken, broken
