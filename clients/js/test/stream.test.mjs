// sb.stream() / sb.streams() against real replicas (docs/how-to/streams.md): the example handler
// ai_chat.complete (examples/ai_chat) runs on r1 only (the scheduler is off on r2 and r3) and
// streams its answer to a user whose client is on another replica. Asserted is what the client
// promises -- each chunk once, in order, across a replica's death; `result` says how it ended --
// and, in SQL, what the database holds.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { StreamError } from "../dist/index.js";
import { makeClient, startReplicas, until } from "./helpers.mjs";

let env;
let producer;          // r1: the only replica that runs handlers
const clients = [];
const user = (name) => env.users[name].id;
const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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

/** Connected (through the proxy) to a replica that is not the producer. */
async function connectedElsewhere(c) {
  let info = await connected(c);
  for (let i = 0; info.replica === producer.replica && i < 20; i++) {
    c.disconnect();
    info = await connected(c);
  }
  assert.notEqual(info.replica, producer.replica, "could not land on a replica other than the producer");
  return info;
}

/** POST /jobs (admin): ai_chat.complete for this user; the run's id. */
async function ask(args) {
  const r = await env.admin.call("POST", "/jobs", { handler: "ai_chat.complete", args });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  return r.body.run.id;
}

/** The stream id the handler announces with its chat.answer event (matched by prompt). */
async function answerOf(c, prompt) {
  const hit = () => c.rec.events.find((f) => f.event === "chat.answer" && f.payload.prompt === prompt);
  await until(c, () => hit() !== undefined, `chat.answer for ${prompt}`);
  return hit().payload.stream;
}

async function runResult(runId) {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; await sleep(100)) {
    const [[status, result, error]] = await env.sql("SELECT status, result, error FROM switchboard.task_runs WHERE id = %s", [runId]);
    if (["succeeded", "failed", "cancelled", "abandoned"].includes(status)) {
      assert.equal(status, "succeeded", String(error));
      return result;
    }
  }
  throw new Error(`run ${runId} did not finish`);
}

/** status, last_seq, count and max(seq) of the stream's chunks, in SQL. */
async function inSql(sid) {
  const [[status, last, n, max]] = await env.sql(
    "SELECT s.status, s.last_seq, (SELECT count(*) FROM switchboard.stream_chunks k WHERE k.stream_id = s.id), "
    + "(SELECT max(seq) FROM switchboard.stream_chunks k WHERE k.stream_id = s.id) FROM switchboard.streams s WHERE s.id = %s",
    [sid]);
  return { status, last, n: Number(n), max: max === null ? 0 : Number(max) };
}

before(async () => {
  env = await startReplicas(3, {}, ["--example", "ai_chat",
    "--env-for", "r2:SWITCHBOARD_SCHEDULER=off", "--env-for", "r3:SWITCHBOARD_SCHEDULER=off"]);
  producer = env.replicas.find((r) => /-r1-/.test(r.name));
  assert.ok(producer, JSON.stringify(env.replicas));
}, { timeout: 240_000 });
after(async () => {
  for (const c of clients) c.disconnect();
  if (env) await env.stop();
});

describe("sb.stream() on real replicas", { timeout: 600_000 }, () => {
  test("a handler on one replica streams to a client on another: every chunk once, in order; result done", async () => {
    const other = env.replicas.find((r) => r !== producer);
    const c = await loggedIn("alice", { url: other.base });
    const info = await connected(c);
    assert.equal(info.replica, other.replica);
    const run = await ask({ user_id: user("alice"), prompt: "cross-replica", tokens: 600, rate: 400 });
    const s = c.stream(await answerOf(c, "cross-replica"));
    const got = [];
    for await (const chunk of s) got.push(chunk);
    const res = await s.result;
    assert.deepEqual(got.map((x) => x.seq), range(1, 600));
    assert.equal(res.status, "done");
    assert.equal(res.last_seq, 600);
    assert.equal(res.final.text, got.map((x) => x.data).join(""));
    assert.equal(s.lastSeq, 600);
    const result = await runResult(run);
    assert.equal(result.chunks, 600);
    assert.equal(result.stopped, false);
    assert.deepEqual(await inSql(s.id), { status: "done", last: 600, n: 600, max: 600 });
    c.disconnect();
  });

  test("sb.streams() lists an open stream; another user's is stream_not_found and not in their list", async () => {
    const alice = await loggedIn("alice");
    await connectedElsewhere(alice);
    const bob = await loggedIn("bob");
    await connected(bob);
    await ask({ user_id: user("alice"), prompt: "listed", tokens: 100000, rate: 50 });
    const sid = await answerOf(alice, "listed");
    const mine = await alice.streams();
    const it = mine.find((x) => x.id === sid);
    assert.ok(it, JSON.stringify(mine));
    assert.equal(it.status, "open");
    assert.equal(it.kind, "completion");
    assert.equal(it.meta.prompt, "listed");
    assert.ok(Number.isInteger(it.last_seq) && typeof it.opened_at === "string");
    assert.equal((await bob.streams()).some((x) => x.id === sid), false);
    // bob follows alice's stream: refused, the same answer as an unknown id
    const theirs = bob.stream(sid);
    await assert.rejects(async () => { for await (const _ of theirs) assert.fail("a chunk of another user's stream"); },
      (e) => e instanceof StreamError && e.code === "stream_not_found" && e.stream === sid);
    await assert.rejects(theirs.result, (e) => e instanceof StreamError && e.code === "stream_not_found");
    const unknown = bob.stream("00000000-0000-4000-8000-000000000000");
    await assert.rejects(unknown.next(), (e) => e instanceof StreamError && e.code === "stream_not_found");
    // and bob cannot stop it (over HTTP, as when not connected)
    bob.disconnect();
    const stopper = bob.stream(sid);
    await assert.rejects(stopper.stop(), (e) => e instanceof StreamError && e.code === "stream_not_found");
    void stopper.return();
    assert.equal((await inSql(sid)).status, "open");
    // alice's own stop ends it
    const s = alice.stream(sid);
    await s.stop();
    const res = await s.result;
    assert.equal(res.status, "stopped");
    assert.equal((await alice.streams()).some((x) => x.id === sid), false);
    alice.disconnect();
  });

  test("stop(): the stream ends stopped, no chunk after, the run's result says stopped", async () => {
    const c = await loggedIn("carol");
    await connectedElsewhere(c);
    const run = await ask({ user_id: user("carol"), prompt: "stop me", tokens: 100000, rate: 100 });
    const s = c.stream(await answerOf(c, "stop me"));
    const got = [];
    for await (const chunk of s) {
      got.push(chunk);
      if (got.length === 20) await s.stop();
    }
    const res = await s.result;
    assert.equal(res.status, "stopped");
    assert.ok(res.last_seq >= 20 && res.last_seq < 100000, String(res.last_seq));
    assert.deepEqual(got.map((x) => x.seq), range(1, res.last_seq), "every chunk up to the stop, once, in order");
    // The readers' end comes at the stop, before the producer closed the stream with its final
    // (the partial text): that one is in the durable stream.end event the owner gets next.
    const durable = () => c.rec.events.find((f) => f.event === "stream.end" && f.payload.stream === s.id);
    await until(c, () => durable() !== undefined, "the durable stream.end event");
    assert.equal(durable().payload.status, "stopped");
    assert.equal(durable().payload.last_seq, res.last_seq);
    // ai_chat's final is the text it *sent*; send() returns once a chunk is queued, so a chunk
    // queued just before the stop, which the database then refused, can be in the final and in
    // no seq (reported; the stream's own chunks are exact). Hence a prefix, not equality.
    const text = got.map((x) => x.data).join("");
    assert.ok(durable().payload.final.text.startsWith(text), `${durable().payload.final.text} / ${text}`);
    if (res.final !== null) assert.ok(res.final.text.startsWith(text));
    const result = await runResult(run);
    assert.equal(result.stopped, true);
    assert.equal(result.chunks, res.last_seq);
    await sleep(300);   // were the producer still writing, a chunk would land by now
    assert.deepEqual(await inSql(s.id), { status: "stopped", last: res.last_seq, n: res.last_seq, max: res.last_seq });
    c.disconnect();
  });

  test("the client's replica SIGKILLed mid-stream: it reconnects to another and finishes, nothing lost or repeated", async () => {
    const c = await loggedIn("bob");
    const first = await connectedElsewhere(c);
    const run = await ask({ user_id: user("bob"), prompt: "failover", tokens: 3000, rate: 500 });
    const s = c.stream(await answerOf(c, "failover"));
    const got = [];
    for await (const chunk of s) {
      got.push(chunk);
      if (got.length === 300) await env.cmd({ cmd: "signal", replica: first.replica, sig: "SIGKILL" });
    }
    env.replicas = env.replicas.filter((r) => r.replica !== first.replica);
    const res = await s.result;
    assert.deepEqual(got.map((x) => x.seq), range(1, 3000), "every chunk once, in order, across the kill");
    assert.equal(res.status, "done");
    assert.equal(res.last_seq, 3000);
    assert.equal(res.final.text, got.map((x) => x.data).join(""));
    assert.ok(c.rec.connected.length >= 2, "reconnected");
    assert.notEqual(c.rec.connected.at(-1).replica, first.replica);
    assert.ok(c.rec.states.some((x) => x.to === "reconnecting"), "went through reconnecting");
    assert.equal((await runResult(run)).chunks, 3000);
    c.disconnect();
  });
});
