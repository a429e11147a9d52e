// Several replica URLs (options.urls) against real replicas, no load balancer in between:
// the replica in use is SIGKILLed mid-session; the client moves on to the next URL, resumes
// there, and every event arrives once and in order. Also the room handle and the error
// classes on a real server. Assertions are on what the client promises, never on timings.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { ForbiddenError, SwitchboardError } from "../dist/index.js";
import { ids, makeClient, startReplicas, until } from "./helpers.mjs";

let env;
const clients = [];
const user = (name) => env.users[name].id;

before(async () => { env = await startReplicas(2); }, { timeout: 240_000 });
after(async () => {
  for (const c of clients) c.disconnect();
  if (env) await env.stop();
});

describe("several replica URLs on real replicas", { timeout: 600_000 }, () => {
  test("the first replica SIGKILLed mid-session: the client goes on at the second and loses no event", async () => {
    const [r1, r2] = env.replicas;
    await env.admin.addMember("ops", user("alice"));
    const c = makeClient(env, { urls: [r1.base, r2.base] });
    clients.push(c);
    assert.equal(c.base.href, new URL(r1.base + "/").href);
    await c.login("alice", env.password);
    const ops = c.room("ops");
    const inRoom = [];
    ops.on("tick", (e) => inRoom.push(e.id));
    c.connect();
    await until(c, () => c.rec.connected.length === 1, "connected");
    assert.equal(c.rec.connected[0].replica, r1.replica, "the first URL first");
    await until(c, () => ops.state === "joined", "ops joined");

    // Publish through the second replica the whole time: half to the user, half to the room.
    const sent = [];
    const toRoom = [];
    let stop = false;
    const publisher = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        const room = i % 2 === 0;
        const id = await env.admin.publish(room ? { room: "ops", event: "tick", payload: { i } }
          : { user_id: user("alice"), event: "tick", payload: { i } }, r2.base);
        sent.push(id);
        if (room) toRoom.push(id);
      }
    })();
    await until(c, () => c.rec.events.length >= 30, "30 events before the kill");
    await env.cmd({ cmd: "signal", replica: r1.replica, sig: "SIGKILL" });
    await until(c, () => c.rec.connected.length >= 2, "reconnected");
    const mark = sent.length;
    await until(c, () => sent.length >= mark + 30, "30 more published after the reconnect");
    stop = true;
    await publisher;
    await until(c, () => c.rec.events.length >= sent.length, `all ${sent.length} events`);

    assert.deepEqual(ids(c), sent, "every event once, in publish order, across the kill");
    assert.deepEqual(inRoom, toRoom, "the room handle: the room's events, once, in order");
    const again = c.rec.connected.at(-1);
    assert.equal(again.replica, r2.replica, "moved on to the second URL");
    assert.equal(again.resuming, true);
    assert.equal(c.rec.gaps.length, 0);
    assert.equal(ops.state, "joined", "the room re-joined in the handshake");
    const lost = c.rec.states.find((s) => s.from === "connected" && s.to === "reconnecting");
    assert.ok(lost.error instanceof SwitchboardError, "the loss carries an error");
    // The REST base followed the socket.
    assert.equal(c.base.href, new URL(r2.base + "/").href);
    const me = await c.api("get", "/me");
    assert.equal(me.replica, r2.replica);
    // Sticky: the URL that works is kept (a new connection goes to it too).
    const states = c.rec.connected.length;
    c.disconnect();
    c.connect();
    await until(c, () => c.rec.connected.length > states, "connected again");
    assert.equal(c.rec.connected.at(-1).replica, r2.replica);
    c.disconnect();
    env.replicas = env.replicas.filter((r) => r.replica !== r1.replica);
  });

  test("a refused join on a real server is a ForbiddenError on the error event; the room handle says left", async () => {
    const c = makeClient(env, { urls: env.replicas.map((r) => r.base) });
    clients.push(c);
    await c.login("bob", env.password);
    c.connect();
    await until(c, () => c.state === "connected", "connected");
    const secret = c.room("secret");   // bob is no member
    await until(c, () => c.rec.errors.length > 0, "the refusal");
    const p = c.rec.errors.at(-1);
    assert.equal(p.code, "forbidden");
    assert.ok(p.error instanceof ForbiddenError);
    assert.equal(p.error.code, "forbidden");
    assert.equal(secret.state, "left");
    c.disconnect();
  });
});
