// The client's decisions in isolation (no server): a scripted WebSocket and fetch.
// Fast; covers what is awkward to provoke on real replicas -- exact close-code
// policy, backoff bounds and reset, duplicate frames, ticket per attempt, ping.
import assert from "node:assert/strict";
import { test } from "node:test";

import { StreamError, SwitchboardClient } from "../dist/index.js";
import { MemoryStorage } from "./helpers.mjs";

class FakeWS {
  static all = [];
  constructor(url) {
    this.url = new URL(url);
    this.readyState = 0;
    this.sent = [];
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    FakeWS.all.push(this);
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  close() { this.readyState = 3; }
  // -- the server's side --
  hello(extra = {}) {
    this.readyState = 1;
    this.onopen?.({});
    this.frame({ id: null, event: "hello", room: null, ts: 1,
      payload: { replica: "r1", user_id: "u1", username: "alice", role: "member", last_id: 10, rooms: [], ...extra } });
  }
  frame(f) { this.onmessage?.({ data: JSON.stringify({ room: null, ts: 1, payload: {}, ...f }) }); }
  drop(code, reason = "") { this.readyState = 3; this.onclose?.({ code, reason }); }
}

function setup(options = {}) {
  FakeWS.all = [];
  let n = 0;
  const fetch = async (url) => {
    const path = new URL(url).pathname;
    if (path.endsWith("/ws/ticket")) return new Response(JSON.stringify({ ticket: `t${++n}`, expires_in: 30 }), { status: 201 });
    if (path.endsWith("/auth/login")) {
      return new Response(JSON.stringify({ access_token: "a", token_type: "bearer", expires_in: 3600, user_id: "u1", role: "member" }), { status: 200 });
    }
    return new Response("{}", { status: 404 });
  };
  const c = new SwitchboardClient({ url: "http://sb.test/api/", WebSocket: FakeWS, fetch, storage: null,
    random: () => 0.5, backoff: { initialMs: 40, maxMs: 400, stableMs: 150 }, ...options });
  const rec = { states: [], retries: [], events: [], closed: [] };
  c.on("state", (s) => rec.states.push(`${s.from}>${s.to}`));
  c.on("retry", (r) => rec.retries.push(r));
  c.on("event", (f) => rec.events.push(f.id));
  c.on("closed", (s) => rec.closed.push(s));
  return { c, rec };
}

const socket = async (i) => {
  for (let k = 0; k < 2000 && FakeWS.all.length <= i; k++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(FakeWS.all[i], `socket ${i} was opened`);
  return FakeWS.all[i];
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("states, a ticket per attempt, handshake resume with rooms, backoff with jitter", async () => {
  const { c, rec } = setup({ rooms: ["ops"] });
  c.connect();
  const ws0 = await socket(0);
  assert.equal(ws0.url.pathname, "/api/ws");
  assert.equal(ws0.url.searchParams.get("ticket"), "t1");
  assert.equal(ws0.url.searchParams.get("after"), null, "nothing to resume from on the first connect");
  assert.equal(ws0.url.searchParams.get("rooms"), "ops");
  ws0.hello({ rooms: ["ops"] });
  assert.equal(c.state, "connected");
  assert.equal(c.roomStates().get("ops"), "joined");
  ws0.frame({ id: 11, event: "e" });
  ws0.frame({ id: 12, event: "e" });
  ws0.drop(1006);
  assert.equal(c.state, "reconnecting");
  assert.equal(rec.retries[0].attempt, 1);
  assert.equal(rec.retries[0].delayMs, 30, "0.75 x initialMs with random()=0.5");
  const ws1 = await socket(1);
  assert.equal(ws1.url.searchParams.get("ticket"), "t2", "a fresh ticket");
  assert.equal(ws1.url.searchParams.get("after"), "12");
  assert.equal(ws1.url.searchParams.get("rooms"), "ops");
  ws1.drop(1006);   // failed before hello: the delay grows
  assert.equal(rec.retries[1].delayMs, 60);
  const ws2 = await socket(2);
  ws2.hello({ rooms: ["ops"] });
  assert.deepEqual(rec.states, ["closed>connecting", "connecting>connected", "connected>reconnecting",
    "reconnecting>connected"]);
  await sleep(250);   // stayed up past stableMs: the backoff starts over
  ws2.drop(1011);
  assert.equal(rec.retries.at(-1).delayMs, 30);
  c.disconnect();
  assert.equal(c.state, "closed");
});

test("events once and in order: duplicates by id are dropped; cursor and after both sent", async () => {
  const { c, rec } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello({ cursor: "c-10" });
  for (const id of [11, 12, 12, 11, 13]) ws0.frame({ id, event: "e", cursor: `c-${id}` });
  assert.deepEqual(rec.events, [11, 12, 13]);
  assert.deepEqual(c.position(), { cursor: "c-13", lastId: 13 });
  ws0.frame({ id: 14, event: "e", cursor: "not a cursor!" });   // an invalid cursor is not stored
  assert.equal(c.position().cursor, "c-13");
  ws0.drop(1006);
  const ws1 = await socket(1);
  assert.equal(ws1.url.searchParams.get("cursor"), "c-13");
  // after= too: a previous-release replica (rolling update) ignores cursor= and resumes after the id
  assert.equal(ws1.url.searchParams.get("after"), "14");
  ws1.hello({ cursor: "c-99" });     // a reconnect keeps its own position, not hello's
  ws1.frame({ id: 13, event: "e" }); // replay overlap
  ws1.frame({ id: 15, event: "e" });
  assert.deepEqual(rec.events, [11, 12, 13, 14, 15]);
  c.disconnect();
});

test("close codes: 1012 at once (once in a row), 1013 backs off, 1008 stops with the reason", async () => {
  const { c, rec } = setup();
  c.connect();
  (await socket(0)).hello();
  FakeWS.all[0].drop(1012, "server restarting");
  assert.ok(rec.retries[0].delayMs < 100, "1012: at once");
  const ws1 = await socket(1);
  ws1.hello();
  ws1.drop(1012, "server restarting");
  assert.ok(rec.retries[1].delayMs >= 40, "a second 1012 in a row backs off");
  const ws2 = await socket(2);
  ws2.hello();
  ws2.drop(1013, "too slow");
  assert.ok(rec.retries[2].delayMs >= 0.5 * 40 * 4, "1013: at least the third step");
  const ws3 = await socket(3);
  ws3.hello();
  ws3.drop(1008, "user disabled");
  assert.equal(c.state, "closed");
  assert.deepEqual(rec.closed.at(-1), { from: "connected", to: "closed", code: 1008, reason: "user disabled" });
  const retries = rec.retries.length;
  await sleep(300);
  assert.equal(FakeWS.all.length, 4, "no reconnect after 1008");
  assert.equal(rec.retries.length, retries);
});

test("a silent socket is noticed by the ping and replaced", async () => {
  const { c, rec } = setup({ pingIntervalMs: 30, pongTimeoutMs: 60 });
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  await sleep(45);
  assert.deepEqual(ws0.sent.at(-1), { action: "ping" });
  ws0.frame({ id: null, event: "pong" });   // answered: still fine
  await sleep(45);
  assert.equal(c.state, "connected");
  // now nothing comes back
  const ws1 = await socket(1);
  assert.equal(rec.retries[0].code, 4000);
  assert.equal(rec.retries[0].reason, "ping timeout");
  ws1.hello();
  assert.equal(c.state, "connected");
  c.disconnect();
});

test("tool calls answered once, queued while disconnected; unknown tools answered with the list", async () => {
  const { c } = setup();
  c.tools.register("add", ({ a, b }) => a + b);
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const call = { id: null, event: "tool.call.6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60", payload: { name: "add", args: { a: 1, b: 2 } } };
  ws0.frame(call);
  ws0.frame(call);   // the same call twice
  await sleep(10);
  assert.deepEqual(ws0.sent.filter((f) => f.action === "publish"), [
    { action: "publish", event: "tool.result.6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60", payload: 3 }]);
  ws0.frame({ id: null, event: "tool.call.00000000-0000-0000-0000-000000000001", payload: { name: "nope", args: {} } });
  await sleep(10);
  assert.deepEqual(ws0.sent.at(-1).payload, { error: 'unknown tool "nope"', tools: ["add"] });
  // a slow tool whose socket is gone by the time it answers: sent after the next hello
  let release;
  c.tools.register("slow", () => new Promise((r) => { release = r; }));
  ws0.frame({ id: null, event: "tool.call.00000000-0000-0000-0000-000000000002", payload: { name: "slow" } });
  ws0.drop(1006);
  release({ done: true });
  const ws1 = await socket(1);
  assert.equal(ws1.sent.length, 0);
  ws1.hello();
  assert.deepEqual(ws1.sent, [{ action: "publish", event: "tool.result.00000000-0000-0000-0000-000000000002",
    payload: { done: true } }]);
  c.disconnect();
});

test("a throwing listener does not break the client; the error is re-thrown out of band", async () => {
  const { c, rec } = setup();
  const errors = [];
  const real = globalThis.queueMicrotask;
  globalThis.queueMicrotask = (fn) => { try { fn(); } catch (e) { errors.push(e.message); } };
  try {
    c.on("event", () => { throw new Error("listener bug"); });
    c.connect();
    const ws0 = await socket(0);
    ws0.hello();
    ws0.frame({ id: 11, event: "e" });
    ws0.frame({ id: 12, event: "e" });
  } finally {
    globalThis.queueMicrotask = real;
  }
  assert.deepEqual(rec.events, [11, 12]);
  assert.deepEqual(errors, ["listener bug", "listener bug"]);
  c.disconnect();
});

test("a malformed frame is reported out of band and the next frame is handled", async () => {
  const { c, rec } = setup();
  const errors = [];
  const real = globalThis.queueMicrotask;
  globalThis.queueMicrotask = (fn) => { try { fn(); } catch (e) { errors.push(e); } };
  try {
    c.connect();
    const ws0 = await socket(0);
    ws0.hello();
    ws0.onmessage({ data: '{"id":null,"event":"resumed","room":null,"ts":1,"payload":null}' });
    ws0.onmessage({ data: "not json" });
    ws0.onmessage({ data: "[1,2]" });
    ws0.frame({ id: 11, event: "e" });
  } finally {
    globalThis.queueMicrotask = real;
  }
  assert.equal(errors.length, 1);
  assert.deepEqual(rec.events, [11]);
  assert.equal(c.state, "connected");
  c.disconnect();
});

test("an expired access token: the ticket's 401 refreshes once and the attempt goes on", async () => {
  FakeWS.all = [];
  const calls = [];
  let token = "old";
  let refreshes = 0;
  const fetch = async (url, init) => {
    const path = new URL(url).pathname;
    calls.push(`${path} ${init.headers.Authorization ?? "-"} ${init.credentials}`);
    if (path.endsWith("/auth/refresh")) {
      refreshes++;
      if (refreshes === 1) {   // the two-tab race: 409 + Retry-After, then the rotated cookie works
        return new Response(JSON.stringify({ type: "about:blank", title: "Conflict", status: 409, detail: "retry" }),
          { status: 409, headers: { "Retry-After": "0.05", "Content-Type": "application/problem+json" } });
      }
      token = "new";
      return new Response(JSON.stringify({ access_token: "new", token_type: "bearer", expires_in: 60, user_id: "u1",
        role: "member" }), { status: 200 });
    }
    if (path.endsWith("/ws/ticket")) {
      if (init.headers.Authorization !== `Bearer ${token}` || token === "old") {
        return new Response(JSON.stringify({ title: "Unauthorized", status: 401, detail: "token expired",
          description: "token expired" }), { status: 401 });
      }
      return new Response(JSON.stringify({ ticket: "t", expires_in: 30 }), { status: 201 });
    }
    if (path.endsWith("/auth/login")) {
      return new Response(JSON.stringify({ access_token: "old", token_type: "bearer", expires_in: 60, user_id: "u1",
        role: "member" }), { status: 200 });
    }
    return new Response("{}", { status: 404 });
  };
  const c = new SwitchboardClient({ url: "http://sb.test/", WebSocket: FakeWS, fetch, storage: null });
  await c.login("alice", "pw");
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  assert.equal(c.state, "connected");
  assert.equal(c.accessToken, "new");
  assert.deepEqual(calls, [
    "/auth/login - include",
    "/ws/ticket Bearer old same-origin",
    "/auth/refresh - include",
    "/auth/refresh - include",
    "/ws/ticket Bearer new same-origin",
  ]);
  c.disconnect();
});

test("no session left: the ticket is refused, the refresh too: closed, no retry, with the reason", async () => {
  FakeWS.all = [];
  const fetch = async (url) => {
    const path = new URL(url).pathname;
    if (path.endsWith("/auth/refresh")) {
      return new Response(JSON.stringify({ type: "https://switchboard.dev/problems/session-ended", title: "Unauthorized",
        status: 401, detail: "the session has ended" }), { status: 401 });
    }
    return new Response(JSON.stringify({ title: "Unauthorized", status: 401, detail: "token revoked" }), { status: 401 });
  };
  const c = new SwitchboardClient({ url: "http://sb.test/", WebSocket: FakeWS, fetch, storage: null });
  const closed = [];
  const retries = [];
  c.on("closed", (s) => closed.push(s));
  c.on("retry", (r) => retries.push(r));
  c.connect();
  for (let k = 0; k < 400 && c.state !== "closed"; k++) await sleep(5);
  assert.equal(c.state, "closed");
  assert.equal(closed[0].code, 4003);
  assert.equal(closed[0].reason, "session over: token revoked");
  assert.equal(retries.length, 0);
  assert.equal(FakeWS.all.length, 0);
  const err = await c.refresh().catch((e) => e);
  assert.equal(err.status, 401);
  assert.equal(err.type, "https://switchboard.dev/problems/session-ended");
  assert.equal(err.detail, "the session has ended");
});

test("back online: a pending retry goes at once instead of waiting out the backoff", async () => {
  const handlers = {};
  globalThis.addEventListener = (t, f) => { handlers[t] = f; };
  globalThis.removeEventListener = (t, f) => { if (handlers[t] === f) delete handlers[t]; };
  try {
    const { c, rec } = setup({ backoff: { initialMs: 60_000, maxMs: 60_000 } });
    c.connect();
    (await socket(0)).hello();
    FakeWS.all[0].drop(1006);
    assert.ok(rec.retries[0].delayMs >= 30_000);
    handlers.online();
    const ws1 = await socket(1);
    ws1.hello();
    assert.equal(c.state, "connected");
    c.disconnect();
    assert.equal(handlers.online, undefined, "the listener goes with disconnect()");
  } finally {
    delete globalThis.addEventListener;
    delete globalThis.removeEventListener;
  }
});

test("while connected, the session is refreshed before the access token expires", async () => {
  FakeWS.all = [];
  let refreshes = 0;
  const body = (t) => JSON.stringify({ access_token: t, token_type: "bearer", expires_in: 0.2, user_id: "u1", role: "member" });
  const fetch = async (url) => {
    const path = new URL(url).pathname;
    if (path.endsWith("/auth/login")) return new Response(body("t0"), { status: 200 });
    if (path.endsWith("/auth/refresh")) return new Response(body(`t${++refreshes}`), { status: 200 });
    if (path.endsWith("/ws/ticket")) return new Response(JSON.stringify({ ticket: "x", expires_in: 30 }), { status: 201 });
    return new Response("{}", { status: 404 });
  };
  const c = new SwitchboardClient({ url: "http://sb.test/", WebSocket: FakeWS, fetch, storage: null });
  await c.login("alice", "pw");
  c.connect();
  (await socket(0)).hello();
  for (let k = 0; k < 4000 && refreshes < 2; k++) await sleep(5);
  assert.ok(refreshes >= 2, `refreshed ${refreshes} times`);
  assert.equal(c.accessToken, `t${refreshes}`);
  c.disconnect();
  const after = refreshes;
  await sleep(1500);
  assert.equal(refreshes, after, "no refreshing once nobody wants the socket");
});

test("feeds: in every handshake, subscribe/unsubscribe actions while connected, feed frames as events", async () => {
  const { c } = setup({ feeds: ["runs"] });
  const feed = [], subscribed = [], events = [];
  c.on("feed", (f) => feed.push(f));
  c.on("subscribed", (p) => subscribed.push(p.feeds));
  c.on("event", (f) => events.push(f.event));
  c.connect();
  const ws0 = await socket(0);
  assert.equal(ws0.url.searchParams.get("feeds"), "runs");
  ws0.hello({ feeds: ["runs"] });
  const run = { id: 7, handler: "sleep", status: "running", attempt: 1 };
  ws0.frame({ id: null, event: "run.updated", payload: { feed: "runs", runs: [run], truncated: false } });
  ws0.frame({ id: 21, event: "run.updated", payload: { run } });    // the stored event (cancel, retry)
  assert.deepEqual(feed.map((f) => f.payload.runs[0].id), [7]);
  assert.deepEqual(events, ["run.updated"], "a stored run.updated is an event, not a feed frame");
  c.unsubscribe("runs");
  assert.deepEqual(ws0.sent.at(-1), { action: "unsubscribe", feed: "runs" });
  ws0.frame({ id: null, event: "subscribed", payload: { feeds: [] } });
  assert.deepEqual(subscribed, [[]]);
  ws0.drop(1006);
  const ws1 = await socket(1);
  assert.equal(ws1.url.searchParams.get("feeds"), null, "an unsubscribed feed is not asked for again");
  ws1.hello();
  c.subscribe("runs");
  assert.deepEqual(ws1.sent.at(-1), { action: "subscribe", feed: "runs" });
  assert.deepEqual(c.feedNames(), ["runs"]);
  ws1.drop(1006);
  const ws2 = await socket(2);
  assert.equal(ws2.url.searchParams.get("feeds"), "runs");
  c.disconnect();
});

// ---- streams (docs/how-to/streams.md) --------------------------------------------------------------------
const SID = "6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60";
const chunks = (seq, ...data) => ({ id: null, event: "stream.chunks", payload: { stream: SID, seq, chunks: data } });
const end = (last_seq, status = "done", final = { text: "x" }) =>
  ({ id: null, event: "stream.end", payload: { stream: SID, status, last_seq, final } });
const streamFrames = (ws) => ws.sent.filter((f) => f.action?.startsWith("stream."));
/** Pull from an iterator until `n` chunks or its end; fails instead of hanging. */
async function pull(it, n = Infinity, ms = 1000) {
  const out = [];
  while (out.length < n) {
    const r = await Promise.race([it.next(), sleep(ms).then(() => { throw new Error(`no chunk after ${out.map((c) => c.seq)}`); })]);
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}
const pending = async (p, ms = 30) => (await Promise.race([p.then(() => "settled", () => "settled"), sleep(ms).then(() => "pending")])) === "pending";

test("stream: subscribes once connected, yields each chunk once and in order, ends at stream.end", async () => {
  const { c } = setup();
  const s = c.stream(SID);
  assert.equal(s.lastSeq, 0);
  c.connect();
  const ws0 = await socket(0);
  assert.deepEqual(streamFrames(ws0), [], "nothing before hello");
  ws0.hello();
  assert.deepEqual(streamFrames(ws0), [{ action: "stream.subscribe", stream: SID, after: 0 }]);
  ws0.frame(chunks(1, "Hel", "lo"));
  ws0.frame(chunks(2, "lo", ","));   // overlaps: seq 2 again
  ws0.frame(chunks(1, "Hel"));        // a duplicate
  ws0.frame(chunks(4, " wor", "ld"));
  ws0.frame({ id: null, event: "stream.chunks", payload: { stream: "00000000-0000-0000-0000-000000000000", seq: 1, chunks: ["other"] } });
  ws0.frame(end(5, "done", { text: "Hello, world" }));
  const got = [];
  for await (const ch of s) got.push(ch);
  assert.deepEqual(got, [{ seq: 1, data: "Hel" }, { seq: 2, data: "lo" }, { seq: 3, data: "," }, { seq: 4, data: " wor" },
    { seq: 5, data: "ld" }]);
  assert.deepEqual(await s.result, { status: "done", last_seq: 5, final: { text: "Hello, world" } });
  assert.equal(s.lastSeq, 5);
  assert.deepEqual(streamFrames(ws0), [{ action: "stream.subscribe", stream: SID, after: 0 }], "no unsubscribe after the end");
  c.stream(SID).return();   // the finished stream left the client: the id can be read again
  c.disconnect();
});

test("stream: after every reconnect it subscribes again with after = the last seq yielded", async () => {
  const { c } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID, { after: 2 });
  assert.deepEqual(streamFrames(ws0), [{ action: "stream.subscribe", stream: SID, after: 2 }]);
  ws0.frame(chunks(3, "c", "d", "e"));
  assert.deepEqual((await pull(s, 3)).map((x) => x.seq), [3, 4, 5]);
  ws0.drop(1006);
  const ws1 = await socket(1);
  ws1.hello();
  assert.deepEqual(streamFrames(ws1), [{ action: "stream.subscribe", stream: SID, after: 5 }]);
  ws1.frame(chunks(4, "d", "e", "f"));   // a server replaying a little too much: dropped up to 5
  assert.deepEqual(await pull(s, 1), [{ seq: 6, data: "f" }]);
  ws1.drop(1012);
  const ws2 = await socket(2);
  ws2.hello();
  assert.deepEqual(streamFrames(ws2), [{ action: "stream.subscribe", stream: SID, after: 6 }]);
  ws2.frame(end(6, "stopped", null));
  assert.deepEqual(await pull(s), []);
  assert.deepEqual(await s.result, { status: "stopped", last_seq: 6, final: null });
  c.disconnect();
});

test("stream: a gap unsubscribes and subscribes again after the last seq held", async () => {
  const { c } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID);
  ws0.frame(chunks(1, "a", "b"));
  ws0.frame(chunks(5, "e"));             // 3 and 4 are missing
  assert.deepEqual(streamFrames(ws0).slice(1), [{ action: "stream.unsubscribe", stream: SID },
    { action: "stream.subscribe", stream: SID, after: 2 }]);
  ws0.frame(chunks(6, "f"));             // still the old subscription (its answer is not in): no new resubscribe
  ws0.frame({ id: null, event: "stream.unsubscribed", payload: { stream: SID } });
  ws0.frame(chunks(3, "c", "d", "e"));
  ws0.frame(end(5));
  assert.deepEqual((await pull(s)).map((x) => x.data).join(""), "abcde");
  assert.equal(streamFrames(ws0).length, 3, "one resubscribe for one gap");
  c.disconnect();
});

test("stream: stream.end before every chunk arrived waits for them (subscribes again if the subscription is over)", async () => {
  const { c, rec } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID);
  ws0.frame(chunks(1, "a"));
  // the durable stream.end event (an id, via notify_user) overtaking the chunks: the result is known,
  // the iteration still waits for seq 2 and 3 from the subscription
  ws0.frame({ id: 11, event: "stream.end", payload: { stream: SID, status: "done", last_seq: 3, final: { n: 3 } } });
  assert.deepEqual(rec.events, [11]);
  assert.deepEqual(await s.result, { status: "done", last_seq: 3, final: { n: 3 } });
  assert.deepEqual(await pull(s, 1), [{ seq: 1, data: "a" }]);
  const more = s.next();
  assert.ok(await pending(more), "not done before seq 3");
  assert.equal(streamFrames(ws0).length, 1, "the stored event does not touch the subscription");
  ws0.frame(end(3));                    // the subscription's own end, still without chunks 2 and 3
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.subscribe", stream: SID, after: 1 });
  ws0.frame(chunks(2, "b", "c"));
  ws0.frame(end(3));
  assert.deepEqual((await more).value, { seq: 2, data: "b" });
  assert.deepEqual(await pull(s), [{ seq: 3, data: "c" }]);
  c.disconnect();
});

test("stream: stop() sends stream.stop when connected, POST /streams/{id}/stop when not", async () => {
  const calls = [];
  let status = 200;
  const fetch = async (url, init) => {
    const path = new URL(url).pathname;
    if (path.endsWith("/ws/ticket")) return new Response(JSON.stringify({ ticket: "t", expires_in: 30 }), { status: 201 });
    calls.push(`${init.method} ${path}`);
    if (path.endsWith("/streams")) {
      return new Response(JSON.stringify({ streams: [{ id: SID, room: null, kind: "completion", meta: {}, status: "open",
        last_seq: 7, opened_at: "2025-01-01T00:00:00Z" }] }), { status: 200 });
    }
    if (status === 404) return new Response(JSON.stringify({ title: "Not Found", status: 404, detail: "no such stream" }), { status: 404 });
    return new Response(JSON.stringify({ stream: SID, status: "stopped" }), { status: 200 });
  };
  const { c } = setup({ fetch });
  const s = c.stream(SID);
  await s.stop();                        // not connected: HTTP
  assert.deepEqual(calls, [`POST /api/streams/${SID}/stop`]);
  status = 404;
  const err = await s.stop().catch((e) => e);
  assert.equal(err.name, "StreamError");
  assert.equal(err.code, "stream_not_found");
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  await s.stop();
  assert.deepEqual(streamFrames(ws0), [{ action: "stream.subscribe", stream: SID, after: 0 },
    { action: "stream.stop", stream: SID }]);
  assert.equal(calls.length, 2, "no HTTP while connected");
  ws0.frame(chunks(1, "a"));
  ws0.frame(end(1, "stopped", null));
  assert.deepEqual(await pull(s), [{ seq: 1, data: "a" }]);
  assert.equal((await s.result).status, "stopped");
  const list = await c.streams();
  assert.equal(calls.at(-1), "GET /api/streams");
  assert.deepEqual(list.map((x) => [x.id, x.last_seq]), [[SID, 7]]);
  c.disconnect();
});

test("stream: stream_not_found rejects the iteration and the result with a StreamError", async () => {
  const { c } = setup();
  const errors = [];
  c.on("error", (p) => errors.push(p.code));
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID);
  const waiting = s.next();
  ws0.frame({ id: null, event: "error", payload: { code: "stream_not_found", message: "no such stream", action: "stream.subscribe", stream: SID } });
  const err = await waiting.catch((e) => e);
  assert.ok(err instanceof StreamError);
  assert.equal(err.code, "stream_not_found");
  assert.equal(err.stream, SID);
  assert.equal((await s.result.catch((e) => e)).code, "stream_not_found");
  assert.deepEqual(await s.next(), { value: undefined, done: true }, "rejected once, then done");
  assert.deepEqual(errors, ["stream_not_found"], "still an error event too");
  // an error of another stream, or of an unsubscribe, does not touch a stream
  const s2 = c.stream(SID);
  ws0.frame({ id: null, event: "error", payload: { code: "stream_not_found", message: "x", stream: "00000000-0000-0000-0000-000000000000" } });
  ws0.frame(chunks(1, "a"));
  assert.deepEqual(await pull(s2, 1), [{ seq: 1, data: "a" }]);
  c.disconnect();
});

test("stream: break and the signal unsubscribe; result rejects as closed / with the reason", async () => {
  const { c } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID);
  ws0.frame(chunks(1, "a", "b", "c"));
  for await (const ch of s) if (ch.seq === 2) break;
  assert.equal(s.lastSeq, 2);
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.unsubscribe", stream: SID });
  assert.equal((await s.result.catch((e) => e)).code, "closed");
  ws0.frame({ id: null, event: "stream.unsubscribed", payload: { stream: SID } });

  const ctl = new AbortController();
  const s2 = c.stream(SID, { signal: ctl.signal, after: 2 });
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.subscribe", stream: SID, after: 2 });
  const waiting = s2.next();
  ctl.abort();
  assert.equal((await waiting.catch((e) => e)).name, "AbortError");
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.unsubscribe", stream: SID });
  assert.equal((await s2.result.catch((e) => e)).name, "AbortError");
  const s3 = c.stream(SID, { signal: AbortSignal.abort() });   // aborted already: never subscribes
  assert.equal((await s3.next().catch((e) => e)).name, "AbortError");
  assert.equal(streamFrames(ws0).filter((f) => f.action === "stream.subscribe").length, 2);
  c.disconnect();
});

test("stream: the buffer is bounded: full -> unsubscribe, drained to half -> subscribe after the last seq held", async () => {
  const { c } = setup();
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID, { bufferSize: 4 });
  const letters = "abcdefghij".split("");
  ws0.frame(chunks(1, ...letters));       // 10 chunks, nobody pulling
  ws0.frame(chunks(11, "k"));             // in flight before the unsubscribe reached the server
  assert.deepEqual(streamFrames(ws0).slice(1), [{ action: "stream.unsubscribe", stream: SID }]);
  assert.equal(s.buf.length, 4, "at most bufferSize held (private in TypeScript)");
  assert.deepEqual((await pull(s, 1)).map((x) => x.data), ["a"]);
  assert.equal(streamFrames(ws0).length, 2, "3 buffered > half: still paused");
  assert.deepEqual((await pull(s, 1)).map((x) => x.data), ["b"]);
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.subscribe", stream: SID, after: 4 });
  c.disconnect();
});

/** A stream server on a FakeWS: answers stream.subscribe with the log after `after`, `per` chunks a
 *  frame every ms, then stream.end; stream.unsubscribe stops it (frames already sent stay sent). */
function streamServer(ws, log, per = 3) {
  let sub = null;
  const send = ws.send.bind(ws);
  ws.send = (text) => {
    send(text);
    const f = JSON.parse(text);
    if (f.stream !== SID) return;
    if (f.action === "stream.unsubscribe") {
      if (sub) clearInterval(sub);
      sub = null;
      ws.frame({ id: null, event: "stream.unsubscribed", payload: { stream: SID } });
    } else if (f.action === "stream.subscribe") {
      let next = (f.after ?? 0) + 1;
      sub = setInterval(() => {
        if (next > log.length) {
          clearInterval(sub);
          sub = null;
          ws.frame(end(log.length));
          return;
        }
        ws.frame(chunks(next, ...log.slice(next - 1, next - 1 + per)));
        next += per;
      }, 1);
    }
  };
}

test("stream: a slow consumer never has more than bufferSize chunks buffered, and gets every chunk once", async () => {
  const { c } = setup();
  c.connect();
  const ws0 = await socket(0);
  const log = Array.from({ length: 60 }, (_, i) => `t${i + 1} `);
  streamServer(ws0, log);
  ws0.hello();
  const s = c.stream(SID, { bufferSize: 8 });
  let most = 0;
  const got = [];
  for await (const ch of s) {
    got.push(ch);
    most = Math.max(most, s.buf.length);   // (private in TypeScript)
    await sleep(3);                        // slower than the server
  }
  assert.deepEqual(got.map((x) => x.seq), log.map((_, i) => i + 1));
  assert.equal(got.map((x) => x.data).join(""), log.join(""));
  assert.ok(most <= 8, `at most 8 buffered, saw ${most}`);
  const subs = ws0.sent.filter((f) => f.action === "stream.subscribe");
  assert.ok(subs.length > 2, `paused and resumed (${subs.length} subscriptions)`);
  assert.deepEqual(subs.map((f) => f.after), [...subs.map((f) => f.after)].sort((a, b) => a - b), "after only grows");
  assert.equal((await s.result).last_seq, 60);
  c.disconnect();
});

test("stream: an unsubscribed nobody asked for subscribes again; resume: true starts after the stored seq", async () => {
  const storage = new MemoryStorage();
  const { c } = setup({ storage });
  c.connect();
  const ws0 = await socket(0);
  ws0.hello();
  const s = c.stream(SID, { resume: true });
  assert.deepEqual(streamFrames(ws0), [{ action: "stream.subscribe", stream: SID, after: 0 }]);
  ws0.frame(chunks(1, "a", "b"));
  await pull(s, 2);
  ws0.frame({ id: null, event: "stream.unsubscribed", payload: { stream: SID } });   // the server dropped it
  assert.deepEqual(streamFrames(ws0).at(-1), { action: "stream.subscribe", stream: SID, after: 2 });
  c.disconnect();
  // a page reload: a new client on the same storage
  const { c: c2 } = setup({ storage });
  c2.connect();
  const ws1 = await socket(0);
  ws1.hello();
  const again = c2.stream(SID, { resume: true });
  assert.deepEqual(streamFrames(ws1), [{ action: "stream.subscribe", stream: SID, after: 2 }]);
  c2.stream("00000000-0000-0000-0000-000000000001");   // without resume: from 0
  c2.stream("00000000-0000-0000-0000-000000000002", { resume: true, after: 0 });   // after wins
  assert.deepEqual(streamFrames(ws1).slice(1).map((f) => f.after), [0, 0]);
  assert.throws(() => c2.stream(SID), /already being read/);
  c2.disconnect();
  await c2.logout().catch(() => {});
  assert.equal(storage.getItem("switchboard:resume:streams"), null, "logout forgets stream positions too");
  assert.equal((await again.result.catch((e) => e)).code, "closed", "and ends the streams being read");
  assert.deepEqual(await again.next(), { value: undefined, done: true });
});
