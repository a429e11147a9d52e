// Helpers for the node --test suites: real replicas (test/replicas.py), an HTTP
// admin, a cookie-keeping fetch, and waits on client events (never sleeps).
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SwitchboardClient } from "../dist/index.js";

const here = dirname(fileURLToPath(import.meta.url));
export const WAIT = 30_000;   // upper bound of any wait; each returns as soon as its condition holds

/** Start a throwaway Postgres + `replicas` real replicas behind a round-robin proxy.
 *  `args`: more replicas.py options (`--example ai_chat`, `--env-for r2:KEY=VALUE`). */
export async function startReplicas(replicas = 2, env = {}, args = []) {
  const extra = [...Object.entries(env).flatMap(([k, v]) => ["--env", `${k}=${v}`]), ...args];
  const proc = spawn(process.env.PYTHON || "python3", [resolve(here, "replicas.py"), "--replicas", String(replicas), ...extra],
    { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: proc.stdout });
  const queue = [];
  const waiting = [];
  lines.on("line", (l) => { const w = waiting.shift(); if (w) w(l); else queue.push(l); });
  const next = () => new Promise((res, rej) => {
    if (queue.length) return res(queue.shift());
    const t = setTimeout(() => rej(new Error("replicas.py did not answer")), 180_000);
    waiting.push((l) => { clearTimeout(t); res(l); });
  });
  const exited = once(proc, "exit").then(([code]) => { throw new Error(`replicas.py exited with ${code}`); });
  exited.catch(() => {});
  const info = JSON.parse(await Promise.race([next(), exited]));
  let chain = Promise.resolve();
  const cmd = (obj) => {
    const p = chain.then(async () => {
      proc.stdin.write(JSON.stringify(obj) + "\n");
      const out = JSON.parse(await next());
      if (out.error) throw new Error(`replicas.py ${obj.cmd}: ${out.error}\n${out.trace || ""}`);
      return out;
    });
    chain = p.catch(() => {});
    return p;
  };
  const handle = {
    ...info,
    proc,
    cmd,
    sql: async (sql, params = []) => (await cmd({ cmd: "sql", sql, params })).rows,
    async stop() {
      proc.stdin.end();
      await once(proc, "exit");
    },
  };
  handle.admin = await Admin.login(handle.proxy, "admin", info.password);
  return handle;
}

/** An admin speaking plain HTTP (the way a backend service would). */
export class Admin {
  constructor(base, token) { this.base = base; this.token = token; }

  static async login(base, username, password) {
    const r = await fetch(new URL("auth/login", base + "/"), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ username, password }),
    });
    if (r.status !== 200) throw new Error(`admin login: ${r.status} ${await r.text()}`);
    return new Admin(base, (await r.json()).access_token);
  }

  async call(method, path, body, base = this.base) {
    const r = await fetch(base + path, {
      method, body: body === undefined ? undefined : JSON.stringify(body),
      headers: { Authorization: `Bearer ${this.token}`, "Content-Type": "application/json" },
    });
    const text = await r.text();
    return { status: r.status, body: text ? JSON.parse(text) : null };
  }

  async publish(body, base) {
    const r = await this.call("POST", "/events", body, base);
    if (r.status !== 202) throw new Error(`publish: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.id;
  }

  async addMember(room, userId) {
    const r = await this.call("PUT", `/rooms/${room}/members/${userId}`);
    if (r.status !== 204) throw new Error(`add member: ${r.status}`);
  }

  toolCall(userId, name, args, timeoutMs = 10_000) {
    return this.call("POST", "/tools/call", { user_id: userId, name, args, timeout_ms: timeoutMs });
  }
}

/** A fetch that keeps cookies like a browser would (Node's fetch has no jar): the refresh cookie. */
export function cookieFetch() {
  const jar = new Map();
  const f = async (input, init = {}) => {
    const url = new URL(String(input));
    const headers = new Headers(init.headers || {});
    const cookies = [...jar.values()].filter((c) => url.pathname.startsWith(c.path)).map((c) => `${c.name}=${c.value}`);
    if (cookies.length && init.credentials !== "omit") headers.set("Cookie", cookies.join("; "));
    const r = await fetch(url, { ...init, headers });
    for (const sc of r.headers.getSetCookie()) {
      const [pair, ...attrs] = sc.split(";").map((s) => s.trim());
      const eq = pair.indexOf("=");
      const name = pair.slice(0, eq);
      const value = pair.slice(eq + 1);
      const path = (attrs.find((a) => /^path=/i.test(a)) || "path=/").slice(5) || "/";
      const expired = attrs.some((a) => /^max-age=0$/i.test(a)) || value === "";
      if (expired) jar.delete(name); else jar.set(name, { name, value, path });
    }
    return r;
  };
  f.jar = jar;
  return f;
}

/** In-memory sessionStorage: two clients sharing one are a page before and after a reload. */
export class MemoryStorage {
  constructor() { this.m = new Map(); }
  getItem(k) { return this.m.has(k) ? this.m.get(k) : null; }
  setItem(k, v) { this.m.set(k, String(v)); }
  removeItem(k) { this.m.delete(k); }
}

/** A client on `env` plus a record of everything it emitted. */
export function makeClient(env, options = {}) {
  const client = new SwitchboardClient({ url: env.proxy, storage: null, backoff: { initialMs: 100, maxMs: 2000 },
    ...options });
  const rec = { events: [], states: [], retries: [], gaps: [], resumed: [], errors: [], rooms: [], typing: [],
    connected: [], closed: [] };
  client.on("event", (f) => rec.events.push(f));
  client.on("state", (s) => rec.states.push(s));
  client.on("retry", (r) => rec.retries.push(r));
  client.on("resume_gap", (p) => rec.gaps.push(p));
  client.on("resumed", (p) => rec.resumed.push(p));
  client.on("error", (p) => rec.errors.push(p));
  client.on("room", (r) => rec.rooms.push(r));
  client.on("typing", (f) => rec.typing.push(f));
  client.on("connected", (c) => rec.connected.push(c));
  client.on("closed", (c) => rec.closed.push(c));
  client.rec = rec;
  return client;
}

/** Resolve when pred() holds, re-checked on every client event; fail after WAIT. */
export function until(client, pred, what = "condition", timeout = WAIT) {
  return new Promise((res, rej) => {
    if (pred()) return res();
    const offs = [];
    const check = () => { if (pred()) { done(); res(); } };
    const done = () => { clearTimeout(t); offs.forEach((f) => f()); };
    const t = setTimeout(() => { done(); rej(new Error(`timed out waiting for ${what}`)); }, timeout);
    for (const ev of ["event", "state", "retry", "resume_gap", "resumed", "error", "room", "typing", "connected",
      "closed", "toolresult", "frame"]) offs.push(client.on(ev, check));
  });
}

export const ids = (client) => client.rec.events.map((f) => f.id);
