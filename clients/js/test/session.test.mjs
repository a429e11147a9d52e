// Sessions (COORD sessions contract, server side by e19s): refresh with the
// HttpOnly cookie, a reload that stays logged in, logout closing the socket.
// Node's fetch keeps no cookies, so the client gets a cookie-keeping fetch --
// what a browser does with credentials: 'include'.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { HttpError } from "../dist/index.js";
import { Admin, MemoryStorage, cookieFetch, ids, makeClient, startReplicas, until } from "./helpers.mjs";

let env;
const clients = [];
const user = (name) => env.users[name].id;

function browserTab(options = {}) {
  const c = makeClient(env, { fetch: options.fetch ?? cookieFetch(), ...options });
  clients.push(c);
  return c;
}

before(async () => { env = await startReplicas(2); }, { timeout: 240_000 });
after(async () => {
  for (const c of clients) c.disconnect();
  if (env) await env.stop();
});

describe("sessions: refresh, reload, logout", { timeout: 300_000 }, () => {
  test("login sets the refresh cookie; refresh() rotates it and returns a new access token", async () => {
    const f = cookieFetch();
    const c = browserTab({ fetch: f });
    const first = await c.login("alice", env.password);
    assert.equal(first.user_id, user("alice"));
    assert.equal(first.role, "member");
    const before = new Map([...f.jar].map(([k, v]) => [k, v.value]));
    const second = await c.refresh();
    assert.equal(second.user_id, user("alice"));
    assert.notEqual(second.access_token, first.access_token);
    assert.equal(c.accessToken, second.access_token);
    const changed = [...f.jar].filter(([k, v]) => before.has(k) && before.get(k) !== v.value);
    assert.ok(changed.length >= 1, "the refresh cookie was rotated");
    const me = await c.http("GET", "me");
    assert.equal(me.user_id, user("alice"));
  });

  test("a reload stays logged in: a new client with the same cookies refreshes and resumes", async () => {
    const f = cookieFetch();
    const storage = new MemoryStorage();
    const tab = browserTab({ fetch: f, storage });
    await tab.login("bob", env.password);
    tab.connect();
    await until(tab, () => tab.state === "connected", "connected");
    const e1 = await env.admin.publish({ user_id: user("bob"), event: "a", payload: {} });
    await until(tab, () => ids(tab).includes(e1), "e1");
    tab.disconnect();
    const e2 = await env.admin.publish({ user_id: user("bob"), event: "b", payload: {} });
    const reloaded = browserTab({ fetch: f, storage });
    const r = await reloaded.refresh();    // no password: the cookie is the session
    assert.equal(r.user_id, user("bob"));
    reloaded.connect();
    await until(reloaded, () => ids(reloaded).includes(e2), "e2 after the reload");
    assert.deepEqual(ids(reloaded), [e2]);
  });

  test("logout ends the session: the socket closes 1008 and the client stops with the reason", async () => {
    const f = cookieFetch();
    const tab = browserTab({ fetch: f });
    await tab.login("carol", env.password);
    tab.connect();
    await until(tab, () => tab.state === "connected", "connected");
    // A second tab of the same session (same cookies), then the first logs out.
    const other = browserTab({ fetch: f });
    await other.refresh();
    other.connect();
    await until(other, () => other.state === "connected", "other connected");
    await tab.logout();
    assert.equal(tab.state, "closed");
    await until(other, () => other.state === "closed", "the other tab's socket closed");
    assert.equal(other.rec.closed.at(-1).code, 1008);
    assert.match(other.rec.closed.at(-1).reason, /session (ended|revoked)/);
    assert.equal(other.rec.retries.length, 0);
    await assert.rejects(other.refresh(), (e) => e instanceof HttpError && e.status === 401);
  });
});

describe("a connected tab outlives the session lifetime by refreshing", { timeout: 300_000 }, () => {
  const TTL = 8;   // SWITCHBOARD_SESSION_TTL: a session nobody refreshes for 8 s ends, and its sockets close
  let short;
  before(async () => { short = await startReplicas(1, { SWITCHBOARD_SESSION_TTL: String(TTL) }); }, { timeout: 240_000 });
  after(async () => { if (short) await short.stop(); });

  test("three lifetimes connected: no close, events still arrive, the token was renewed", async () => {
    const tab = makeClient(short, { fetch: cookieFetch() });
    clients.push(tab);
    const first = await tab.login("alice", short.password);
    assert.ok(first.expires_in <= TTL);
    tab.connect();
    await until(tab, () => tab.state === "connected", "connected");
    // Wall-clock time is the subject here: the server closes an unrefreshed session's sockets
    // TTL seconds after the last refresh. Wait three lifetimes.
    await new Promise((r) => setTimeout(r, 3 * TTL * 1000));
    const admin = await Admin.login(short.proxy, "admin", short.password);   // (the first admin token expired)
    const e = await admin.publish({ user_id: short.users.alice.id, event: "still-here", payload: {} });
    await until(tab, () => ids(tab).includes(e), "an event after three lifetimes");
    assert.equal(tab.state, "connected");
    assert.deepEqual(tab.rec.closed, []);
    assert.equal(tab.rec.connected.length, 1, "never reconnected: the same socket all along");
    assert.notEqual(tab.accessToken, first.access_token);
    tab.disconnect();
  });
});
