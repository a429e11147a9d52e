// Pushed presence on a room handle (src/presence.ts), with a scripted WebSocket playing the server:
// what the client asks for and when, and the list it keeps from presence.state / presence.diff --
// joins, leaves, metadata changes, a reconnect's fresh state, leaving the room.
import assert from "node:assert/strict";
import { test } from "node:test";

import { SwitchboardClient } from "../dist/index.js";
import { FakeWS, fakeFetch, socket } from "./fake.mjs";

const ann = (metas = []) => ({ user_id: "u-ann", username: "ann", metas });
const bob = (metas = []) => ({ user_id: "u-bob", username: "bob", metas });
const cy = (metas = []) => ({ user_id: "u-cy", username: "cy", metas });
const state = (members, room = "lobby") =>
  ({ id: null, event: "presence.state", room, payload: { members, truncated: false } });
const diff = (joins, leaves, room = "lobby") => ({ id: null, event: "presence.diff", room, payload: { joins, leaves } });

function setup() {
  FakeWS.all = [];
  const c = new SwitchboardClient({ url: "http://a.test/", WebSocket: FakeWS, fetch: fakeFetch(), storage: null,
    random: () => 0.5, backoff: { initialMs: 10, maxMs: 50, stableMs: 10_000 } });
  const rec = { joins: [], leaves: [], syncs: [] };
  return { c, rec };
}

const sentPresence = (ws) => ws.sent.filter((f) => String(f.action).startsWith("presence."));

test("a room handle watches presence once joined, tracks its metadata, and keeps the list from the frames", async () => {
  const { c, rec } = setup();
  const room = c.room("lobby");
  room.onJoin((m, prev) => rec.joins.push([m.username, prev?.metas]));
  const offLeave = room.onLeave((m) => rec.leaves.push(m.username));
  room.onSync((list) => rec.syncs.push(list.map((m) => m.username)));
  assert.equal(room.track({ status: "here" }), false, "not connected: nothing sent yet");
  c.connect();
  const ws = await socket(0);
  ws.hello({ rooms: ["lobby"] });
  // joined in the handshake: the track goes out (one action, with the metadata)
  assert.deepEqual(sentPresence(ws), [{ action: "presence.track", room: "lobby", meta: { status: "here" } }]);
  assert.deepEqual(room.online(), []);

  ws.frame(diff([bob()], []));          // a diff before any state means nothing
  assert.deepEqual(room.online(), []);
  ws.frame(state([bob([{ status: "busy" }]), ann([{ status: "here" }])]));
  assert.deepEqual(room.online().map((m) => m.username), ["ann", "bob"], "by username");
  assert.deepEqual(rec.joins, [["bob", undefined], ["ann", undefined]]);
  assert.deepEqual(rec.syncs, [["ann", "bob"]]);

  // a join, a metadata change (previous given), a leave; leaves apply before joins
  ws.frame(diff([cy(), bob([{ status: "away" }])], []));
  assert.deepEqual(rec.joins.slice(2), [["cy", undefined], ["bob", [{ status: "busy" }]]]);
  assert.deepEqual(room.online().find((m) => m.username === "bob").metas, [{ status: "away" }]);
  ws.frame(diff([], [cy()]));
  assert.deepEqual(rec.leaves, ["cy"]);
  ws.frame(diff([bob()], [bob([{ status: "away" }])]));   // leaves first: a leave and a join
  assert.deepEqual(rec.leaves, ["cy", "bob"]);
  assert.deepEqual(room.online().map((m) => [m.username, m.metas]), [["ann", [{ status: "here" }]], ["bob", []]]);
  assert.deepEqual(rec.syncs.at(-1), ["ann", "bob"]);
  ws.frame(diff([ann([{ status: "here" }])], []));          // an unchanged entry is no join
  assert.equal(rec.joins.filter(([n]) => n === "ann").length, 1);
  ws.frame({ ...diff([{ user_id: 5 }, null, "x"], "nope"), room: "lobby" });   // junk entries are skipped
  assert.deepEqual(room.online().map((m) => m.username), ["ann", "bob"]);
  ws.frame(diff([cy()], [], "elsewhere"));                   // a room nobody watches
  assert.equal(room.online().length, 2);

  // a reconnect: the track goes again, and the new state is reported as joins and leaves
  offLeave();
  room.onLeave((m) => rec.leaves.push(`again:${m.username}`));
  ws.drop(1006);
  const ws2 = await socket(1);
  ws2.hello({ rooms: ["lobby"] });
  assert.deepEqual(sentPresence(ws2), [{ action: "presence.track", room: "lobby", meta: { status: "here" } }]);
  assert.deepEqual(room.online().map((m) => m.username), ["ann", "bob"], "the list stays until the state");
  ws2.frame(state([ann([{ status: "here" }]), cy()]));
  assert.deepEqual(rec.leaves, ["cy", "bob", "again:bob"]);
  assert.deepEqual(room.online().map((m) => m.username), ["ann", "cy"]);

  // a new metadata value is sent at once
  assert.equal(room.track({ status: "away" }), true);
  assert.deepEqual(sentPresence(ws2).at(-1), { action: "presence.track", room: "lobby", meta: { status: "away" } });

  // leaving the room: everyone leaves the list, and the listeners go with it
  room.leave();
  assert.deepEqual(rec.leaves.slice(3).sort(), ["again:ann", "again:cy"]);
  assert.deepEqual(rec.syncs.at(-1), []);
  const n = rec.syncs.length;
  ws2.frame(state([ann()]));
  assert.equal(rec.syncs.length, n);
  c.disconnect();
});

test("watching without tracking subscribes; a room joined later asks once it is joined", async () => {
  const { c } = setup();
  c.connect();
  const ws = await socket(0);
  ws.hello({ rooms: [] });
  const room = c.room("later");           // join sent now; presence waits for "joined"
  const seen = [];
  room.onSync((list) => seen.push(list.length));
  assert.deepEqual(sentPresence(ws), []);
  ws.frame({ id: null, event: "joined", room: "later", payload: {} });
  assert.deepEqual(sentPresence(ws), [{ action: "presence.subscribe", room: "later" }]);
  ws.frame(state([ann(), bob()], "later"));
  assert.deepEqual(seen, [2]);
  assert.equal(c.room("later"), room);
  // the HTTP read is still there
  assert.equal(typeof room.presence, "function");
  c.disconnect();
});
