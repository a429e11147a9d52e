// Issue 34's client-side additions against a scripted WebSocket (no server): the error
// classes on the events that carry codes, room handles, and several replica URLs.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AuthError, ForbiddenError, GoneError, HttpError, RateLimitedError, ServerGoingAwayError, StreamError, SwitchboardClient,
  SwitchboardError,
} from "../dist/index.js";
import { FakeWS, fakeFetch, json, socket } from "./fake.mjs";

const SID = "6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60";

function setup(options = {}, routes) {
  FakeWS.all = [];
  const fetch = fakeFetch(routes);
  const c = new SwitchboardClient({ url: "http://a.test/api/", WebSocket: FakeWS, fetch, storage: null,
    random: () => 0.5, backoff: { initialMs: 20, maxMs: 200, stableMs: 10_000 }, ...options });
  const rec = { retries: [], closed: [], states: [], errors: [], gaps: [] };
  c.on("retry", (r) => rec.retries.push(r));
  c.on("closed", (s) => rec.closed.push(s));
  c.on("state", (s) => rec.states.push(s));
  c.on("error", (p) => rec.errors.push(p));
  c.on("resume_gap", (p) => rec.gaps.push(p));
  return { c, rec, fetch };
}

const until = async (pred, what) => {
  for (let k = 0; k < 2000 && !pred(); k++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(pred(), what);
};

test("close codes come with an error class; the events' own fields, and their JSON, are unchanged", async () => {
  const { c, rec } = setup();
  c.connect();
  (await socket(0)).hello();
  FakeWS.all[0].drop(1012, "server restarting");
  let r = rec.retries.at(-1);
  assert.ok(r.error instanceof ServerGoingAwayError && r.error instanceof SwitchboardError && r.error instanceof Error);
  assert.equal(r.error.code, "service_restart");
  assert.equal(r.error.closeCode, 1012);
  assert.equal(r.error.message, "server restarting");
  assert.equal(r.error.name, "ServerGoingAwayError");
  assert.equal(rec.states.at(-1).error, r.error, "the reconnecting state change carries the same error");
  assert.deepEqual(Object.keys(r), ["attempt", "delayMs", "code", "reason"], "error is not enumerable");
  assert.equal(JSON.stringify(rec.states.at(-1)), '{"from":"connected","to":"reconnecting","code":1012,"reason":"server restarting"}');

  (await socket(1)).hello();
  FakeWS.all[1].drop(1013, "client too slow");
  r = rec.retries.at(-1);
  assert.ok(r.error instanceof RateLimitedError);
  assert.equal(r.error.code, "try_again_later");
  assert.equal(r.error.retryAfter, 0);

  (await socket(2)).hello();
  FakeWS.all[2].drop(1006);
  assert.ok(rec.retries.at(-1).error instanceof SwitchboardError);
  assert.equal(rec.retries.at(-1).error.code, "connection_lost");
  assert.equal(rec.retries.at(-1).error.constructor, SwitchboardError);

  (await socket(3)).hello();
  FakeWS.all[3].drop(1008, "session ended");
  const closed = rec.closed.at(-1);
  assert.equal(c.state, "closed");
  assert.deepEqual({ ...closed }, { from: "connected", to: "closed", code: 1008, reason: "session ended" });
  assert.ok(closed.error instanceof AuthError);
  assert.equal(closed.error.code, "session_ended");
});

test("1008 user disabled is a ForbiddenError, frame rate exceeded a RateLimitedError; disconnect() has none", async () => {
  for (const [reason, cls, code] of [["user disabled", ForbiddenError, "user_disabled"],
    ["frame rate exceeded", RateLimitedError, "frame_rate_exceeded"], ["session revoked", AuthError, "session_revoked"]]) {
    const { c, rec } = setup();
    c.connect();
    (await socket(0)).hello();
    FakeWS.all[0].drop(1008, reason);
    assert.ok(rec.closed.at(-1).error instanceof cls, reason);
    assert.equal(rec.closed.at(-1).error.code, code);
  }
  const { c, rec } = setup();
  c.connect();
  (await socket(0)).hello();
  c.disconnect();
  assert.equal(rec.closed.at(-1).code, 1000);
  assert.equal(rec.closed.at(-1).error, undefined);
});

test("the ticket refused: 429 is a RateLimitedError with retryAfter, 401 (no refresh) an AuthError with the HttpError", async () => {
  let limited = true;
  const { c, rec } = setup({}, (u) => {
    if (u.pathname.endsWith("/ws/ticket") && limited) {
      limited = false;
      return json({ title: "Too Many Requests", status: 429, detail: "slow down" }, 429, { "Retry-After": "0.05" });
    }
    return undefined;
  });
  c.connect();
  await until(() => rec.retries.length === 1, "a retry after the 429");
  const e = rec.retries[0].error;
  assert.ok(e instanceof RateLimitedError);
  assert.equal(e.code, "rate_limited");
  assert.equal(e.retryAfter, 0.05);
  assert.equal(e.status, 429);
  assert.equal(e.closeCode, 4002);
  assert.ok(e.cause instanceof HttpError);
  (await socket(0)).hello();
  c.disconnect();

  const s = setup({ getToken: () => "dead" }, (u) => (u.pathname.endsWith("/ws/ticket")
    ? json({ title: "Unauthorized", status: 401, detail: "token revoked" }, 401) : undefined));
  s.c.connect();
  await until(() => s.c.state === "closed", "closed");
  const closed = s.rec.closed.at(-1);
  assert.equal(closed.code, 4003);
  assert.equal(closed.reason, "session over: token revoked");
  assert.ok(closed.error instanceof AuthError);
  assert.equal(closed.error.code, "unauthorized");
  assert.equal(closed.error.status, 401);
  assert.equal(s.rec.retries.length, 0);
});

test("error frames and resume_gap: ForbiddenError, RateLimitedError, StreamError, GoneError; the payload's fields kept", async () => {
  const { c, rec } = setup();
  c.connect();
  const ws = await socket(0);
  ws.hello();
  ws.frame({ id: null, event: "error", payload: { code: "forbidden", message: "not a member of room x", action: "join", room: "x" } });
  ws.frame({ id: null, event: "error", payload: { code: "rate_limited", message: "too many frames; slow down" } });
  ws.frame({ id: null, event: "error", payload: { code: "stream_not_found", message: "no such stream", action: "stream.subscribe", stream: SID } });
  ws.frame({ id: null, event: "error", payload: { code: "bad_json", message: "frames must be JSON objects" } });
  ws.frame({ id: null, event: "resume_gap", payload: { after: 3, horizon: 40, cursor: "c-40" } });
  const [f, l, s, b] = rec.errors;
  assert.deepEqual({ ...f }, { code: "forbidden", message: "not a member of room x", action: "join", room: "x" });
  assert.ok(f.error instanceof ForbiddenError);
  assert.equal(f.error.code, "forbidden");
  assert.ok(l.error instanceof RateLimitedError);
  assert.ok(s.error instanceof StreamError && s.error instanceof SwitchboardError);
  assert.equal(s.error.stream, SID);
  assert.equal(b.error.code, "bad_json");
  assert.equal(b.error.constructor, SwitchboardError);
  const gap = rec.gaps[0];
  assert.deepEqual({ ...gap }, { after: 3, horizon: 40, cursor: "c-40" });
  assert.ok(gap.error instanceof GoneError);
  assert.equal(gap.error.code, "resume_gap");
  assert.equal(gap.error.horizon, 40);
  c.disconnect();
});

test("room handles: joined as join() does, only that room's named events, typing, presence, leave", async () => {
  const { c, fetch } = setup({}, (u) => (u.pathname.endsWith("/rooms/ops/members")
    ? json({ room: "ops", members: [{ user_id: "u1", username: "alice", online: true }] }) : undefined));
  const ops = c.room("ops");
  assert.equal(c.room("ops"), ops, "one handle per name");
  assert.equal(ops.name, "ops");
  assert.equal(ops.state, "joining");
  const got = [];
  const all = [];
  const off = ops.on("msg", (e) => got.push(e.id));
  ops.on("other", (e) => all.push(e.id));
  c.connect();
  const ws0 = await socket(0);
  assert.equal(ws0.url.searchParams.get("rooms"), "ops", "in the handshake, as rooms joined with join()");
  ws0.hello({ rooms: ["ops"] });
  assert.equal(ops.state, "joined");
  ws0.frame({ id: 11, event: "msg", room: "ops", payload: { text: "a" } });
  ws0.frame({ id: 12, event: "msg", room: "dev", payload: {} });      // another room
  ws0.frame({ id: 13, event: "msg", room: null, payload: {} });       // the user's own
  ws0.frame({ id: 14, event: "other", room: "ops", payload: {} });
  ws0.frame({ id: 11, event: "msg", room: "ops", payload: {} });      // a duplicate: dropped by the client
  assert.deepEqual(got, [11]);
  assert.deepEqual(all, [14]);
  const dev = c.room("dev");
  assert.deepEqual(ws0.sent.at(-1), { action: "join", room: "dev" }, "a new room is joined at once when connected");
  dev.on("msg", (e) => got.push(`dev ${e.id}`));
  ws0.frame({ id: null, event: "joined", room: "dev", payload: {} });
  ws0.frame({ id: 16, event: "msg", room: "dev", payload: {} });
  assert.deepEqual(got, [11, "dev 16"]);
  assert.equal(ops.typing({ state: "typing" }), true);
  assert.deepEqual(ws0.sent.at(-1), { action: "publish", event: "typing", room: "ops", payload: { state: "typing" } });
  assert.deepEqual((await ops.presence()).members.map((m) => m.online), [true]);
  assert.ok(fetch.calls.includes("GET a.test/api/rooms/ops/members"));
  off();
  ws0.frame({ id: 17, event: "msg", room: "ops", payload: {} });
  assert.deepEqual(got, [11, "dev 16"], "off() unsubscribed");
  ops.leave();
  assert.deepEqual(ws0.sent.at(-1), { action: "leave", room: "ops" });
  assert.equal(ops.state, "left");
  assert.equal(c.roomStates().has("ops"), false);
  ws0.frame({ id: 18, event: "other", room: "ops", payload: {} });
  assert.deepEqual(all, [14], "a left handle hears nothing");
  assert.notEqual(c.room("ops"), ops, "after leave() a new handle");
  c.disconnect();
});

test("several URLs: a blip retries the same URL, a failed attempt moves on, a working URL is kept; REST follows", async () => {
  let aDown = false;
  const { c, rec, fetch } = setup({ url: undefined, urls: ["http://a.test/api", new URL("http://b.test/api/")] }, (u) => {
    if (aDown && u.host === "a.test") throw new TypeError("fetch failed");
    return u.pathname.endsWith("/me") ? json({}) : undefined;
  });
  assert.equal(c.base.href, "http://a.test/api/");
  c.connect();
  const ws0 = await socket(0);
  assert.equal(ws0.url.host, "a.test");
  ws0.hello();
  ws0.drop(1006);                                 // a blip: the same URL once more
  const ws1 = await socket(1);
  assert.equal(ws1.url.host, "a.test");
  ws1.hello();
  aDown = true;
  ws1.drop(1006);                                 // a's replica died: the retry's ticket fails, the next attempt goes to b
  const ws2 = await socket(2);
  assert.equal(ws2.url.host, "b.test");
  assert.equal(c.base.href, "http://b.test/api/");
  assert.equal(rec.retries.at(-1).error.code, "network_error");
  ws2.hello();
  ws2.drop(1011, "internal error");               // sticky: b worked, b again
  const ws3 = await socket(3);
  assert.equal(ws3.url.host, "b.test");
  await c.http("GET", "me");
  assert.equal(fetch.calls.at(-1), "GET b.test/api/me", "REST calls follow the URL in use");
  aDown = false;
  ws3.hello();
  ws3.drop(1012, "server restarting");            // going away: the next URL at once
  const ws4 = await socket(4);
  assert.equal(ws4.url.host, "a.test");
  ws4.hello();
  assert.equal(c.state, "connected");
  c.disconnect();
});

test("a URL resolver: asked before the first attempt and after a failure (with the failed URL), kept while it works", async () => {
  const asked = [];
  const { c } = setup({ url: undefined, urls: async (failed) => {
    asked.push(failed?.host ?? null);
    return asked.length === 1 ? "http://a.test/" : "http://b.test/";
  } });
  c.connect();
  const ws0 = await socket(0);
  assert.equal(ws0.url.host, "a.test");
  ws0.drop(1006);                                 // failed before hello: ask again
  const ws1 = await socket(1);
  assert.equal(ws1.url.host, "b.test");
  ws1.hello();
  ws1.drop(1006);                                 // a blip after a working connection: not asked
  const ws2 = await socket(2);
  assert.equal(ws2.url.host, "b.test");
  assert.deepEqual(asked, [null, "a.test"]);
  c.disconnect();
});
