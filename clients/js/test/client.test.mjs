// @switchboard/client against real replicas: a throwaway Postgres, two
// `switchboard serve` processes and a round-robin proxy (test/replicas.py).
// Assertions are on what the client promises -- each event once, in order,
// the states it went through -- never on timings.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { HttpError, SwitchboardClient } from "../dist/index.js";
import { MemoryStorage, WAIT, ids, makeClient, startReplicas, until } from "./helpers.mjs";

let env;
const clients = [];
const user = (name) => env.users[name].id;

async function loggedIn(name, options = {}) {
  const c = makeClient(env, options);
  clients.push(c);
  await c.login(name, env.password);
  return c;
}

async function connected(c) {
  const n = c.rec.connected.length;
  c.connect();
  await until(c, () => c.rec.connected.length > n, "connected");
  return c.rec.connected.at(-1);
}

before(async () => { env = await startReplicas(2); }, { timeout: 240_000 });
after(async () => {
  for (const c of clients) c.disconnect();
  if (env) await env.stop();
});

describe("@switchboard/client on real replicas", { timeout: 600_000 }, () => {
  test("login, then events in order with every state transition observable", async () => {
    const c = await loggedIn("alice");
    assert.equal(c.user.id, user("alice"));
    assert.equal(c.state, "closed");
    const info = await connected(c);
    assert.equal(info.userId, user("alice"));
    assert.deepEqual(c.rec.states.map((s) => `${s.from}>${s.to}`), ["closed>connecting", "connecting>connected"]);
    const sent = [];
    for (let i = 0; i < 20; i++) sent.push(await env.admin.publish({ user_id: user("alice"), event: "n", payload: { i } }));
    await until(c, () => c.rec.events.length >= 20, "20 events");
    assert.deepEqual(ids(c), sent);
    assert.deepEqual(c.rec.events.map((f) => f.payload.i), [...Array(20).keys()]);
    // The resume position: the last event's opaque cursor on a server that sends cursors (and
    // then every event frame carries one), else its id.
    const last = c.rec.events.at(-1);
    if (info.hello.cursor !== undefined) {
      assert.ok(c.rec.events.every((f) => typeof f.cursor === "string"), "every event frame carries a cursor");
      assert.deepEqual(c.position(), { cursor: last.cursor, lastId: last.id });
    } else {
      assert.deepEqual(c.position(), { cursor: undefined, lastId: last.id });
    }
    c.disconnect();
    assert.equal(c.state, "closed");
    assert.equal(c.rec.closed.at(-1).code, 1000);
  });

  test("a wrong password is an HttpError 401 and no session", async () => {
    const c = makeClient(env);
    await assert.rejects(c.login("alice", "wrong-password"), (e) => e instanceof HttpError && e.status === 401);
    assert.equal(c.accessToken, null);
  });

  test("logout ends the session: the token is refused and connect() stops with the reason", async () => {
    const c = await loggedIn("carol");
    const token = c.accessToken;
    await c.logout();
    assert.equal(c.accessToken, null);
    const r = await fetch(env.proxy + "/me", { headers: { Authorization: `Bearer ${token}` } });
    assert.equal(r.status, 401);
    // A client with the dead token (as a second tab would hold) cannot get a ticket: it stops, not retries.
    const stale = makeClient(env, { getToken: () => token });
    clients.push(stale);
    stale.connect();
    await until(stale, () => stale.state === "closed", "closed");
    assert.equal(stale.rec.retries.length, 0);
    assert.match(stale.rec.closed.at(-1).reason, /session over/);
  });

  test("rooms: join, refused join, room events, leave; typing and presence", async () => {
    await env.admin.addMember("lobby", user("alice"));
    await env.admin.addMember("lobby", user("bob"));
    await env.admin.addMember("lobby", user("carol"));
    const a = await loggedIn("alice");
    const b = await loggedIn("bob");
    await connected(a);
    await connected(b);
    a.join("lobby");
    b.join("lobby");
    a.join("secret");   // alice is no member
    await until(a, () => a.roomStates().get("lobby") === "joined", "alice joined lobby");
    await until(b, () => b.roomStates().get("lobby") === "joined", "bob joined lobby");
    await until(a, () => a.rec.rooms.some((r) => r.room === "secret" && r.state === "refused"), "secret refused");
    assert.equal(a.roomStates().has("secret"), false);
    assert.equal(a.rec.errors.at(-1).code, "forbidden");

    const e1 = await env.admin.publish({ room: "lobby", event: "msg", payload: { text: "hi" } });
    await until(a, () => ids(a).includes(e1), "room event at alice");
    await until(b, () => ids(b).includes(e1), "room event at bob");
    assert.equal(a.rec.events.at(-1).room, "lobby");

    assert.equal(b.typing("lobby", { state: "typing" }), true);
    await until(a, () => a.rec.typing.length > 0, "typing at alice");
    const t = a.rec.typing.at(-1);
    assert.equal(t.room, "lobby");
    assert.equal(t.from, user("bob"));
    assert.deepEqual(t.payload, { state: "typing" });

    // Presence is kept by each replica's heartbeat (presence_sync repairs a row a concurrent
    // presence_set lost), so it converges within a heartbeat or two: poll, bounded.
    let online;
    for (const deadline = Date.now() + WAIT; Date.now() < deadline;) {
      const p = await a.presence("lobby");
      online = Object.fromEntries(p.members.map((m) => [m.username, m.online]));
      if (online.alice && online.bob) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.deepEqual(online, { alice: true, bob: true, carol: false });

    a.leave("lobby");
    const e2 = await env.admin.publish({ room: "lobby", event: "msg", payload: { text: "after leave" } });
    const mark = await env.admin.publish({ user_id: user("alice"), event: "mark", payload: {} });
    await until(a, () => ids(a).includes(mark), "own event after leave");
    await until(b, () => ids(b).includes(e2), "bob still in lobby");
    assert.equal(ids(a).includes(e2), false);
    a.disconnect();
    b.disconnect();
  });

  test("tools.register answers tool calls: result, unknown tool, a tool that throws", async () => {
    const c = await loggedIn("bob");
    c.tools.register("echo", (args) => args);
    c.tools.register("add", async ({ a, b }) => a + b);
    c.tools.register("boom", () => { throw new Error("tool failed"); });
    await connected(c);
    let r = await env.admin.toolCall(user("bob"), "echo", { n: [1, 2, 3] });
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, { result: { n: [1, 2, 3] } });
    r = await env.admin.toolCall(user("bob"), "add", { a: 2, b: 40 });
    assert.deepEqual(r.body, { result: 42 });
    r = await env.admin.toolCall(user("bob"), "nope", {});
    assert.equal(r.body.result.error, 'unknown tool "nope"');
    assert.deepEqual(r.body.result.tools.sort(), ["add", "boom", "echo"]);
    r = await env.admin.toolCall(user("bob"), "boom", {});
    assert.deepEqual(r.body, { result: { error: "tool failed" } });
    c.disconnect();
  });

  // A replica SIGTERMed mid-stream: reconnect elsewhere, resume, nothing lost or doubled.
  // With live=true the server's verified live path is on (V0020): frames go out before
  // the replica reads them and carry v2 cursors, which the client resumes from as it is.
  async function sigtermMidStream(live) {
    if (live) await env.sql("SELECT switchboard.event_live_path(true)");
    await env.admin.addMember("ops", user("alice"));
    const c = await loggedIn("alice", { rooms: ["ops"] });
    const first = await connected(c);
    assert.equal(c.roomStates().get("ops"), "joined");
    const home = first.replica;
    const other = env.replicas.find((r) => r.replica !== home);
    // Publish through the other replica the whole time, half to the user, half to the room.
    const sent = [];
    let stop = false;
    const publisher = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        const body = i % 2 ? { user_id: user("alice"), event: "tick", payload: { i } } : { room: "ops", event: "tick", payload: { i } };
        sent.push(await env.admin.publish(body, other.base));
      }
    })();
    await until(c, () => c.rec.events.length >= 30, "30 events before the SIGTERM");
    const term = await env.cmd({ cmd: "sigterm", replica: home });
    assert.equal(term.exit, 0);
    await until(c, () => c.rec.connected.length >= 2, "reconnected");
    const mark = sent.length;
    await until(c, () => sent.length >= mark + 30, "30 more published after the reconnect");
    stop = true;
    await publisher;
    await until(c, () => c.rec.events.length >= sent.length, `all ${sent.length} events`);
    assert.deepEqual(ids(c), sent, "every event once, in publish order");
    const again = c.rec.connected.at(-1);
    assert.notEqual(again.replica, home);
    assert.equal(again.resuming, true);
    assert.ok(c.rec.states.some((s) => s.to === "reconnecting" && s.code === 1012), "closed 1012 by the drain");
    assert.equal(c.roomStates().get("ops"), "joined", "the room was re-joined in the handshake");
    assert.equal(c.rec.gaps.length, 0);
    const v2 = c.rec.events.filter((f) => typeof f.cursor === "string" && f.cursor.startsWith("v2.")).length;
    if (live) assert.ok(v2 > 0, "no frame went out live (no v2 cursor)");
    else assert.equal(v2, 0, "a v2 cursor with the live path off");
    c.disconnect();
    // Back to two replicas for the tests that follow.
    const started = await env.cmd({ cmd: "start", name: "r3" });
    env.replicas = env.replicas.filter((r) => r.replica !== home).concat([started.replica]);
    if (live) await env.sql("SELECT switchboard.event_live_path(false)");
  }

  test("a replica SIGTERMed mid-stream: reconnect elsewhere, resume, nothing lost or doubled", async () => {
    await sigtermMidStream(false);
  });

  test("the same with the verified live path on: v2 cursors resume exactly", async () => {
    await sigtermMidStream(true);
  });

  test("3,000 events missed while away (and a page reload): all replayed once, in order", async () => {
    const storage = new MemoryStorage();
    const tab = await loggedIn("bob", { storage });
    await connected(tab);
    const before1 = await env.admin.publish({ user_id: user("bob"), event: "before", payload: {} });
    await until(tab, () => ids(tab).includes(before1), "the event before leaving");
    tab.disconnect();   // the page goes away ...
    const rows = await env.sql(
      "SELECT switchboard.notify_user(%s::uuid, 'away', jsonb_build_object('i', i)) FROM generate_series(1, 3000) i",
      [user("bob")]);
    const missed = rows.map((r) => Number(r[0]));
    assert.equal(missed.length, 3000);
    // ... and comes back as a new page (a new client) that finds the position in sessionStorage.
    const reloaded = await loggedIn("bob", { storage });
    const info = await connected(reloaded);
    assert.equal(info.resuming, true);
    await until(reloaded, () => reloaded.rec.resumed.length > 0, "resumed", 120_000);
    const live = await env.admin.publish({ user_id: user("bob"), event: "live", payload: {} });
    await until(reloaded, () => ids(reloaded).includes(live), "a live event after the replay", 120_000);
    assert.deepEqual(ids(reloaded), [...missed, live], "the missed events once, in order, then live");
    assert.equal(reloaded.rec.resumed[0].replayed, 3000);
    assert.equal(reloaded.rec.gaps.length, 0);
    reloaded.disconnect();
  });

  test("events reaped while away: resume_gap surfaced", async () => {
    const c = await loggedIn("carol");
    await connected(c);
    const e1 = await env.admin.publish({ user_id: user("carol"), event: "x", payload: {} });
    await until(c, () => ids(c).includes(e1), "e1");
    c.disconnect();
    await env.admin.publish({ user_id: user("carol"), event: "y", payload: {} });
    await env.sql("SELECT switchboard.reap_events('0 seconds')");
    await connected(c);
    await until(c, () => c.rec.gaps.length === 1, "resume_gap");
    c.disconnect();
  });

  test("a silent (hung) replica is noticed by the client's ping: reconnect elsewhere, resume", async () => {
    const c = await loggedIn("bob", { pingIntervalMs: 500, pongTimeoutMs: 1500, openTimeoutMs: 3000,
    httpTimeoutMs: 3000 });
    const first = await connected(c);
    const other = env.replicas.find((r) => r.replica !== first.replica);
    await env.cmd({ cmd: "signal", replica: first.replica, sig: "SIGSTOP" });
    try {
      const e = await env.admin.publish({ user_id: user("bob"), event: "while-hung", payload: {} }, other.base);
      await until(c, () => ids(c).includes(e), "the event, via another replica");
      assert.ok(c.rec.states.some((s) => s.to === "reconnecting" && s.code === 4000 && s.reason === "ping timeout"));
      assert.notEqual(c.rec.connected.at(-1).replica, first.replica);
    } finally {
      await env.cmd({ cmd: "signal", replica: first.replica, sig: "SIGCONT" });
    }
    c.disconnect();
  });

  test("disabling the user closes 1008: the client stops retrying and says why", async () => {
    const c = await loggedIn("carol");
    await connected(c);
    await env.sql("SELECT switchboard.disable_user(%s::uuid)", [user("carol")]);
    await until(c, () => c.state === "closed", "closed");
    const closed = c.rec.closed.at(-1);
    assert.equal(closed.code, 1008);
    assert.equal(closed.reason, "user disabled");
    assert.equal(c.rec.retries.length, 0, "no retry after a 1008");
    // and it stays closed
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(c.state, "closed");
    assert.equal(c.rec.states.filter((s) => s.to === "connecting").length, 1);
  });
});

test("constructor: no WebSocket in Node 20 without the flag is a clear error, not a hang", () => {
  const c = new SwitchboardClient({ url: "http://127.0.0.1:9/", WebSocket: undefined, storage: null });
  if (typeof globalThis.WebSocket === "undefined") assert.throws(() => c.connect(), /WebSocket/);
  else assert.equal(c.state, "closed");
});
