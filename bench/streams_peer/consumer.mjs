// Consumer replica: for each of its streams it follows the producer on another
// process through resumeExistingStream(streamId[, skipCharacters]) over Redis pub/sub.
import { createResumableStreamContext } from "resumable-stream";
import { now, log, redisClient, cpuSeconds, dieWithParent } from "./lib.mjs";

process.env.PEER_ROLE = "consumer";
dieWithParent();

async function main(msg) {
  const { ids, opts, redisUrl } = msg;
  const publisher = await redisClient(redisUrl, "consumer-pub");
  const subscriber = await redisClient(redisUrl, "consumer-sub");
  const ctx = createResumableStreamContext({ waitUntil: null, publisher, subscriber, keyPrefix: opts.keyPrefix });

  const N = opts.chunks;
  const nListeners = ids.length * opts.consumersPerStream;
  const lat = new Float64Array(nListeners * N);
  let nLat = 0, delivered = 0, dup = 0, lost = 0, resumes = 0, resumeRetries = 0, failed = 0;
  let lastRecv = 0;

  async function open(id, skip) {
    for (let attempt = 0; ; attempt++) {
      try {
        const s = await ctx.resumeExistingStream(id, skip);
        if (s === undefined) throw new Error(`stream ${id} not found`);
        return s; // null: the stream is already done
      } catch (e) {
        if (attempt >= 4) throw e;
        resumeRetries++;
        await new Promise((r) => setTimeout(r, 100 * (attempt + 1)));
      }
    }
  }

  // Thresholds (chunks received) at which this listener drops and resumes.
  const cuts = [];
  for (let k = 1; k <= opts.reconnects; k++) cuts.push(Math.floor((N * k) / (opts.reconnects + 1)));

  const listeners = [];
  for (const id of ids) for (let c = 0; c < opts.consumersPerStream; c++) {
    listeners.push({ id, stream: await open(id, undefined), chars: 0, buf: "", last: 0, seen: new Uint8Array(N + 1), got: 0, cut: 0 });
  }
  process.send({ ev: "attached" });
  await new Promise((r) => process.once("message", r)); // "go"
  const cpu0 = process.cpuUsage();

  async function follow(L) {
    let stream = L.stream;
    while (stream) {
      const reader = stream.getReader();
      let dropped = false;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const t = now();
        L.chars += value.length;
        let text = L.buf + value;
        let nl;
        let start = 0;
        while ((nl = text.indexOf("\n", start)) !== -1) {
          const rec = text.slice(start, nl);
          start = nl + 1;
          const c1 = rec.indexOf(":"), c2 = rec.indexOf(":", c1 + 1);
          const seq = +rec.slice(0, c1), ts = +rec.slice(c1 + 1, c2);
          if (seq !== L.last + 1) dup++;
          if (seq > L.last) L.last = seq;
          if (seq >= 1 && seq <= N && !L.seen[seq]) {
            L.seen[seq] = 1; L.got++; delivered++;
            lat[nLat++] = t - ts;
            if (t > lastRecv) lastRecv = t;
          }
        }
        L.buf = text.slice(start);
        if (L.cut < cuts.length && L.got >= cuts[L.cut] && L.got < N) { dropped = true; break; }
      }
      if (!dropped) break;
      // A dropped connection: forget the reader and resume from the characters we have.
      L.cut++;
      resumes++;
      await reader.cancel().catch(() => {});
      stream = await open(L.id, L.chars); // L.buf (a partial chunk) is kept and continued
    }
    lost += N - L.got;
  }
  await Promise.all(listeners.map((L) => follow(L).catch((e) => { failed++; lost += N - L.got; log(`listener ${L.id}: ${e && e.message}`); })));
  const cpu = cpuSeconds(cpu0);
  process.send({ ev: "result", lat: lat.subarray(0, nLat), delivered, dup, lost, resumes, resumeRetries, failed, lastRecv, cpu });
  // stays up (its Redis connections keep it alive) until the runner says "exit" (lib.mjs)
}

process.once("message", (m) => main(m).catch((e) => { log("fatal:", e && e.stack); process.exit(1); }));
