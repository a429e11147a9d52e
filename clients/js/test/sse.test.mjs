// The Server-Sent Events fallback against real replicas, each behind a proxy that refuses
// WebSocket upgrades (as some corporate proxies do): the client falls back to SSE on its
// own, receives user and room events, joins, types and answers tools over POSTs, and keeps
// every event once and in order across a replica SIGKILLed mid-stream. Assertions are on
// what the client promises, never on timings.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import { ForbiddenError } from "../dist/index.js";
import { ids, makeClient, startReplicas, until } from "./helpers.mjs";

let env;
const clients = [];
const proxies = [];
const user = (name) => env.users[name].id;

/** An HTTP proxy in front of one replica that forwards everything (streaming) but refuses every
 *  Upgrade with 403. Counts the upgrades it refused. */
function noUpgradeProxy(base) {
  const target = new URL(base);
  const server = http.createServer((req, res) => {
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url,
      headers: { ...req.headers, host: target.host } }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
      r.on("error", () => res.destroy());       // the replica died: so does the response (a real proxy's RST)
      r.on("aborted", () => res.destroy());
    });
    up.on("error", () => { if (!res.headersSent) res.writeHead(502); res.end(); });
    res.on("close", () => up.destroy());
    req.pipe(up);
  });
  server.refused = 0;
  server.on("upgrade", (req, socket) => {
    server.refused++;
    socket.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  return new Promise((res) => server.listen(0, "127.0.0.1", () => {
    server.base = `http://127.0.0.1:${server.address().port}`;
    proxies.push(server);
    res(server);
  }));
}

before(async () => { env = await startReplicas(2); }, { timeout: 240_000 });
after(async () => {
  for (const c of clients) c.disconnect();
  for (const p of proxies) { p.closeAllConnections?.(); p.close(); }
  if (env) await env.stop();
});

describe("the SSE fallback on real replicas", { timeout: 600_000 }, () => {
  test("WebSocket upgrades refused: falls back to SSE, joins, types, answers tools, receives events", async () => {
    const [r1, r2] = env.replicas;
    const p1 = await noUpgradeProxy(r1.base);
    await env.admin.addMember("lobby", user("alice"));
    await env.admin.addMember("lobby", user("bob"));
    const a = makeClient(env, { url: p1.base });
    const b = makeClient(env, { url: r1.base, transports: ["sse"] });   // forced, no WebSocket tried
    clients.push(a, b);
    await a.login("alice", env.password);
    await b.login("bob", env.password);
    a.registerTool("add", ({ x, y }) => x + y);
    a.connect();
    b.connect();
    await until(a, () => a.state === "connected", "alice connected");
    await until(b, () => b.state === "connected", "bob connected");
    assert.equal(a.rec.connected.at(-1).transport, "sse");
    assert.ok(p1.refused >= 2, "the WebSocket was tried first");
    assert.equal(b.rec.connected.at(-1).transport, "sse");

    const lobby = a.room("lobby");
    const seen = [];
    lobby.on("note", (e) => seen.push(e.payload.n));
    b.join("lobby");
    await until(a, () => lobby.state === "joined", "alice joined over a POST");
    await until(b, () => b.roomStates().get("lobby") === "joined", "bob joined");
    // Published on the other replica: to the user, then to the room.
    const u = await env.admin.publish({ user_id: user("alice"), event: "hi", payload: {} }, r2.base);
    const r = await env.admin.publish({ room: "lobby", event: "note", payload: { n: 1 } }, r2.base);
    await until(a, () => ids(a).includes(r), "the room event");
    assert.deepEqual(ids(a).filter((i) => i === u || i === r), [u, r]);
    assert.deepEqual(seen, [1]);
    // typing goes out as a POST and reaches the other SSE client
    assert.equal(a.typing("lobby", { on: true }), true);
    await until(b, () => b.rec.typing.length > 0, "bob sees alice typing");
    assert.equal(b.rec.typing[0].room, "lobby");
    // a refused action comes back as the same error event as on the WebSocket
    a.join("vault");
    await until(a, () => a.rec.errors.length > 0, "the refusal");
    assert.equal(a.rec.errors.at(-1).code, "forbidden");
    assert.ok(a.rec.errors.at(-1).error instanceof ForbiddenError);
    // a tool call reaches the SSE client; its answer goes back as a POST
    const call = await env.admin.toolCall(user("alice"), "add", { x: 2, y: 3 });
    assert.equal(call.status, 200, JSON.stringify(call.body));
    assert.equal(call.body.result, 5);
    a.disconnect();
    b.disconnect();
  });

  test("a replica SIGKILLed mid-stream: the client resumes over SSE at the next URL, every event once, in order", async () => {
    const [r1, r2] = env.replicas;
    const p1 = await noUpgradeProxy(r1.base);
    const p2 = await noUpgradeProxy(r2.base);
    await env.admin.addMember("ops", user("carol"));
    const c = makeClient(env, { urls: [p1.base, p2.base] });
    clients.push(c);
    await c.login("carol", env.password);
    const ops = c.room("ops");
    c.connect();
    await until(c, () => c.state === "connected" && ops.state === "joined", "connected over SSE, ops joined");
    const first = c.rec.connected.at(-1);
    assert.equal(first.transport, "sse");
    const victim = first.replica === r1.replica ? r1 : r2;
    const other = victim === r1 ? r2 : r1;
    const sent = [];
    let stop = false;
    const publisher = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        sent.push(await env.admin.publish(i % 2 ? { room: "ops", event: "tick", payload: { i } }
          : { user_id: user("carol"), event: "tick", payload: { i } }, other.base));
      }
    })();
    await until(c, () => c.rec.events.length >= 30, "30 events before the kill");
    await env.cmd({ cmd: "signal", replica: victim.replica, sig: "SIGKILL" });
    await until(c, () => c.rec.connected.length >= 2, "reconnected");
    const mark = sent.length;
    await until(c, () => sent.length >= mark + 30, "30 more published after the reconnect");
    stop = true;
    await publisher;
    await until(c, () => c.rec.events.length >= sent.length, `all ${sent.length} events`);
    assert.deepEqual(ids(c), sent, "every event once, in publish order, across the kill");
    const again = c.rec.connected.at(-1);
    assert.equal(again.transport, "sse");
    assert.equal(again.replica, other.replica);
    assert.equal(again.resuming, true);
    assert.equal(c.rec.gaps.length, 0);
    assert.equal(ops.state, "joined", "the room re-joined in the handshake");
    c.disconnect();
  });
});
