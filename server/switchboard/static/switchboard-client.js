// src/http.ts
var HttpError = class extends Error {
  constructor(status, message, body = null, retryAfter = 0) {
    super(message);
    this.name = "HttpError";
    this.status = status;
    this.body = body;
    this.retryAfter = retryAfter;
    this.type = typeof body?.type === "string" ? body.type : void 0;
    this.title = typeof body?.title === "string" ? body.title : void 0;
    const detail = body?.detail ?? body?.description;
    this.detail = typeof detail === "string" ? detail : void 0;
  }
};
async function request(fetchFn, url, opt) {
  const headers = { Accept: "application/json, application/problem+json" };
  if (opt.body !== void 0) headers["Content-Type"] = "application/json";
  if (opt.token) headers.Authorization = `Bearer ${opt.token}`;
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), opt.timeoutMs);
  let r;
  try {
    r = await fetchFn(url, {
      method: opt.method,
      headers,
      cache: "no-store",
      signal: ctl.signal,
      credentials: opt.credentials ?? "same-origin",
      body: opt.body === void 0 ? void 0 : JSON.stringify(opt.body)
    });
  } catch (e) {
    clearTimeout(timer);
    const aborted = e?.name === "AbortError";
    throw new HttpError(0, aborted ? `no answer from ${url.pathname} within ${opt.timeoutMs} ms` : `network error on ${url.pathname}: ${e?.message ?? e}`);
  }
  try {
    const text = r.status === 204 ? "" : await r.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!r.ok) {
      const body = data && typeof data === "object" ? data : null;
      const msg = body && (body.detail ?? body.description ?? body.title) || `HTTP ${r.status}`;
      throw new HttpError(r.status, String(msg), body, Number(r.headers.get("Retry-After")) || 0);
    }
    return data;
  } finally {
    clearTimeout(timer);
  }
}

// src/errors.ts
var SwitchboardError = class extends Error {
  constructor(code, message, o = {}) {
    super(message, o.cause === void 0 ? void 0 : { cause: o.cause });
    this.name = "SwitchboardError";
    this.code = code;
    this.closeCode = o.closeCode;
    this.status = o.status;
  }
};
var AuthError = class extends SwitchboardError {
  constructor(code, message, o) {
    super(code, message, o);
    this.name = "AuthError";
  }
};
var ForbiddenError = class extends SwitchboardError {
  constructor(code, message, o) {
    super(code, message, o);
    this.name = "ForbiddenError";
  }
};
var GoneError = class extends SwitchboardError {
  constructor(code, message, o = {}) {
    super(code, message, o);
    this.name = "GoneError";
    this.horizon = o.horizon;
  }
};
var RateLimitedError = class extends SwitchboardError {
  constructor(code, message, o = {}) {
    super(code, message, o);
    this.name = "RateLimitedError";
    this.retryAfter = o.retryAfter ?? 0;
  }
};
var ServerGoingAwayError = class extends SwitchboardError {
  constructor(code, message, o) {
    super(code, message, o);
    this.name = "ServerGoingAwayError";
  }
};
var CLOSE = {
  1001: [ServerGoingAwayError, "going_away"],
  1012: [ServerGoingAwayError, "service_restart"],
  1013: [RateLimitedError, "try_again_later"],
  1011: [SwitchboardError, "server_error"],
  1009: [SwitchboardError, "frame_too_large"],
  1003: [SwitchboardError, "unsupported_data"],
  4e3: [SwitchboardError, "ping_timeout"],
  4001: [SwitchboardError, "hello_timeout"]
};
var POLICY = {
  session_ended: AuthError,
  session_revoked: AuthError,
  frame_rate_exceeded: RateLimitedError
};
function closeError(code, reason) {
  if (code === 1e3) return void 0;
  const o = { closeCode: code };
  const msg = reason || `closed ${code}`;
  if (code === 1008) {
    const c2 = reason.toLowerCase().replace(/[^a-z0-9]+/g, "_").replace(/^_|_$/g, "") || "policy_violation";
    return new (POLICY[c2] ?? ForbiddenError)(c2, msg, o);
  }
  const [C, c] = CLOSE[code] ?? [SwitchboardError, "connection_lost"];
  return new C(c, msg, o);
}
function httpError(e, closeCode, msg, other = "no_ticket") {
  const s = e instanceof HttpError ? e.status : void 0;
  const o = { closeCode, status: s, cause: e, retryAfter: e?.retryAfter };
  if (s === 401) return new AuthError("unauthorized", msg, o);
  if (s === 403) return new ForbiddenError("forbidden", msg, o);
  if (s === 429) return new RateLimitedError("rate_limited", msg, o);
  return new SwitchboardError(s === void 0 ? other : s === 0 ? "network_error" : s >= 500 ? "server_error" : "http_error", msg, o);
}
function withError(value, error) {
  if (error) Object.defineProperty(value, "error", { value: error, configurable: true });
  return value;
}

// src/stream.ts
var StreamError = class extends SwitchboardError {
  constructor(code, message, stream) {
    super(code, message);
    this.name = "StreamError";
    this.stream = stream;
  }
};
var SwitchboardStream = class {
  /** @internal use `client.stream(id)` */
  constructor(id, host, after, opts) {
    this.host = host;
    this.opts = opts;
    this.buf = [];
    this.closed = false;
    this.subscribed = false;
    // a subscription on the current socket, as far as we know
    this.paused = false;
    // unsubscribed because the buffer is full
    this.waiters = [];
    this.id = id;
    this.last = after;
    this.max = Math.max(1, opts.bufferSize ?? 1e3);
    this.result = new Promise((ok, fail) => {
      this.settle = { ok, fail };
    });
    this.result.catch(() => {
    });
    this.onAbort = () => this.fail(opts.signal?.reason ?? new StreamError("closed", "aborted", id));
  }
  /** @internal */
  start() {
    const sig = this.opts.signal;
    if (sig?.aborted) return this.onAbort();
    sig?.addEventListener("abort", this.onAbort, { once: true });
    this.subscribe();
  }
  /** The seq of the last chunk yielded (`after` before the first). */
  get lastSeq() {
    return this.last;
  }
  /** The last seq held: yielded, or buffered and not yet yielded. */
  get held() {
    return this.last + this.buf.length;
  }
  [Symbol.asyncIterator]() {
    return this;
  }
  next() {
    try {
      const r = this.take();
      if (r) return Promise.resolve(r);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject });
    });
  }
  /** `break` out of a for-await loop lands here: unsubscribe and end the iteration. */
  return() {
    this.close(new StreamError("closed", "the stream was left before its end", this.id));
    return Promise.resolve({ value: void 0, done: true });
  }
  /** Ask the producer to stop: `stream.stop` on the socket, or `POST /streams/{id}/stop` when not
   *  connected. The iteration then ends with `result.status` "stopped". */
  async stop() {
    if (!this.host.send({ action: "stream.stop", stream: this.id })) await this.host.stopHttp(this.id);
  }
  // ---- from the client -------------------------------------------------------------------------
  /** @internal A new socket (hello): subscriptions do not outlive a socket. */
  connected() {
    this.subscribed = false;
    this.subscribe();
  }
  /** @internal stream.chunks. `quiet`: an unsubscribe is in flight, so this frame may belong to
   *  the old subscription: keep what fits, but a gap is no reason to subscribe again. */
  chunks(seq, chunks, quiet) {
    if (this.closed || !Number.isSafeInteger(seq) || !Array.isArray(chunks)) return;
    const held = this.held;
    if (seq > held + 1) {
      if (!quiet) this.resubscribe();
      return;
    }
    for (let i = held + 1 - seq; i < chunks.length; i++) {
      if (this.buf.length >= this.max) {
        this.pause();
        break;
      }
      this.buf.push(String(chunks[i]));
    }
    this.wake();
  }
  /** @internal stream.end; `ofSubscription`: it ended this socket's subscription (not the stored
   *  event, nor a frame of a subscription already given up). */
  ended(p, ofSubscription) {
    if (this.closed || !Number.isSafeInteger(p?.last_seq)) return;
    if (!this.end) {
      this.end = { status: p.status, last_seq: p.last_seq, final: p.final ?? null };
      this.settle.ok(this.end);
    }
    if (ofSubscription) {
      this.subscribed = false;
      this.subscribe();
    }
    this.wake();
  }
  /** @internal The server ended the subscription on its own (stream.unsubscribed nobody asked for). */
  dropped() {
    if (!this.subscribed) return;
    this.subscribed = false;
    this.subscribe();
  }
  /** @internal An error frame naming this stream. */
  refused(p) {
    if (p.action === "stream.stop" && p.code !== "stream_not_found") return;
    this.subscribed = false;
    this.fail(new StreamError(p.code, p.message, this.id));
  }
  // ---- internals ---------------------------------------------------------------------------------
  subscribe() {
    if (this.closed || this.paused || this.subscribed) return;
    if (this.end && this.held >= this.end.last_seq) return;
    this.subscribed = this.host.send({ action: "stream.subscribe", stream: this.id, after: this.held });
  }
  unsubscribe() {
    if (!this.subscribed) return;
    this.subscribed = false;
    this.host.unsubscribe(this.id);
  }
  resubscribe() {
    this.unsubscribe();
    this.subscribe();
  }
  pause() {
    this.paused = true;
    this.unsubscribe();
  }
  /** The next result if there is one now; null: wait. Throws the failure (once). */
  take() {
    if (this.failure !== void 0) {
      const e = this.failure;
      this.failure = void 0;
      throw e;
    }
    if (this.buf.length) {
      const data = this.buf.shift();
      const seq = ++this.last;
      if (this.opts.resume) this.host.save(this.id, seq);
      if (this.paused && this.buf.length <= this.max >> 1) {
        this.paused = false;
        this.subscribe();
      }
      return { value: { seq, data }, done: false };
    }
    if (this.closed) return { value: void 0, done: true };
    if (this.end && this.last >= this.end.last_seq) {
      this.close();
      return { value: void 0, done: true };
    }
    return null;
  }
  wake() {
    while (this.waiters.length) {
      let r;
      try {
        r = this.take();
      } catch (e) {
        this.waiters.shift()?.reject(e);
        continue;
      }
      if (!r) return;
      this.waiters.shift()?.resolve(r);
    }
  }
  fail(e) {
    if (this.closed) return;
    this.failure = e;
    this.close(e);
  }
  /** End the iteration: unsubscribe, forget, settle `result` if stream.end never came. */
  close(reason) {
    if (this.closed) return;
    this.closed = true;
    this.buf = [];
    this.unsubscribe();
    this.opts.signal?.removeEventListener("abort", this.onAbort);
    this.host.release(this);
    if (!this.end) this.settle.fail(reason ?? new StreamError("closed", "the stream was left before its end", this.id));
    this.wake();
  }
};

// src/api.ts
function buildPath(template, path, query) {
  let p = template.replace(/\{(\w+)\}/g, (_, k) => {
    const v = path?.[k];
    if (v === void 0 || v === null) throw new Error(`missing path parameter ${k} for ${template}`);
    return encodeURIComponent(String(v));
  });
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) if (v !== void 0 && v !== null) q.set(k, String(v));
  const qs = q.toString();
  if (qs) p += `?${qs}`;
  return p;
}

// src/presence.ts
var isMember = (e) => !!e && typeof e.user_id === "string" && Array.isArray(e.metas);
var members = (a) => Array.isArray(a) ? a.filter(isMember) : [];
var same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
function call(fns, ...args) {
  for (const f of [...fns]) {
    try {
      f(...args);
    } catch (e) {
      queueMicrotask(() => {
        throw e;
      });
    }
  }
}
function listen(set, fn) {
  set.add(fn);
  return () => {
    set.delete(fn);
  };
}
var PresenceList = class {
  constructor() {
    this.byId = /* @__PURE__ */ new Map();
    this.joins = /* @__PURE__ */ new Set();
    this.leaves = /* @__PURE__ */ new Set();
    this.syncs = /* @__PURE__ */ new Set();
    /** A state arrived (since the room was joined). */
    this.synced = false;
    /** The server says the room has more online members than its list holds. */
    this.truncated = false;
  }
  /** The online members, by username. */
  list() {
    return [...this.byId.values()].sort((a, b) => a.username < b.username ? -1 : a.username > b.username ? 1 : 0);
  }
  /** A presence.state: the whole list. What differs from the list kept so far (after a reconnect) is
   *  reported as joins and leaves. */
  state(p) {
    const next = new Map(members(p?.members).map((m) => [m.user_id, m]));
    this.truncated = p?.truncated === true;
    this.apply([...this.byId.values()].filter((m) => !next.has(m.user_id)), [...next.values()]);
  }
  /** A presence.diff: leaves, then joins (a join replaces the entry). */
  diff(p) {
    if (this.synced) this.apply(members(p?.leaves), members(p?.joins));
  }
  apply(gone, came) {
    this.synced = true;
    for (const m of gone) {
      const old = this.byId.get(m.user_id);
      if (old && this.byId.delete(m.user_id)) call(this.leaves, old);
    }
    for (const m of came) {
      const old = this.byId.get(m.user_id);
      if (old && same(old, m)) continue;
      this.byId.set(m.user_id, m);
      call(this.joins, m, old);
    }
    call(this.syncs, this.list());
  }
  /** The room was left: the list empties (each member leaves), and waits for the next state. */
  clear() {
    if (this.synced) this.apply([...this.byId.values()], []);
    this.synced = false;
  }
};
var PresenceHub = class {
  constructor(send, joined) {
    this.lists = /* @__PURE__ */ new Map();
    this.metas = /* @__PURE__ */ new Map();
    this.send = send;
    this.joined = joined;
  }
  /** The room's list; watching it asks the server for its presence (now if joined, else once joined). */
  watch(room) {
    let l = this.lists.get(room);
    if (!l) {
      this.lists.set(room, l = new PresenceList());
      if (this.joined(room)) this.ask(room);
    }
    return l;
  }
  /** Show this connection in the room with `meta` (kept and sent again after every reconnect). */
  track(room, meta) {
    this.metas.set(room, meta);
    this.watch(room);
    return this.joined(room) && this.ask(room);
  }
  ask(room) {
    const meta = this.metas.get(room);
    return this.send(meta ? { action: "presence.track", room, meta } : { action: "presence.subscribe", room });
  }
  /** A room's state changed (the client's `room` event). */
  room(room, state) {
    if (state === "joined") {
      if (this.lists.has(room)) this.ask(room);
    } else if (state !== "joining") {
      this.lists.get(room)?.clear();
      this.lists.delete(room);
      this.metas.delete(room);
    }
  }
  /** A presence frame from the server. */
  frame(f) {
    const l = typeof f.room === "string" ? this.lists.get(f.room) : void 0;
    if (!l) return;
    if (f.event === "presence.state") l.state(f.payload);
    else l.diff(f.payload);
  }
};

// src/room.ts
var SwitchboardRoom = class {
  /** @internal sb.room(name) makes these. */
  constructor(host, name, done) {
    this.fns = /* @__PURE__ */ new Map();
    this.host = host;
    this.name = name;
    this.done = done;
  }
  /** `joining` (asked for: now, or with the next connection), `joined`, or `left` (left, refused or removed:
   *  the client no longer wants it; the `room` event says why). */
  get state() {
    return this.host.state(this.name) ?? "left";
  }
  /** This room's stored app events named `event`, each once and in order (the client's `event` events
   *  with this room). Returns the function that unsubscribes. */
  on(event, fn) {
    let set = this.fns.get(event);
    if (!set) this.fns.set(event, set = /* @__PURE__ */ new Set());
    set.add(fn);
    this.unhook ?? (this.unhook = this.host.on("event", (e) => {
      if (e.room !== this.name) return;
      for (const f of [...this.fns.get(e.event) ?? []]) {
        try {
          f(e);
        } catch (err) {
          queueMicrotask(() => {
            throw err;
          });
        }
      }
    }));
    return () => this.off(event, fn);
  }
  off(event, fn) {
    this.fns.get(event)?.delete(fn);
  }
  /** `GET /rooms/{room}/members`: every member with `online` (one read; online() is pushed). */
  presence() {
    return this.host.presence(this.name);
  }
  /** Pushed presence (presence.state / presence.diff): `fn(member, previous)` when a member comes online
   *  (`previous` undefined) or their metadata changes. Watching the room's presence starts with the first
   *  of onJoin / onLeave / onSync / online / track. Returns the function that unsubscribes. */
  onJoin(fn) {
    return listen(this.host.watch(this.name).joins, fn);
  }
  /** Pushed presence: `fn(member)` when a member goes offline (their last socket, on any replica, closed). */
  onLeave(fn) {
    return listen(this.host.watch(this.name).leaves, fn);
  }
  /** Pushed presence: `fn(members)` after every state or diff, with the whole list. */
  onSync(fn) {
    return listen(this.host.watch(this.name).syncs, fn);
  }
  /** The members online now, by username, each with the metadata of their tracking connections (pushed
   *  presence: empty until the first presence.state arrives). */
  online() {
    return this.host.watch(this.name).list();
  }
  /** Show this connection in the room's presence with `meta` (at most 8 scalar values, 256 bytes), now and
   *  after every reconnect, until leave(). False when not sent now (not connected or not joined yet). */
  track(meta) {
    return this.host.track(this.name, meta);
  }
  /** Tell the room this user is typing (ephemeral; false when not connected). */
  typing(payload) {
    return this.host.typing(this.name, payload);
  }
  /** Leave the room (now and on later reconnects) and drop this handle's listeners. */
  leave() {
    this.unhook?.();
    this.unhook = void 0;
    this.fns.clear();
    this.done();
    this.host.leave(this.name);
  }
};

// src/sse.ts
var SseSocket = class {
  // actions go one at a time, in order
  constructor(url, host) {
    this.host = host;
    this.readyState = 0;
    this.onopen = null;
    this.onmessage = null;
    this.onclose = null;
    this.onerror = null;
    this.ctl = new AbortController();
    this.conn = "";
    this.secret = "";
    this.queue = Promise.resolve();
    void this.run(url);
  }
  async run(url) {
    let code = 1006;
    let reason = "";
    try {
      const r = await this.host.fetch(url, {
        headers: { Accept: "text/event-stream" },
        cache: "no-store",
        signal: this.ctl.signal
      });
      if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
      this.readyState = 1;
      this.onopen?.({});
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (; ; ) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          let name = "";
          const data = [];
          for (const line of buf.slice(0, i).split("\n")) {
            const m = /^(data|event): ?(.*)/.exec(line);
            if (m?.[1] === "data") data.push(m[2]);
            else if (m) name = m[2];
          }
          buf = buf.slice(i + 2);
          const text = data.join("\n");
          if (!text) continue;
          if (name === "connection") {
            const p = JSON.parse(text);
            this.conn = p.connection;
            this.secret = p.secret;
          } else if (name === "close") {
            const p = JSON.parse(text).payload;
            code = p.code;
            reason = p.reason;
          } else this.onmessage?.({ data: text });
        }
      }
    } catch (e) {
      if (!reason) reason = e?.message ?? String(e);
    }
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  send(text) {
    if (this.readyState !== 1 || !this.conn) return;
    const body = { ...JSON.parse(text), secret: this.secret };
    this.queue = this.queue.then(() => this.host.post(`sse/${this.conn}/actions`, body)).catch((e) => {
      const err = e instanceof HttpError ? e.body?.error : void 0;
      if (err && err.code !== "not_connected" && this.readyState === 1) {
        this.onmessage?.({ data: JSON.stringify({ id: null, event: "error", room: null, payload: err, ts: Date.now() }) });
      }
    });
  }
  close(code = 1e3, reason = "") {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.ctl.abort();
    const f = this.onclose;
    if (f) queueMicrotask(() => f({ code, reason }));
  }
};

// src/client.ts
var CURSOR_RE = /^[A-Za-z0-9._~-]{1,256}$/;
var ROOMS_IN_HANDSHAKE = 50;
var PERSIST_IDS = 256;
var TOOL_CALL_PREFIX = "tool.call.";
var PERSIST_STREAMS = 32;
function asBase(u) {
  const b = new URL(String(u));
  if (!b.pathname.endsWith("/")) b.pathname += "/";
  return b;
}
function pageBase() {
  const doc = globalThis.document;
  return doc?.baseURI ? new URL(".", doc.baseURI) : void 0;
}
function defaultBase() {
  const b = pageBase();
  if (b) return b;
  throw new Error("SwitchboardClient: pass options.url (there is no page to take it from)");
}
function defaultStorage() {
  try {
    const s = globalThis.sessionStorage;
    return s ?? null;
  } catch {
    return null;
  }
}
var MOVE_ON = [1001, 1012, 1013];
var frameError = (p) => typeof p.stream === "string" ? new StreamError(p.code, p.message, p.stream) : p.code === "forbidden" || p.code === "forbidden_event" ? new ForbiddenError(p.code, p.message) : p.code === "rate_limited" ? new RateLimitedError(p.code, p.message) : new SwitchboardError(p.code, p.message);
var SwitchboardClient = class {
  constructor(options = {}) {
    this.urlIndex = 0;
    // the next attempt takes the next URL (the last one failed)
    this.worked = false;
    this.listeners = /* @__PURE__ */ new Map();
    this._state = "closed";
    this.token = null;
    this.refreshing = null;
    /** The user this client is logged in as (from login/refresh, else the hello frame). */
    this.user = null;
    this.ws = null;
    // the transport in use is SSE (sse.ts)
    this.wsFails = 0;
    // WebSocket attempts in a row that never opened (-1: one opened once)
    this.opened = false;
    // the current attempt's transport opened
    this.gen = 0;
    // bumped per attempt: callbacks of an abandoned attempt are ignored
    this.wanted = false;
    this.attempt = 0;
    this.quick = false;
    this.helloSeen = false;
    this.seen = /* @__PURE__ */ new Set();
    this.floor = 0;
    this.rooms = /* @__PURE__ */ new Map();
    this.handles = /* @__PURE__ */ new Map();
    this.feeds = /* @__PURE__ */ new Set();
    this.toolFns = /* @__PURE__ */ new Map();
    this.answered = /* @__PURE__ */ new Set();
    this.outbox = [];
    this.streamsById = /* @__PURE__ */ new Map();
    this.unsubAcks = /* @__PURE__ */ new Map();
    // stream id -> last yielded seq (resume)
    this.presenceHub = new PresenceHub((f) => this.send(f), (r) => this.rooms.get(r) === "joined");
    /** The browser is back online: a pending retry goes now instead of waiting out its backoff. */
    this.onOnline = () => {
      if (!this.wanted || this._state !== "reconnecting" || this.ws) return;
      clearTimeout(this.retryTimer);
      this.attempt = 0;
      void this.open();
    };
    this.sseHost = {
      fetch: (u, i) => this.fetchFn(u, i),
      post: (path, body) => this.http("POST", path, body)
    };
    this.roomHost = {
      on: (event, fn) => this.on(event, fn),
      state: (room) => this.rooms.get(room),
      presence: (room) => this.presence(room),
      typing: (room, payload) => this.typing(room, payload),
      leave: (room) => this.leave(room),
      watch: (room) => this.presenceHub.watch(room),
      track: (room, meta) => this.presenceHub.track(room, meta)
    };
    this.streamHost = {
      send: (f) => this.send(f),
      unsubscribe: (id) => {
        if (this.send({ action: "stream.unsubscribe", stream: id })) this.unsubAcks.set(id, (this.unsubAcks.get(id) ?? 0) + 1);
      },
      stopHttp: async (id) => {
        try {
          await this.http("POST", `streams/${encodeURIComponent(id)}/stop`);
        } catch (e) {
          if (e instanceof HttpError && e.status === 404) throw new StreamError("stream_not_found", e.message, id);
          throw e;
        }
      },
      save: (id, seq) => {
        const m = this.storedStreamSeqs();
        delete m[id];
        m[id] = seq;
        const ids = Object.keys(m);
        for (const old of ids.slice(0, Math.max(0, ids.length - PERSIST_STREAMS))) delete m[old];
        try {
          this.storage?.setItem(`${this.storageKey}:streams`, JSON.stringify(m));
        } catch {
        }
      },
      release: (s) => {
        if (this.streamsById.get(s.id) === s) this.streamsById.delete(s.id);
      }
    };
    /** Tool answers, grouped: `client.tools.register(name, fn)`. */
    this.tools = {
      register: (name, fn) => this.registerTool(name, fn),
      unregister: (name) => {
        this.toolFns.delete(name);
      },
      names: () => [...this.toolFns.keys()]
    };
    const u = options.urls;
    this.resolver = typeof u === "function" ? u : void 0;
    this.urls = typeof u === "function" ? [] : (u ?? []).map(asBase);
    this.moveOn = !!this.resolver;
    this._base = this.urls[0] ?? (options.url !== void 0 ? asBase(options.url) : this.resolver ? pageBase() : defaultBase());
    this.WS = options.WebSocket ?? globalThis.WebSocket;
    this.transports = options.transports ?? ["websocket", "sse"];
    this.sse = this.transports[0] === "sse" || !this.WS && this.transports.includes("sse");
    const f = options.fetch ?? globalThis.fetch;
    if (!f) throw new Error("SwitchboardClient: no fetch available; pass options.fetch");
    this.fetchFn = options.fetch ?? ((input, init) => f(input, init));
    this.getTokenFn = options.getToken;
    this.storage = options.storage === void 0 ? defaultStorage() : options.storage;
    this.storageKey = options.storageKey ?? "switchboard:resume";
    this.random = options.random ?? Math.random;
    const b = options.backoff ?? {};
    this.opts = {
      pingIntervalMs: options.pingIntervalMs ?? 2e4,
      pongTimeoutMs: options.pongTimeoutMs ?? 1e4,
      openTimeoutMs: options.openTimeoutMs ?? 1e4,
      httpTimeoutMs: options.httpTimeoutMs ?? 1e4,
      dedupeWindow: options.dedupeWindow ?? 1e4,
      refreshOn401: options.refreshOn401 ?? true,
      backoff: {
        initialMs: b.initialMs ?? 500,
        maxMs: b.maxMs ?? 15e3,
        factor: b.factor ?? 2,
        stableMs: b.stableMs ?? 5e3
      }
    };
    for (const r of options.rooms ?? []) this.rooms.set(r, "joining");
    for (const f2 of options.feeds ?? []) this.feeds.add(f2);
    this.on("room", (c) => this.presenceHub.room(c.room, c.state));
    this.restore();
  }
  // ---- events ---------------------------------------------------------------------------
  /** Subscribe; returns the function that unsubscribes. */
  on(event, fn) {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, set = /* @__PURE__ */ new Set());
    set.add(fn);
    return () => {
      set.delete(fn);
    };
  }
  off(event, fn) {
    this.listeners.get(event)?.delete(fn);
  }
  emit(event, value) {
    for (const fn of [...this.listeners.get(event) ?? []]) {
      try {
        fn(value);
      } catch (e) {
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
  get state() {
    return this._state;
  }
  /** The API base URL in use: `url`, or with several URLs the one the client connects to now (REST calls
   *  follow it). With a resolver and no page, it exists once the resolver answered. */
  get base() {
    if (!this._base) throw new Error("SwitchboardClient: no URL yet (the resolver has not answered)");
    return this._base;
  }
  transition(to, detail = {}, error) {
    const from = this._state;
    if (from === to) return;
    this._state = to;
    const change = withError({ from, to, ...detail }, error);
    this.emit("state", change);
    if (to !== "connected") this.emit(to, change);
  }
  // ---- session (COORD sessions contract) ----------------------------------------------------
  /** POST /auth/login. Keeps the access token in memory; the server sets the HttpOnly refresh cookie. */
  async login(username, password) {
    const r = await this.http(
      "POST",
      "auth/login",
      { username, password },
      { auth: false, credentials: "include" }
    );
    this.setSession(r, username);
    return r;
  }
  /** POST /auth/refresh with the refresh cookie (credentials: 'include'): a new access token, a rotated cookie.
   *  Concurrent callers share one request (a refresh token is single use). */
  refresh() {
    if (!this.refreshing) {
      this.refreshing = this.refreshOnce().then((r) => {
        this.setSession(r);
        return r;
      }).finally(() => {
        this.refreshing = null;
      });
    }
    return this.refreshing;
  }
  async refreshOnce() {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.http("POST", "auth/refresh", void 0, { auth: false, credentials: "include" });
      } catch (e) {
        if (!(e instanceof HttpError) || e.status !== 409 || attempt >= 2) throw e;
        await new Promise((r) => setTimeout(r, Math.min(5e3, (e.retryAfter || 0.5) * 1e3)));
      }
    }
  }
  /** POST /auth/logout (ends the session on every replica: its sockets close 1008 "session ended"),
   *  then forget everything of this user here. */
  async logout() {
    try {
      await this.http("POST", "auth/logout", void 0, { credentials: "include", retry401: false });
    } catch (e) {
      if (!(e instanceof HttpError) || e.status !== 401) throw e;
    } finally {
      clearTimeout(this.refreshTimer);
      this.token = null;
      this.user = null;
      this.disconnect();
      this.forget();
    }
  }
  /** The access token in memory (null when logged out). */
  get accessToken() {
    return this.token;
  }
  setSession(r, username) {
    this.token = r.access_token;
    this.user = { id: r.user_id, role: r.role, username: username ?? this.user?.username };
    if (this.storedUser !== void 0 && this.storedUser !== r.user_id) this.forget();
    this.scheduleRefresh(r.expires_in);
  }
  /** While the client wants its socket, refresh before the access token expires: the server
   *  ends a session nobody refreshed within its lifetime, and closes its sockets (1008). */
  scheduleRefresh(expiresIn) {
    clearTimeout(this.refreshTimer);
    if (!(expiresIn > 0)) return;
    const delay = Math.max(1e3, expiresIn * 1e3 * (expiresIn > 120 ? 0.8 : 0.5));
    this.refreshTimer = setTimeout(() => {
      if (!this.wanted || this.token === null) return;
      this.refresh().catch((e) => {
        if (!this.wanted) return;
        if (e instanceof HttpError && e.status === 401) this.sessionOver(e);
        else this.scheduleRefresh(expiresIn / 4);
      });
    }, delay);
    this.refreshTimer.unref?.();
  }
  async bearer() {
    if (this.getTokenFn) return await this.getTokenFn() ?? null;
    return this.token;
  }
  /** A JSON call to the API with the bearer token; a 401 triggers one refresh and one retry. */
  async http(method, path, body, o = {}) {
    if (!this._base) {
      await this.nextUrl();
      this.moveOn = false;
    }
    const url = new URL(path.replace(/^\//, ""), this._base);
    const call2 = async () => request(this.fetchFn, url, {
      method,
      body,
      credentials: o.credentials,
      timeoutMs: this.opts.httpTimeoutMs,
      token: o.auth === false ? null : await this.bearer()
    });
    try {
      return await call2();
    } catch (e) {
      const canRefresh = o.auth !== false && o.retry401 !== false && !this.getTokenFn && this.opts.refreshOn401;
      if (!(e instanceof HttpError) || e.status !== 401 || !canRefresh) throw e;
      try {
        await this.refresh();
      } catch {
        throw e;
      }
      return call2();
    }
  }
  /** A typed REST call: `api("post", "/tasks", { body })`, `api("get", "/rooms/{room}/members", { path: { room } })`.
   *  Types come from the server's OpenAPI document (src/rest.ts). Errors are HttpError (problem+json). */
  api(method, path, ...[args]) {
    const a = args ?? {};
    return this.http(method.toUpperCase(), buildPath(path, a.path, a.query), a.body);
  }
  /** Room members with `online` (presence), from GET /rooms/{room}/members. */
  presence(room) {
    return this.http("GET", `rooms/${encodeURIComponent(room)}/members`);
  }
  // ---- connection ---------------------------------------------------------------------------
  /** Open the socket (and keep it open until disconnect(), a 1008, or the session ends). */
  connect() {
    if (this.wanted) return;
    if (!this.WS && !this.sse) throw new Error("SwitchboardClient: no WebSocket; pass options.WebSocket (Node 20: --experimental-websocket)");
    this.wanted = true;
    this.attempt = 0;
    this.quick = false;
    this.worked = false;
    this.transition("connecting");
    globalThis.addEventListener?.("online", this.onOnline);
    void this.open();
  }
  /** Close the socket and stop reconnecting. Rooms, tools and the resume position are kept. */
  disconnect() {
    this.stop(1e3, "client disconnected");
  }
  stop(code, reason, error) {
    this.wanted = false;
    globalThis.removeEventListener?.("online", this.onOnline);
    this.gen++;
    this.clearTimers();
    clearTimeout(this.retryTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) this.abandon(ws, 1e3, "bye");
    for (const r of this.rooms.keys()) this.rooms.set(r, "joining");
    this.persist();
    this.transition("closed", { code, reason }, error);
  }
  /** The session is over (a ticket or a refresh answered 401/403): closed, 4003, no retry. */
  sessionOver(e) {
    const reason = `session over: ${e.message}`;
    this.stop(4003, reason, httpError(e, 4003, reason));
  }
  abandon(ws, code, reason) {
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    try {
      ws.close(code, reason);
    } catch {
    }
  }
  clearTimers() {
    clearTimeout(this.openTimer);
    clearTimeout(this.stableTimer);
    clearTimeout(this.pingTimer);
    clearTimeout(this.pongTimer);
  }
  wsUrl(ticket) {
    const u = new URL(this.sse ? "sse" : "ws", this._base);
    if (!this.sse) u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    const q = new URLSearchParams({ ticket });
    if (this.cursor !== void 0) q.set("cursor", this.cursor);
    if (this.lastId !== void 0) q.set("after", String(this.lastId));
    const rooms = [...this.rooms.keys()].slice(0, ROOMS_IN_HANDSHAKE);
    if (rooms.length) q.set("rooms", rooms.join(","));
    if (this.feeds.size) q.set("feeds", [...this.feeds].join(","));
    u.search = q.toString().replace(/%2C/g, ",");
    return u.href;
  }
  /** The URL for the next attempt: the next of `urls` in turn, or the resolver's answer. */
  async nextUrl() {
    if (this.resolver) this._base = asBase(await this.resolver(this.failed));
    else if (this.urls.length > 1) this._base = this.urls[this.urlIndex = (this.urlIndex + 1) % this.urls.length];
  }
  async open() {
    const gen = ++this.gen;
    if (this.moveOn) {
      try {
        await this.nextUrl();
      } catch (e) {
        if (gen !== this.gen || !this.wanted) return;
        const reason = `no URL: ${e?.message ?? e}`;
        this.lost(4002, reason, 0, httpError(e, 4002, reason, "no_url"));
        return;
      }
      if (gen !== this.gen || !this.wanted) return;
      this.moveOn = false;
    }
    let ticket;
    try {
      ticket = (await this.http("POST", "ws/ticket")).ticket;
    } catch (e) {
      if (gen !== this.gen || !this.wanted) return;
      const err = e;
      if (err.status === 401 || err.status === 403) {
        this.sessionOver(err);
        return;
      }
      const reason = `no ticket: ${err.message}`;
      this.lost(4002, reason, (err.retryAfter ?? 0) * 1e3, httpError(e, 4002, reason));
      return;
    }
    if (gen !== this.gen || !this.wanted) return;
    const resuming = this.cursor !== void 0 || this.lastId !== void 0;
    this.resumedFromId = this.lastId;
    let ws;
    try {
      ws = this.sse ? new SseSocket(this.wsUrl(ticket), this.sseHost) : new this.WS(this.wsUrl(ticket));
    } catch (e) {
      const reason = `cannot open a WebSocket: ${e?.message ?? e}`;
      this.lost(4002, reason, 0, new SwitchboardError("connection_lost", reason, { closeCode: 4002, cause: e }));
      return;
    }
    this.ws = ws;
    this.helloSeen = false;
    this.opened = false;
    ws.onopen = () => {
      this.opened = true;
      if (!this.sse) this.wsFails = -1;
    };
    this.openTimer = setTimeout(() => {
      if (gen === this.gen && !this.helloSeen) this.dead(ws, 4001, "no hello in time");
    }, this.opts.openTimeoutMs);
    ws.onmessage = (m) => {
      if (gen === this.gen) this.onText(m.data, resuming);
    };
    ws.onclose = (ev) => {
      if (gen !== this.gen) return;
      this.ws = null;
      this.onClose(ev.code, ev.reason);
    };
    ws.onerror = () => {
    };
  }
  /** The socket is unusable without a close event (half-open, hung handshake): drop it and go on. */
  dead(ws, code, reason) {
    if (this.ws !== ws) return;
    this.ws = null;
    this.abandon(ws, 4e3, reason);
    this.onClose(code, reason);
  }
  onClose(code, reason) {
    if (!this.sse && !this.opened && this.wsFails >= 0 && ++this.wsFails >= 2) this.sse = this.transports.includes("sse");
    this.clearTimers();
    this.gen++;
    this.helloSeen = false;
    for (const [r] of this.rooms) this.rooms.set(r, "joining");
    this.persist();
    if (!this.wanted) return;
    if (code === 1008) {
      this.stop(1008, reason || "policy violation", closeError(code, reason));
      return;
    }
    this.lost(code, reason, 0, closeError(code, reason));
  }
  lost(code, reason, atLeastMs = 0, error) {
    this.clearTimers();
    if ((this.resolver || this.urls.length > 1) && (!this.worked || MOVE_ON.includes(code))) {
      this.moveOn = true;
      this.failed = this._base;
    }
    this.worked = false;
    let delay;
    if (code === 1012 && !this.quick) {
      this.quick = true;
      delay = Math.floor(this.random() * 100);
    } else {
      const b = this.opts.backoff;
      if (code === 1013) this.attempt = Math.max(this.attempt, 2);
      const ceiling = Math.min(b.maxMs, b.initialMs * b.factor ** this.attempt);
      delay = Math.round(ceiling * (0.5 + this.random() / 2));
    }
    delay = Math.max(delay, atLeastMs);
    this.attempt += 1;
    this.transition("reconnecting", { code, reason }, error);
    this.emit("retry", withError({ attempt: this.attempt, delayMs: delay, code, reason }, error));
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      if (this.wanted) void this.open();
    }, delay);
  }
  send(frame) {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1 || !this.helloSeen) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }
  armPing() {
    clearTimeout(this.pingTimer);
    clearTimeout(this.pongTimer);
    const ws = this.ws;
    if (!ws) return;
    this.pingTimer = setTimeout(() => {
      if (this.ws !== ws) return;
      this.send({ action: "ping" });
      this.pongTimer = setTimeout(() => this.dead(ws, 4e3, "ping timeout"), this.opts.pongTimeoutMs);
    }, this.opts.pingIntervalMs);
  }
  // ---- frames -----------------------------------------------------------------------------
  onText(data, resuming) {
    if (typeof data !== "string") return;
    let f;
    try {
      f = JSON.parse(data);
    } catch {
      return;
    }
    if (!f || typeof f !== "object" || Array.isArray(f)) return;
    this.armPing();
    try {
      this.onFrame(f, resuming);
    } catch (e) {
      queueMicrotask(() => {
        throw e;
      });
    }
  }
  onFrame(f, resuming) {
    this.emit("frame", f);
    if (f.id !== null && f.id !== void 0) {
      this.onEvent(f);
      return;
    }
    switch (f.event) {
      case "hello":
        this.onHello(f, resuming);
        return;
      case "joined":
        if (typeof f.room === "string") {
          if (this.rooms.has(f.room)) {
            this.rooms.set(f.room, "joined");
            this.emit("room", { room: f.room, state: "joined" });
          } else {
            this.send({ action: "leave", room: f.room });
          }
        }
        return;
      case "left": {
        const p = f.payload;
        if (typeof f.room === "string" && p?.reason === "removed") {
          this.rooms.delete(f.room);
          this.persist();
          this.emit("room", { room: f.room, state: "removed", reason: "removed" });
        }
        return;
      }
      case "resumed": {
        const p = f.payload;
        if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
        this.persist();
        this.emit("resumed", { ...p, ...this.resumedFromId !== void 0 ? { afterId: this.resumedFromId } : {} });
        return;
      }
      case "resume_gap": {
        const p = f.payload;
        if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
        this.emit("resume_gap", withError(p, new GoneError(
          "resume_gap",
          "missed events were reaped: the replay is incomplete",
          { horizon: p.horizon }
        )));
        return;
      }
      case "pong":
        return;
      case "error":
        this.onServerError(f.payload);
        return;
      case "typing":
        this.emit("typing", f);
        return;
      case "run.updated":
        this.emit("feed", f);
        return;
      case "presence.state":
      case "presence.diff":
        this.presenceHub.frame(f);
        return;
      case "subscribed":
        this.emit("subscribed", f.payload);
        return;
      case "stream.chunks":
      case "stream.end":
      case "stream.unsubscribed":
        this.onStreamFrame(f.event, f.payload, false);
        return;
    }
    if (typeof f.event === "string" && f.event.startsWith(TOOL_CALL_PREFIX)) {
      void this.onToolCall(f);
    }
  }
  onHello(f, resuming) {
    var _a;
    const p = f.payload;
    this.helloSeen = true;
    this.worked = true;
    clearTimeout(this.openTimer);
    if (this.storedUser !== void 0 && this.storedUser !== p.user_id) {
      this.forget();
      resuming = false;
    }
    this.storedUser = p.user_id;
    if (!this.user) this.user = { id: p.user_id, role: p.role, username: p.username };
    else (_a = this.user).username ?? (_a.username = p.username);
    if (this.cursor === void 0 && typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
    if (this.lastId === void 0 && Number.isInteger(p.last_id)) this.lastId = p.last_id;
    this.persist();
    this.unsubAcks.clear();
    for (const s of [...this.streamsById.values()]) s.connected();
    const joined = new Set(p.rooms ?? []);
    for (const [room, st] of this.rooms) {
      if (joined.has(room)) {
        if (st !== "joined") {
          this.rooms.set(room, "joined");
          this.emit("room", { room, state: "joined" });
        }
      }
    }
    this.transition("connected");
    this.emit("connected", {
      replica: p.replica,
      userId: p.user_id,
      username: p.username,
      role: p.role,
      resuming,
      transport: this.sse ? "sse" : "websocket",
      hello: p
    });
    for (const [room, st] of this.rooms) if (st === "joining" && !joined.has(room)) {
      if ([...this.rooms.keys()].indexOf(room) >= ROOMS_IN_HANDSHAKE) this.send({ action: "join", room });
    }
    const pending = this.outbox.splice(0);
    for (const text of pending) this.ws.send(text);
    clearTimeout(this.stableTimer);
    this.stableTimer = setTimeout(() => {
      this.attempt = 0;
      this.quick = false;
    }, this.opts.backoff.stableMs);
  }
  onEvent(f) {
    const id = f.id;
    if (!Number.isSafeInteger(id)) return;
    if (id <= this.floor || this.seen.has(id)) return;
    this.seen.add(id);
    if (this.seen.size > this.opts.dedupeWindow) {
      const oldest = this.seen.values().next().value;
      this.seen.delete(oldest);
      if (oldest > this.floor) this.floor = oldest;
    }
    if (typeof f.cursor === "string" && CURSOR_RE.test(f.cursor)) this.cursor = f.cursor;
    if (this.lastId === void 0 || id > this.lastId) this.lastId = id;
    this.persist();
    this.emit("event", f);
    if (f.event === "stream.end") this.onStreamFrame("stream.end", f.payload, true);
  }
  onServerError(p) {
    if (typeof p.stream === "string") this.onStreamFrame("error", p, false);
    if (p.action === "join" && typeof p.room === "string" && this.rooms.has(p.room) && p.code === "forbidden") {
      this.rooms.delete(p.room);
      this.persist();
      this.emit("room", { room: p.room, state: "refused", reason: p.message });
    }
    this.emit("error", withError(p, frameError(p)));
  }
  // ---- rooms, typing ------------------------------------------------------------------------
  /** Join a room now (if connected) and on every reconnect, until leave(). */
  join(room) {
    if (this.rooms.get(room) === "joined") return;
    this.rooms.set(room, "joining");
    this.persist();
    this.emit("room", { room, state: "joining" });
    this.send({ action: "join", room });
  }
  leave(room) {
    if (!this.rooms.delete(room)) return;
    this.persist();
    this.send({ action: "leave", room });
    this.emit("room", { room, state: "left" });
  }
  /** Receive a feed (the server's run feed: "runs", admins only) now and on every reconnect
   *  (in the handshake), until unsubscribe(). Its frames arrive as "feed" events. */
  subscribe(feed) {
    if (this.feeds.has(feed)) return;
    this.feeds.add(feed);
    this.send({ action: "subscribe", feed });
  }
  unsubscribe(feed) {
    if (!this.feeds.delete(feed)) return;
    this.send({ action: "unsubscribe", feed });
  }
  /** A handle on one room: joins it as join() does (now when connected, and in every reconnect's
   *  handshake) and gives its app events (`on(event, fn)`, typed by the event map), `presence()`,
   *  `typing()` and `leave()`. The same handle for the same name until it leaves. */
  room(name) {
    if (!this.rooms.has(name)) this.join(name);
    let h = this.handles.get(name);
    if (!h) {
      h = new SwitchboardRoom(this.roomHost, name, () => this.handles.delete(name));
      this.handles.set(name, h);
    }
    return h;
  }
  /** The feeds this client asks for. */
  feedNames() {
    return [...this.feeds];
  }
  /** The rooms this client wants, with their state. */
  roomStates() {
    return new Map(this.rooms);
  }
  /** Tell a joined room that this user is typing (ephemeral; dropped when not connected). */
  typing(room, payload = {}) {
    return this.send({ action: "publish", event: "typing", room, payload });
  }
  // ---- streams -------------------------------------------------------------------------------
  /** Read a stream (docs/how-to/streams.md) as an async iterable of `{seq, data}`: each chunk once and in
   *  order, across reconnects (it subscribes again after the last seq it has). Subscribes when
   *  connected; `for await` ends at `stream.end`, `break` unsubscribes. One reader per id at a time. */
  stream(id, opts = {}) {
    if (this.streamsById.has(id)) throw new Error(`SwitchboardClient: stream ${id} is already being read`);
    const after = opts.after ?? (opts.resume ? this.storedStreamSeqs()[id] : void 0) ?? 0;
    if (!Number.isSafeInteger(after) || after < 0) throw new RangeError(`stream: bad after ${after}`);
    const s = new SwitchboardStream(id, this.streamHost, after, opts);
    this.streamsById.set(id, s);
    s.start();
    return s;
  }
  /** `GET /streams`: this user's open streams (to pick up after a reload). */
  async streams() {
    return (await this.api("get", "/streams")).streams;
  }
  storedStreamSeqs() {
    if (!this.streamSeqs) {
      this.streamSeqs = {};
      try {
        const m = JSON.parse(this.storage?.getItem(`${this.storageKey}:streams`) ?? "{}");
        for (const k of Object.keys(m ?? {})) if (Number.isSafeInteger(m[k]) && m[k] >= 0) this.streamSeqs[k] = m[k];
      } catch {
      }
    }
    return this.streamSeqs;
  }
  onStreamFrame(event, p, stored) {
    const id = p?.stream;
    if (typeof id !== "string") return;
    const pending = this.unsubAcks.get(id) ?? 0;
    if (event === "stream.unsubscribed" || event === "error" && p.action === "stream.unsubscribe") {
      if (pending > 0) {
        if (pending > 1) this.unsubAcks.set(id, pending - 1);
        else this.unsubAcks.delete(id);
      } else if (event === "stream.unsubscribed") {
        this.streamsById.get(id)?.dropped();
      }
      return;
    }
    const s = this.streamsById.get(id);
    if (!s) return;
    const q = p;
    if (event === "stream.chunks") s.chunks(q.seq, q.chunks, pending > 0);
    else if (event === "stream.end") s.ended(p, !stored && pending === 0);
    else s.refused(p);
  }
  // ---- tool answers -------------------------------------------------------------------------
  /** Answer `tool.call` frames for `name` with fn(args): its result (or {error}) goes back as
   *  `tool.result.<id>`. Returns the function that unregisters. */
  registerTool(name, fn) {
    this.toolFns.set(name, fn);
    return () => {
      if (this.toolFns.get(name) === fn) this.toolFns.delete(name);
    };
  }
  async onToolCall(f) {
    const callId = f.event.slice(TOOL_CALL_PREFIX.length);
    if (this.answered.has(callId)) return;
    this.answered.add(callId);
    if (this.answered.size > 1e3) this.answered.delete(this.answered.values().next().value);
    const name = String(f.payload?.name);
    const call2 = { callId, name, args: f.payload?.args };
    this.emit("toolcall", call2);
    let result;
    let error;
    const fn = this.toolFns.get(name);
    if (!fn) {
      error = `unknown tool "${name}"`;
      result = { error, tools: [...this.toolFns.keys()] };
    } else {
      try {
        result = await fn(call2.args, call2);
      } catch (e) {
        error = String(e?.message ?? e);
        result = { error };
      }
    }
    const text = JSON.stringify({
      action: "publish",
      event: `tool.result.${callId}`,
      payload: result === void 0 ? null : result
    });
    const ws = this.ws;
    if (ws && ws.readyState === 1 && this.helloSeen) ws.send(text);
    else this.outbox.push(text);
    this.emit("toolresult", { ...call2, result, ...error ? { error } : {} });
  }
  // ---- the resume position across reloads ---------------------------------------------------
  restore() {
    if (!this.storage) return;
    try {
      const raw = this.storage.getItem(this.storageKey);
      if (!raw) return;
      const p = JSON.parse(raw);
      if (p?.v !== 1) return;
      if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
      if (Number.isSafeInteger(p.lastId) && p.lastId >= 0) this.lastId = p.lastId;
      if (typeof p.user === "string") this.storedUser = p.user;
      for (const id of p.ids ?? []) if (Number.isSafeInteger(id)) this.seen.add(id);
      for (const r of p.rooms ?? []) if (typeof r === "string" && !this.rooms.has(r)) this.rooms.set(r, "joining");
    } catch {
    }
  }
  persist() {
    if (!this.storage) return;
    const p = {
      v: 1,
      user: this.storedUser,
      cursor: this.cursor,
      lastId: this.lastId,
      ids: [...this.seen].slice(-PERSIST_IDS),
      rooms: [...this.rooms.keys()]
    };
    try {
      this.storage.setItem(this.storageKey, JSON.stringify(p));
    } catch {
    }
  }
  /** Forget the resume position, the de-duplication window, the rooms and the stream positions, and end
   *  the streams being read (logout, another user). */
  forget() {
    this.rooms.clear();
    this.cursor = void 0;
    this.lastId = void 0;
    this.storedUser = void 0;
    this.seen.clear();
    this.floor = 0;
    this.outbox = [];
    this.answered.clear();
    this.streamSeqs = void 0;
    for (const s of [...this.streamsById.values()]) void s.return();
    try {
      this.storage?.removeItem(this.storageKey);
      this.storage?.removeItem(`${this.storageKey}:streams`);
    } catch {
    }
  }
  /** The resume position this client would use now (for display and tests). */
  position() {
    return { cursor: this.cursor, lastId: this.lastId };
  }
};

// src/frames.ts
var SERVER_MESSAGES = ["hello", "joined", "left", "resumed", "resumeGap", "pong", "error", "event", "typing", "toolCall", "runUpdated", "subscribed", "streamChunks", "streamEnd", "streamUnsubscribed", "presenceState", "presenceDiff"];
var CLIENT_MESSAGES = ["joinAction", "leaveAction", "resumeAction", "typingAction", "toolResultAction", "pingAction", "subscribeAction", "unsubscribeAction", "streamSubscribeAction", "streamUnsubscribeAction", "streamStopAction", "presenceSubscribeAction", "presenceTrackAction"];
export {
  AuthError,
  CLIENT_MESSAGES,
  ForbiddenError,
  GoneError,
  HttpError,
  RateLimitedError,
  SERVER_MESSAGES,
  ServerGoingAwayError,
  StreamError,
  SwitchboardClient,
  SwitchboardError,
  SwitchboardStream
};
