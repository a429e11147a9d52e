// Producer replica: hosts many producers, each one a resumable stream created with
// resumableStream(streamId, makeStream) -- the idempotent API an AI SDK route uses.
import { createResumableStreamContext } from "resumable-stream";
import { now, log, redisClient, makeChunk, cpuSeconds, dieWithParent } from "./lib.mjs";

process.env.PEER_ROLE = "producer";
dieWithParent();

let go;
const goP = new Promise((r) => (go = r));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main(msg) {
  const { ids, opts, redisUrl } = msg;
  const publisher = await redisClient(redisUrl, "producer-pub");
  const subscriber = await redisClient(redisUrl, "producer-sub");
  const pending = [];
  const ctx = createResumableStreamContext({
    waitUntil: (p) => pending.push(p), // resolves once the stream is DONE (sentinel set, DONE published)
    publisher,
    subscriber,
    keyPrefix: opts.keyPrefix,
  });
  const filler = "x".repeat(opts.chunkBytes);
  const interval = opts.rate > 0 ? 1000 / opts.rate : 0;
  let firstSend = Infinity, lastSend = 0, sent = 0;
  let t0 = 0;

  const drains = [];
  for (let i = 0; i < ids.length; i++) {
    let seq = 0;
    // Stagger paced streams over one interval so they do not all tick at once.
    const offset = interval ? (interval * i) / ids.length : 0;
    const makeStream = () => new ReadableStream({
      async pull(controller) {
        if (seq === 0) await goP;
        if (seq >= opts.chunks) { controller.close(); return; }
        let ts;
        if (interval) {
          const due = t0 + offset + seq * interval;
          // Node's timers run on a cached whole-millisecond loop clock and can fire up to
          // ~1 ms early: sleep again until the due time has really passed.
          let wait, slept = false;
          while ((wait = due - now()) > 0) { await sleep(wait); slept = true; }
          // On time: the token appears now (the timer's own lateness is not the transport's).
          // Late (resumable-stream pulled after the due time): the token has waited since
          // its due time, so a producer backlog counts as latency.
          ts = slept ? now() : due;
        } else {
          ts = now();
        }
        seq++;
        if (ts < firstSend) firstSend = ts;
        if (ts > lastSend) lastSend = ts;
        sent++;
        controller.enqueue(makeChunk(seq, ts, filler));
      },
    }, { highWaterMark: 0 }); // pull only when resumable-stream asks for the next chunk
    const s = await ctx.resumableStream(ids[i], makeStream);
    if (!s) throw new Error(`stream ${ids[i]} already exists`);
    // The original request's response: drained and discarded (the peer measures the resumed readers).
    drains.push((async () => { const r = s.getReader(); while (!(await r.read()).done); })());
  }
  process.send({ ev: "ready" });
  await new Promise((r) => process.once("message", (m) => { if (m.cmd === "go") { t0 = m.t0; r(); } }));
  const cpu0 = process.cpuUsage();
  go();
  await Promise.all(drains);
  await Promise.all(pending);
  const cpu = cpuSeconds(cpu0);
  process.send({ ev: "done", firstSend, lastSend, sent, cpu });
  // stays up (its Redis connections keep it alive) until the runner says "exit" (lib.mjs)
}

process.once("message", (m) => main(m).catch((e) => { log("fatal:", e && e.stack); process.exit(1); }));
