#!/usr/bin/env node
// The resumable-stream peer of bench/streams.py: one run, one JSON line on stdout.
// Usage: node run.mjs [--streams 100] [--chunks 300] [--rate 0] [--chunkBytes 8] ...
//        echo '{"streams":100,"rate":30}' | node run.mjs -
// Everything but the final JSON line goes to stderr. See README.md.
import { fork, spawn } from "node:child_process";
import { mkdtempSync, rmSync, readFileSync } from "node:fs";
import { tmpdir, loadavg, availableParallelism } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomUUID } from "node:crypto";
import net from "node:net";
import { createClient } from "redis";
import { now, log } from "./lib.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const DEFAULTS = {
  streams: 100,          // concurrent streams
  chunks: 300,           // chunks per stream
  rate: 0,               // chunks/s per stream, 0 = as fast as possible
  chunkBytes: 8,         // filler characters per chunk (plus the "<seq>:<send_ms>:" header and "\n")
  consumersPerStream: 1, // readers following each stream
  producerProcs: 1,      // producer replicas (processes)
  consumerProcs: 2,      // consumer replicas (processes)
  reconnects: 0,         // times each reader drops mid-stream and resumes with skipCharacters
  redis: "memory",       // "memory": --save '' --appendonly no; "aof": --appendonly yes --appendfsync everysec
  redisServer: "redis-server",
  timeoutS: 0,           // overall deadline; 0 = derived from the load
};

function parseArgs(argv) {
  const o = {};
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    if (a === "-" || a === "--stdin") { Object.assign(o, JSON.parse(readFileSync(0, "utf8") || "{}")); continue; }
    if (a === "--json") { Object.assign(o, JSON.parse(argv[++i])); continue; }
    if (a === "-h" || a === "--help") { process.stderr.write(readFileSync(join(HERE, "README.md"), "utf8")); process.exit(0); }
    if (!a.startsWith("--")) throw new Error(`bad argument ${a}`);
    a = a.slice(2);
    let v;
    if (a.includes("=")) [a, v] = [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)];
    else v = argv[++i];
    o[a] = v;
  }
  const opts = { ...DEFAULTS };
  for (const [k, v] of Object.entries(o)) {
    if (!(k in DEFAULTS)) throw new Error(`unknown option ${k}`);
    opts[k] = typeof DEFAULTS[k] === "number" ? Number(v) : String(v);
    if (typeof DEFAULTS[k] === "number" && !Number.isFinite(opts[k])) throw new Error(`bad number for ${k}: ${v}`);
  }
  if (!["memory", "aof"].includes(opts.redis)) throw new Error(`redis must be memory or aof`);
  if (opts.streams < 1 || opts.chunks < 1) throw new Error("streams and chunks must be >= 1");
  opts.consumerProcs = Math.max(1, Math.min(opts.consumerProcs, opts.streams));
  opts.producerProcs = Math.max(1, Math.min(opts.producerProcs, opts.streams));
  if (!opts.timeoutS) opts.timeoutS = Math.ceil(60 + (opts.rate > 0 ? 2 * opts.chunks / opts.rate : 0) + opts.streams * opts.chunks / 2000);
  return opts;
}

let opts;
try { opts = parseArgs(process.argv.slice(2)); }
catch (e) { process.stdout.write(JSON.stringify({ peer: "resumable-stream", error: `usage: ${e.message}` }) + "\n"); process.exit(2); }

// ---------------------------------------------------------------- cleanup
const children = [];
let redisProc = null, reaper = null, tmp = null, printed = false, cleaning = false;

function emit(obj) {
  if (printed) return;
  printed = true;
  process.stdout.write(JSON.stringify(obj) + "\n");
}

async function cleanup() {
  if (cleaning) return;
  cleaning = true;
  for (const c of children) { try { if (c.connected) c.send({ cmd: "exit" }); } catch {} }
  const exited = (p) => p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise((r) => p.once("exit", r));
  await Promise.race([Promise.all(children.map(exited)), new Promise((r) => setTimeout(r, 2000))]);
  for (const c of children) if (c.exitCode === null && c.signalCode === null) { try { c.kill("SIGKILL"); } catch {} }
  if (redisProc && redisProc.exitCode === null && redisProc.signalCode === null) {
    try { redisProc.kill("SIGTERM"); } catch {}
    await Promise.race([exited(redisProc), new Promise((r) => setTimeout(r, 3000))]);
    if (redisProc.exitCode === null && redisProc.signalCode === null) { try { redisProc.kill("SIGKILL"); } catch {} }
  }
  if (tmp) { try { rmSync(tmp, { recursive: true, force: true }); } catch {} }
  if (reaper) { try { reaper.kill("SIGKILL"); } catch {} }
}

async function fail(error, extra = {}) {
  emit({ peer: "resumable-stream", error, ...extra });
  await cleanup();
  process.exit(1);
}

for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => fail(`killed by ${sig}`));
process.on("uncaughtException", (e) => fail(`uncaught: ${e && e.stack}`));
process.on("unhandledRejection", (e) => fail(`unhandled: ${e && e.stack}`));
const deadline = setTimeout(() => fail(`timeout after ${opts.timeoutS}s`, { phase }), opts.timeoutS * 1000);
let phase = "start";

// ---------------------------------------------------------------- redis
function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

async function startRedis() {
  tmp = mkdtempSync(join(tmpdir(), "streams-peer-"));
  const port = await freePort();
  const persist = opts.redis === "aof"
    ? ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
    : ["--save", "", "--appendonly", "no"];
  redisProc = spawn(opts.redisServer, ["--port", String(port), "--bind", "127.0.0.1", "--dir", tmp,
    "--daemonize", "no", "--protected-mode", "no", "--logfile", join(tmp, "redis.log"), ...persist],
    { stdio: "ignore" });
  redisProc.on("error", (e) => fail(`cannot start ${opts.redisServer}: ${e.message}`));
  redisProc.on("exit", (code, sig) => { if (!cleaning) fail(`redis-server exited (${code ?? sig})`); });
  // If this runner is SIGKILLed, the reaper stops redis and removes the temp dir.
  reaper = spawn("sh", ["-c", `while kill -0 ${process.pid} 2>/dev/null; do sleep 1; done; kill -9 ${redisProc.pid} 2>/dev/null; rm -rf '${tmp}'`],
    { detached: true, stdio: "ignore" });
  reaper.unref();
  const url = `redis://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    const c = createClient({ url, socket: { reconnectStrategy: false, connectTimeout: 1000 } });
    c.on("error", () => {});
    try { await c.connect(); await c.ping(); return { url, admin: c }; }
    catch (e) { try { c.destroy(); } catch {} if (i > 100) throw new Error(`redis-server not answering on ${port}`); await new Promise((r) => setTimeout(r, 50)); }
  }
}

async function redisStats(c) {
  const info = await c.info();
  const get = (k) => Number((info.match(new RegExp(`^${k}:([0-9.]+)`, "m")) || [])[1]);
  return { cpu: get("used_cpu_sys") + get("used_cpu_user"), cmds: get("total_commands_processed"), version: (info.match(/^redis_version:(\S+)/m) || [])[1] };
}

// ---------------------------------------------------------------- roles
function spawnRole(file, name) {
  const c = fork(join(HERE, file), [], { stdio: ["ignore", 2, 2, "ipc"], serialization: "advanced", env: { ...process.env } });
  c.on("exit", (code, sig) => { if (!cleaning && !c.finished) fail(`${name} exited (${code ?? sig}) before finishing`, { phase }); });
  children.push(c);
  return c;
}
const waitFor = (c, ev) => new Promise((r) => { const h = (m) => { if (m && m.ev === ev) { c.off("message", h); r(m); } }; c.on("message", h); });

function pct(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))];
}
const r3 = (x) => (x === null || x === undefined || !Number.isFinite(x) ? null : Math.round(x * 1000) / 1000);

async function main() {
  const { url, admin } = await startRedis();
  const run = randomUUID().slice(0, 8);
  const keyPrefix = `peer-${run}`;
  const ids = Array.from({ length: opts.streams }, () => randomUUID());
  const roleOpts = { ...opts, keyPrefix };

  phase = "create";
  const producers = [], consumers = [];
  for (let p = 0; p < opts.producerProcs; p++) producers.push(spawnRole("producer.mjs", `producer ${p}`));
  for (let c = 0; c < opts.consumerProcs; c++) consumers.push(spawnRole("consumer.mjs", `consumer ${c}`));
  await Promise.all(producers.map((c, p) => { const w = waitFor(c, "ready"); c.send({ ids: ids.filter((_, i) => i % opts.producerProcs === p), opts: roleOpts, redisUrl: url }); return w; }));

  phase = "attach";
  await Promise.all(consumers.map((c, k) => { const w = waitFor(c, "attached"); c.send({ ids: ids.filter((_, i) => i % opts.consumerProcs === k), opts: roleOpts, redisUrl: url }); return w; }));

  phase = "run";
  const load0 = loadavg()[0];
  const r0 = await redisStats(admin);
  const dones = producers.map((c) => waitFor(c, "done"));
  const results = consumers.map((c) => waitFor(c, "result"));
  for (const c of consumers) c.send({ cmd: "go" });
  const t0 = now() + 20;
  for (const c of producers) c.send({ cmd: "go", t0 });
  const pd = await Promise.all(dones);
  const cr = await Promise.all(results);
  for (const c of [...producers, ...consumers]) c.finished = true;
  const r1 = await redisStats(admin);
  phase = "report";

  let n = 0;
  for (const r of cr) n += r.lat.length;
  const lat = new Float64Array(n);
  let o = 0;
  for (const r of cr) { lat.set(r.lat, o); o += r.lat.length; }
  lat.sort();
  const sum = (a, f) => a.reduce((s, x) => s + f(x), 0);
  const firstSend = Math.min(...pd.map((d) => d.firstSend));
  const lastRecv = Math.max(...cr.map((r) => r.lastRecv));
  const delivered = sum(cr, (r) => r.delivered);
  const elapsed = (lastRecv - firstSend) / 1000;
  const pkg = (name) => JSON.parse(readFileSync(join(HERE, "node_modules", name, "package.json"), "utf8")).version;
  const header = `${opts.chunks}:${(now()).toFixed(3)}:`.length + 1; // a typical header + newline
  emit({
    peer: "resumable-stream",
    streams: opts.streams,
    chunks_total: opts.streams * opts.chunks * opts.consumersPerStream,
    delivered,
    elapsed_s: r3(elapsed),
    chunks_per_s: r3(delivered / elapsed),
    min_ms: r3(lat.length ? lat[0] : null),
    p50_ms: r3(pct(lat, 0.5)),
    p90_ms: r3(pct(lat, 0.9)),
    p99_ms: r3(pct(lat, 0.99)),
    max_ms: r3(lat.length ? lat[lat.length - 1] : null),
    mean_ms: r3(n ? sum(lat, (x) => x) / n : null),
    lost: sum(cr, (r) => r.lost),
    dup_or_disorder: sum(cr, (r) => r.dup),
    redis_cpu_s: r3(r1.cpu - r0.cpu),
    node_cpu_s: r3(sum(pd, (d) => d.cpu) + sum(cr, (r) => r.cpu)),
    producer_cpu_s: r3(sum(pd, (d) => d.cpu)),
    consumer_cpu_s: r3(sum(cr, (r) => r.cpu)),
    redis_cmds: r1.cmds - r0.cmds - 1,
    chunks: opts.chunks,
    rate: opts.rate,
    offered_chunks_per_s: opts.rate > 0 ? opts.streams * opts.rate * opts.consumersPerStream : null,
    chunk_bytes: opts.chunkBytes,
    chunk_wire_bytes: opts.chunkBytes + header,
    send_span_s: r3((Math.max(...pd.map((d) => d.lastSend)) - firstSend) / 1000),
    consumers_per_stream: opts.consumersPerStream,
    producer_procs: opts.producerProcs,
    consumer_procs: opts.consumerProcs,
    reconnects: opts.reconnects,
    resumes: sum(cr, (r) => r.resumes),
    resume_retries: sum(cr, (r) => r.resumeRetries),
    failed_readers: sum(cr, (r) => r.failed),
    redis_mode: opts.redis,
    loadavg_1m: [r3(load0), r3(loadavg()[0])], // before/after: other work on the box skews every figure
    cpus: availableParallelism(),
    versions: { node: process.versions.node, redis_server: r1.version, "resumable-stream": pkg("resumable-stream"), redis: pkg("redis") },
  });
  clearTimeout(deadline);
  try { await admin.quit(); } catch {}
  await cleanup();
  process.exit(0);
}

main().catch((e) => fail(`${e && e.stack}`, { phase }));
