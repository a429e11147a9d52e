// The Switchboard client: one socket per client, an explicit state machine,
// reconnect with resume, rooms, typing, presence and tool answers.
//
// States:   closed --connect()--> connecting --hello--> connected
//           connecting|connected --socket lost--> reconnecting --hello--> connected
//           any --disconnect() | 1008 | session over--> closed
// Every transition is emitted as "state" (and as the new state's own name).
// Several URLs (options.urls): each attempt goes to the URL in use; a failed attempt, or a
// replica going away, moves on to the next one; a URL that works is kept.
import type {
  ErrorFrame, EventFrame, HelloFrame, ResumeGapFrame, ResumedFrame, RunUpdatedFrame, ServerFrame, StreamEndFrame,
  SubscribedFrame, ToolCallFrame, TypingFrame, PresenceDiffFrame, PresenceMeta, PresenceStateFrame,
} from "./frames.js";
import { HttpError, request, type FetchLike, type LoginResponse } from "./http.js";
import { StreamError, SwitchboardStream, type StreamHost, type StreamInfo, type StreamOptions } from "./stream.js";
import { buildPath, type Answer, type ApiArgs, type Method, type Operation, type PathsWith } from "./api.js";
import type { paths } from "./rest.js";
import { closeError, ForbiddenError, GoneError, httpError, RateLimitedError, SwitchboardError,
  withError } from "./errors.js";
import { SwitchboardRoom, type AppEvent, type EventMap, type RoomPresence } from "./room.js";
import { SseSocket } from "./sse.js";
import { PresenceHub } from "./presence.js";

export type State = "connecting" | "connected" | "reconnecting" | "closed";

export interface StateChange {
  from: State;
  to: State;
  /** WebSocket close code that caused it (4000: ping timeout, 4001: handshake timeout, 4002: no ticket). */
  code?: number;
  /** Human-readable reason: the server's close reason, or what failed. */
  reason?: string;
  /** What went wrong, as a class (AuthError, ForbiddenError, RateLimitedError, ServerGoingAwayError, or a
   *  SwitchboardError); absent on a normal transition. Non-enumerable: JSON and spreads leave it out. */
  readonly error?: SwitchboardError;
}

export interface RetryInfo {
  /** 1 for the first retry after a loss; reset after a stable connection. */
  attempt: number;
  delayMs: number;
  code?: number;
  reason?: string;
  /** Why it retries (non-enumerable, as in StateChange). */
  readonly error?: SwitchboardError;
}

export interface ConnectedInfo {
  replica: string;
  userId: string;
  username: string;
  role: string;
  /** true when this connection resumed from a stored position (a replay precedes live frames). */
  resuming: boolean;
  /** How this connection reaches the server ("sse": the fallback, see options.transports). */
  transport: "websocket" | "sse";
  hello: HelloFrame["payload"];
}

export type RoomState = "joining" | "joined" | "left" | "refused" | "removed";
export interface RoomChange { room: string; state: RoomState; reason?: string }

export interface ToolCallInfo { callId: string; name: string; args: unknown }
export interface ToolResultInfo extends ToolCallInfo { result: unknown; error?: string }
export type ToolFn = (args: any, call: ToolCallInfo) => unknown | Promise<unknown>;

export interface ClientEvents<Events extends object = EventMap> {
  /** Every state transition. */
  state: StateChange;
  connecting: StateChange;
  connected: ConnectedInfo;
  reconnecting: StateChange;
  closed: StateChange;
  /** A reconnect attempt was scheduled. */
  retry: RetryInfo;
  /** A stored event (it has an id): delivered once, in stream order, across reconnects and reloads.
   *  Typed by the client's event map: `if (e.event === "chat.message") e.payload.text`. */
  event: AppEvent<Events>;
  typing: TypingFrame;
  /** The replay after a reconnect is complete. `afterId`: the last event id delivered before it. */
  resumed: ResumedFrame["payload"] & { afterId?: number };
  /** Some missed events were older than the server keeps: the replay is incomplete (`error`: a GoneError). */
  resume_gap: ResumeGapFrame["payload"] & { readonly error: GoneError };
  room: RoomChange;
  /** The server refused a frame (the socket stays open). `error`: the refusal as a class (ForbiddenError,
   *  RateLimitedError, StreamError, else a SwitchboardError with the frame's code); non-enumerable. */
  error: ErrorFrame["payload"] & { readonly error: SwitchboardError };
  toolcall: ToolCallInfo;
  toolresult: ToolResultInfo;
  /** A feed frame (not stored, id null): run.updated of the admin runs feed (see subscribe()). */
  feed: RunUpdatedFrame;
  /** The feeds this socket receives, after a subscribe or unsubscribe. */
  subscribed: SubscribedFrame["payload"];
  /** Every frame as received, before any processing (debugging, custom frames). */
  frame: ServerFrame;
}

export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketCtor = new (url: string) => WebSocketLike;

/** The part of the Web Storage API the client uses (sessionStorage by default). */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface BackoffOptions {
  /** First retry delay before jitter (ms). Default 500. */
  initialMs?: number;
  /** Upper bound of a delay (ms). Default 15000. */
  maxMs?: number;
  /** Growth per attempt. Default 2. */
  factor?: number;
  /** A connection that stays up this long resets the backoff (ms). Default 5000. */
  stableMs?: number;
}

/** Picks the API base URL for the next connection attempt: called before the first one and whenever the URL
 *  in use failed (`failed`: that URL; undefined the first time). Its answer is kept while it works. */
export type UrlResolver = (failed: URL | undefined) => string | URL | Promise<string | URL>;

export interface ClientOptions {
  /** The API's base URL (the origin, or the path prefix it is served under). Default: the page's base URI. */
  url?: string | URL;
  /** Several replicas' base URLs, tried in turn (with the backoff) and kept while one works; or a resolver
   *  called for each new URL. The REST calls follow the URL in use (`base`). Wins over `url`. */
  urls?: ReadonlyArray<string | URL> | UrlResolver;
  /** A WebSocket implementation. Default: globalThis.WebSocket (Node 20: run with --experimental-websocket). */
  WebSocket?: WebSocketCtor;
  /** How to reach the server, in order of preference. Default ["websocket", "sse"]: the WebSocket, and
   *  Server-Sent Events + POSTs (GET /sse) once it failed to open twice in a row without ever opening
   *  (a proxy that blocks upgrades). ["sse"]: SSE only; ["websocket"]: never SSE. */
  transports?: ReadonlyArray<"websocket" | "sse">;
  /** A fetch implementation. Default: globalThis.fetch. (Node has no cookie jar: inject one to use refresh.) */
  fetch?: FetchLike;
  /** Supply your own bearer tokens instead of the built-in session (login/refresh). */
  getToken?: () => string | null | undefined | Promise<string | null | undefined>;
  /** On a 401, try POST /auth/refresh once before giving up. Default true (built-in session only). */
  refreshOn401?: boolean;
  /** Where the resume position is kept across page reloads. Default: sessionStorage when present; null: memory only. */
  storage?: StorageLike | null;
  /** Default "switchboard:resume"; stream positions (stream(id, {resume: true})) go under `${storageKey}:streams`. */
  storageKey?: string;
  /** Rooms to join on the first connection. */
  rooms?: string[];
  /** Feeds to receive on every connection (the handshake's feeds=), e.g. ["runs"] (admins only). */
  feeds?: string[];
  backoff?: BackoffOptions;
  /** A ping goes out after this long without a frame (ms). Default 20000. */
  pingIntervalMs?: number;
  /** No frame this long after a ping: the connection is dead (ms). Default 10000. */
  pongTimeoutMs?: number;
  /** No hello this long after a connection attempt starts: give it up (ms). Default 10000. */
  openTimeoutMs?: number;
  httpTimeoutMs?: number;
  /** How many recent event ids are remembered to drop duplicates. Default 10000. */
  dedupeWindow?: number;
  /** Randomness for the jitter (tests). Default Math.random. */
  random?: () => number;
}

type Listener<T> = (value: T) => void;

interface Persisted { v: 1; user?: string; cursor?: string; lastId?: number; ids?: number[]; rooms?: string[] }

const CURSOR_RE = /^[A-Za-z0-9._~-]{1,256}$/;
const ROOMS_IN_HANDSHAKE = 50;
const PERSIST_IDS = 256;
const TOOL_CALL_PREFIX = "tool.call.";
const PERSIST_STREAMS = 32;

function asBase(u: string | URL): URL {
  const b = new URL(String(u));
  if (!b.pathname.endsWith("/")) b.pathname += "/";
  return b;
}

function pageBase(): URL | undefined {
  const doc = (globalThis as { document?: { baseURI?: string } }).document;
  return doc?.baseURI ? new URL(".", doc.baseURI) : undefined;
}

function defaultBase(): URL {
  const b = pageBase();
  if (b) return b;
  throw new Error("SwitchboardClient: pass options.url (there is no page to take it from)");
}

function defaultStorage(): StorageLike | null {
  try {
    const s = (globalThis as { sessionStorage?: StorageLike }).sessionStorage;
    return s ?? null;
  } catch {
    return null;   // storage blocked (privacy settings, sandboxed iframe)
  }
}

// The close codes after which the next attempt goes to another URL even though this one worked.
const MOVE_ON = [1001, 1012, 1013];

const frameError = (p: ErrorFrame["payload"]): SwitchboardError =>
  typeof p.stream === "string" ? new StreamError(p.code, p.message, p.stream)
    : p.code === "forbidden" || p.code === "forbidden_event" ? new ForbiddenError(p.code, p.message)
      : p.code === "rate_limited" ? new RateLimitedError(p.code, p.message)
        : new SwitchboardError(p.code, p.message);

/** The client. `Events` maps app event names to payload types (see `on("event")` and `room()`). */
export class SwitchboardClient<Events extends object = EventMap> {
  private _base: URL | undefined;
  private readonly urls: URL[];
  private readonly resolver: UrlResolver | undefined;
  private urlIndex = 0;
  private moveOn: boolean;          // the next attempt takes the next URL (the last one failed)
  private worked = false;           // the current URL gave a hello since the last attempt
  private failed: URL | undefined;  // the URL the client moves on from (the resolver's argument)
  private readonly opts: Required<Pick<ClientOptions, "pingIntervalMs" | "pongTimeoutMs" | "openTimeoutMs"
    | "httpTimeoutMs" | "dedupeWindow" | "refreshOn401">> & { backoff: Required<BackoffOptions> };
  private readonly WS: WebSocketCtor | undefined;
  private readonly fetchFn: FetchLike;
  private readonly getTokenFn: ClientOptions["getToken"];
  private readonly storage: StorageLike | null;
  private readonly storageKey: string;
  private readonly random: () => number;
  private readonly listeners = new Map<string, Set<Listener<any>>>();

  private _state: State = "closed";
  private token: string | null = null;
  private refreshing: Promise<LoginResponse> | null = null;
  /** The user this client is logged in as (from login/refresh, else the hello frame). */
  user: { id: string; role: string; username?: string } | null = null;

  private ws: WebSocketLike | null = null;
  private readonly transports: ReadonlyArray<"websocket" | "sse">;
  private sse: boolean;             // the transport in use is SSE (sse.ts)
  private wsFails = 0;              // WebSocket attempts in a row that never opened (-1: one opened once)
  private opened = false;           // the current attempt's transport opened
  private gen = 0;                  // bumped per attempt: callbacks of an abandoned attempt are ignored
  private wanted = false;
  private attempt = 0;
  private quick = false;            // the next retry after a 1012 goes at once (only once in a row)
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private openTimer: ReturnType<typeof setTimeout> | undefined;
  private stableTimer: ReturnType<typeof setTimeout> | undefined;
  private pingTimer: ReturnType<typeof setTimeout> | undefined;
  private pongTimer: ReturnType<typeof setTimeout> | undefined;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private helloSeen = false;        // on the current socket
  private resumedFromId: number | undefined;   // lastId when the current socket was opened

  // resume position and de-duplication
  private cursor: string | undefined;
  private lastId: number | undefined;
  private readonly seen = new Set<number>();
  private floor = 0;                // ids at or below this fell out of the window: treated as seen
  private storedUser: string | undefined;

  private readonly rooms = new Map<string, "joining" | "joined">();
  private readonly handles = new Map<string, SwitchboardRoom<Events>>();
  private readonly feeds = new Set<string>();
  private readonly toolFns = new Map<string, ToolFn>();
  private readonly answered = new Set<string>();
  private outbox: string[] = [];
  private readonly streamsById = new Map<string, SwitchboardStream>();
  private readonly unsubAcks = new Map<string, number>();   // stream.unsubscribe sent, answer not yet in
  private streamSeqs: Record<string, number> | undefined;    // stream id -> last yielded seq (resume)
  private readonly presenceHub = new PresenceHub((f) => this.send(f), (r) => this.rooms.get(r) === "joined");

  constructor(options: ClientOptions = {}) {
    const u = options.urls;
    this.resolver = typeof u === "function" ? u : undefined;
    this.urls = typeof u === "function" ? [] : (u ?? []).map(asBase);
    this.moveOn = !!this.resolver;
    this._base = this.urls[0] ?? (options.url !== undefined ? asBase(options.url)
      : this.resolver ? pageBase() : defaultBase());
    this.WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketCtor }).WebSocket;
    this.transports = options.transports ?? ["websocket", "sse"];
    this.sse = this.transports[0] === "sse" || (!this.WS && this.transports.includes("sse"));
    const f = options.fetch ?? (globalThis as { fetch?: FetchLike }).fetch;
    if (!f) throw new Error("SwitchboardClient: no fetch available; pass options.fetch");
    this.fetchFn = options.fetch ?? ((input, init) => f(input, init));   // keep fetch's `this` = globalThis
    this.getTokenFn = options.getToken;
    this.storage = options.storage === undefined ? defaultStorage() : options.storage;
    this.storageKey = options.storageKey ?? "switchboard:resume";
    this.random = options.random ?? Math.random;
    const b = options.backoff ?? {};
    this.opts = {
      pingIntervalMs: options.pingIntervalMs ?? 20_000,
      pongTimeoutMs: options.pongTimeoutMs ?? 10_000,
      openTimeoutMs: options.openTimeoutMs ?? 10_000,
      httpTimeoutMs: options.httpTimeoutMs ?? 10_000,
      dedupeWindow: options.dedupeWindow ?? 10_000,
      refreshOn401: options.refreshOn401 ?? true,
      backoff: { initialMs: b.initialMs ?? 500, maxMs: b.maxMs ?? 15_000, factor: b.factor ?? 2,
        stableMs: b.stableMs ?? 5_000 },
    };
    for (const r of options.rooms ?? []) this.rooms.set(r, "joining");
    for (const f of options.feeds ?? []) this.feeds.add(f);
    this.on("room", (c) => this.presenceHub.room(c.room, c.state));   // pushed presence follows the rooms
    this.restore();
  }

  // ---- events ---------------------------------------------------------------------------
  /** Subscribe; returns the function that unsubscribes. */
  on<K extends keyof ClientEvents<Events>>(event: K, fn: Listener<ClientEvents<Events>[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(fn);
    return () => { set!.delete(fn); };
  }

  off<K extends keyof ClientEvents<Events>>(event: K, fn: Listener<ClientEvents<Events>[K]>): void {
    this.listeners.get(event)?.delete(fn);
  }

  private emit<K extends keyof ClientEvents<Events>>(event: K, value: ClientEvents<Events>[K]): void {
    for (const fn of [...(this.listeners.get(event) ?? [])]) {
      try {
        fn(value);
      } catch (e) {
        // A throwing listener must not break the connection: report it out of band.
        queueMicrotask(() => { throw e; });
      }
    }
  }

  get state(): State { return this._state; }

  /** The API base URL in use: `url`, or with several URLs the one the client connects to now (REST calls
   *  follow it). With a resolver and no page, it exists once the resolver answered. */
  get base(): URL {
    if (!this._base) throw new Error("SwitchboardClient: no URL yet (the resolver has not answered)");
    return this._base;
  }

  private transition(to: State, detail: { code?: number; reason?: string } = {}, error?: SwitchboardError): void {
    const from = this._state;
    if (from === to) return;
    this._state = to;
    const change: StateChange = withError({ from, to, ...detail }, error);
    this.emit("state", change);
    if (to !== "connected") this.emit(to, change);
  }

  // ---- session (COORD sessions contract) ----------------------------------------------------
  /** POST /auth/login. Keeps the access token in memory; the server sets the HttpOnly refresh cookie. */
  async login(username: string, password: string): Promise<LoginResponse> {
    const r = await this.http<LoginResponse>("POST", "auth/login", { username, password },
      { auth: false, credentials: "include" });
    this.setSession(r, username);
    return r;
  }

  /** POST /auth/refresh with the refresh cookie (credentials: 'include'): a new access token, a rotated cookie.
   *  Concurrent callers share one request (a refresh token is single use). */
  refresh(): Promise<LoginResponse> {
    if (!this.refreshing) {
      this.refreshing = this.refreshOnce()
        .then((r) => { this.setSession(r); return r; })
        .finally(() => { this.refreshing = null; });
    }
    return this.refreshing;
  }

  private async refreshOnce(): Promise<LoginResponse> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.http<LoginResponse>("POST", "auth/refresh", undefined, { auth: false, credentials: "include" });
      } catch (e) {
        // 409: another tab of this browser used the same refresh token a moment ago; by now the
        // browser holds the rotated cookie, so a retry after Retry-After succeeds.
        if (!(e instanceof HttpError) || e.status !== 409 || attempt >= 2) throw e;
        await new Promise((r) => setTimeout(r, Math.min(5000, (e.retryAfter || 0.5) * 1000)));
      }
    }
  }

  /** POST /auth/logout (ends the session on every replica: its sockets close 1008 "session ended"),
   *  then forget everything of this user here. */
  async logout(): Promise<void> {
    try {
      // The bearer token or the refresh cookie alone is enough (a tab whose access token expired).
      await this.http("POST", "auth/logout", undefined, { credentials: "include", retry401: false });
    } catch (e) {
      if (!(e instanceof HttpError) || e.status !== 401) throw e;   // 401: there was no session to end
    } finally {
      clearTimeout(this.refreshTimer);
      this.token = null;
      this.user = null;
      this.disconnect();
      this.forget();
    }
  }

  /** The access token in memory (null when logged out). */
  get accessToken(): string | null { return this.token; }

  private setSession(r: LoginResponse, username?: string): void {
    this.token = r.access_token;
    this.user = { id: r.user_id, role: r.role, username: username ?? this.user?.username };
    if (this.storedUser !== undefined && this.storedUser !== r.user_id) this.forget();
    this.scheduleRefresh(r.expires_in);
  }

  /** While the client wants its socket, refresh before the access token expires: the server
   *  ends a session nobody refreshed within its lifetime, and closes its sockets (1008). */
  private scheduleRefresh(expiresIn: number): void {
    clearTimeout(this.refreshTimer);
    if (!(expiresIn > 0)) return;
    const delay = Math.max(1000, expiresIn * 1000 * (expiresIn > 120 ? 0.8 : 0.5));
    this.refreshTimer = setTimeout(() => {
      if (!this.wanted || this.token === null) return;   // nobody needs it now: a later 401 refreshes
      this.refresh().catch((e) => {
        if (!this.wanted) return;
        if (e instanceof HttpError && e.status === 401) this.sessionOver(e);
        else this.scheduleRefresh(expiresIn / 4);        // the server did not answer: try again sooner
      });
    }, delay);
    // A timer must not keep a Node process alive on its own.
    (this.refreshTimer as { unref?: () => void }).unref?.();
  }

  private async bearer(): Promise<string | null> {
    if (this.getTokenFn) return (await this.getTokenFn()) ?? null;
    return this.token;
  }

  /** A JSON call to the API with the bearer token; a 401 triggers one refresh and one retry. */
  async http<T>(method: string, path: string, body?: unknown,
    o: { auth?: boolean; credentials?: RequestCredentials; retry401?: boolean } = {}): Promise<T> {
    if (!this._base) {             // a resolver and no page: its first answer
      await this.nextUrl();
      this.moveOn = false;
    }
    const url = new URL(path.replace(/^\//, ""), this._base);
    const call = async () => request<T>(this.fetchFn, url, {
      method, body, credentials: o.credentials, timeoutMs: this.opts.httpTimeoutMs,
      token: o.auth === false ? null : await this.bearer(),
    });
    try {
      return await call();
    } catch (e) {
      const canRefresh = o.auth !== false && o.retry401 !== false && !this.getTokenFn && this.opts.refreshOn401;
      if (!(e instanceof HttpError) || e.status !== 401 || !canRefresh) throw e;
      try {
        await this.refresh();
      } catch {
        throw e;   // the refresh failed: the original 401 is the answer
      }
      return call();
    }
  }

  /** A typed REST call: `api("post", "/tasks", { body })`, `api("get", "/rooms/{room}/members", { path: { room } })`.
   *  Types come from the server's OpenAPI document (src/rest.ts). Errors are HttpError (problem+json). */
  api<M extends Method, P extends PathsWith<M> & keyof paths>(method: M, path: P,
    ...[args]: {} extends ApiArgs<Operation<P, M>> ? [ApiArgs<Operation<P, M>>?] : [ApiArgs<Operation<P, M>>]
  ): Promise<Answer<Operation<P, M>>> {
    const a = (args ?? {}) as { path?: Record<string, unknown>; query?: Record<string, unknown>; body?: unknown };
    return this.http(method.toUpperCase(), buildPath(path, a.path, a.query), a.body);
  }

  /** Room members with `online` (presence), from GET /rooms/{room}/members. */
  presence(room: string): Promise<RoomPresence> {
    return this.http("GET", `rooms/${encodeURIComponent(room)}/members`);
  }

  // ---- connection ---------------------------------------------------------------------------
  /** Open the socket (and keep it open until disconnect(), a 1008, or the session ends). */
  connect(): void {
    if (this.wanted) return;
    if (!this.WS && !this.sse) throw new Error("SwitchboardClient: no WebSocket; pass options.WebSocket (Node 20: --experimental-websocket)");
    this.wanted = true;
    this.attempt = 0;
    this.quick = false;
    this.worked = false;
    this.transition("connecting");
    (globalThis as { addEventListener?: (t: string, f: () => void) => void }).addEventListener?.("online", this.onOnline);
    void this.open();
  }

  /** The browser is back online: a pending retry goes now instead of waiting out its backoff. */
  private readonly onOnline = (): void => {
    if (!this.wanted || this._state !== "reconnecting" || this.ws) return;
    clearTimeout(this.retryTimer);
    this.attempt = 0;
    void this.open();
  };

  /** Close the socket and stop reconnecting. Rooms, tools and the resume position are kept. */
  disconnect(): void {
    this.stop(1000, "client disconnected");
  }

  private stop(code: number, reason: string, error?: SwitchboardError): void {
    this.wanted = false;
    (globalThis as { removeEventListener?: (t: string, f: () => void) => void }).removeEventListener?.("online", this.onOnline);
    this.gen++;
    this.clearTimers();
    clearTimeout(this.retryTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) this.abandon(ws, 1000, "bye");
    for (const r of this.rooms.keys()) this.rooms.set(r, "joining");
    this.persist();
    this.transition("closed", { code, reason }, error);
  }

  /** The session is over (a ticket or a refresh answered 401/403): closed, 4003, no retry. */
  private sessionOver(e: HttpError): void {
    const reason = `session over: ${e.message}`;
    this.stop(4003, reason, httpError(e, 4003, reason));
  }

  private abandon(ws: WebSocketLike, code: number, reason: string): void {
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    try { ws.close(code, reason); } catch { /* already closed */ }
  }

  private clearTimers(): void {
    clearTimeout(this.openTimer);
    clearTimeout(this.stableTimer);
    clearTimeout(this.pingTimer);
    clearTimeout(this.pongTimer);
  }

  private wsUrl(ticket: string): string {
    const u = new URL(this.sse ? "sse" : "ws", this._base);
    if (!this.sse) u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    const q = new URLSearchParams({ ticket });
    // Resume in the handshake: the server joins the rooms and replays everything after the
    // position before any live frame, so nothing live can overtake the replay.
    // Both when both are known: a server with cursors resumes from the cursor (it wins), a
    // replica of the previous release (a rolling update) ignores it and resumes after the id.
    if (this.cursor !== undefined) q.set("cursor", this.cursor);
    if (this.lastId !== undefined) q.set("after", String(this.lastId));
    const rooms = [...this.rooms.keys()].slice(0, ROOMS_IN_HANDSHAKE);
    if (rooms.length) q.set("rooms", rooms.join(","));
    if (this.feeds.size) q.set("feeds", [...this.feeds].join(","));
    u.search = q.toString().replace(/%2C/g, ",");
    return u.href;
  }

  /** The URL for the next attempt: the next of `urls` in turn, or the resolver's answer. */
  private async nextUrl(): Promise<void> {
    if (this.resolver) this._base = asBase(await this.resolver(this.failed));
    else if (this.urls.length > 1) this._base = this.urls[this.urlIndex = (this.urlIndex + 1) % this.urls.length];
  }

  private async open(): Promise<void> {
    const gen = ++this.gen;
    if (this.moveOn) {
      try {
        await this.nextUrl();
      } catch (e) {
        if (gen !== this.gen || !this.wanted) return;
        const reason = `no URL: ${(e as Error)?.message ?? e}`;
        this.lost(4002, reason, 0, httpError(e, 4002, reason, "no_url"));
        return;
      }
      if (gen !== this.gen || !this.wanted) return;
      this.moveOn = false;
    }
    let ticket: string;
    try {
      // A ticket is single use and short-lived: a fresh one for every attempt.
      ticket = (await this.http<{ ticket: string }>("POST", "ws/ticket")).ticket;
    } catch (e) {
      if (gen !== this.gen || !this.wanted) return;
      const err = e as HttpError;
      if (err.status === 401 || err.status === 403) {
        this.sessionOver(err);
        return;
      }
      const reason = `no ticket: ${err.message}`;
      this.lost(4002, reason, (err.retryAfter ?? 0) * 1000, httpError(e, 4002, reason));
      return;
    }
    if (gen !== this.gen || !this.wanted) return;
    const resuming = this.cursor !== undefined || this.lastId !== undefined;
    this.resumedFromId = this.lastId;
    let ws: WebSocketLike;
    try {
      ws = this.sse ? new SseSocket(this.wsUrl(ticket), this.sseHost) : new this.WS!(this.wsUrl(ticket));
    } catch (e) {
      const reason = `cannot open a WebSocket: ${(e as Error)?.message ?? e}`;
      this.lost(4002, reason, 0, new SwitchboardError("connection_lost", reason, { closeCode: 4002, cause: e }));
      return;
    }
    this.ws = ws;
    this.helloSeen = false;
    this.opened = false;
    ws.onopen = () => { this.opened = true; if (!this.sse) this.wsFails = -1; };
    this.openTimer = setTimeout(() => {
      if (gen === this.gen && !this.helloSeen) this.dead(ws, 4001, "no hello in time");
    }, this.opts.openTimeoutMs);
    ws.onmessage = (m) => { if (gen === this.gen) this.onText(m.data, resuming); };
    ws.onclose = (ev) => {
      if (gen !== this.gen) return;
      this.ws = null;
      this.onClose(ev.code, ev.reason);
    };
    ws.onerror = () => { /* a close event follows */ };
  }

  /** The socket is unusable without a close event (half-open, hung handshake): drop it and go on. */
  private dead(ws: WebSocketLike, code: number, reason: string): void {
    if (this.ws !== ws) return;
    this.ws = null;
    this.abandon(ws, 4000, reason);
    this.onClose(code, reason);
  }

  private readonly sseHost = { fetch: (u: string | URL, i?: RequestInit) => this.fetchFn(u, i),
    post: (path: string, body: unknown) => this.http("POST", path, body) };

  private onClose(code: number, reason: string): void {
    // A WebSocket that never opened twice in a row (and never once before): fall back to SSE.
    if (!this.sse && !this.opened && this.wsFails >= 0 && ++this.wsFails >= 2) this.sse = this.transports.includes("sse");
    this.clearTimers();
    this.gen++;
    this.helloSeen = false;
    for (const [r] of this.rooms) this.rooms.set(r, "joining");
    this.persist();
    if (!this.wanted) return;
    if (code === 1008) {
      // Policy: the session ended, the user was disabled, the token revoked. Retrying cannot help.
      this.stop(1008, reason || "policy violation", closeError(code, reason));
      return;
    }
    this.lost(code, reason, 0, closeError(code, reason));
  }

  private lost(code: number, reason: string, atLeastMs = 0, error?: SwitchboardError): void {
    this.clearTimers();
    // Several URLs: a failed attempt, or a replica that is going away, moves on to the next one; a loss
    // after a working connection tries the same URL once more first (a blip, not a dead replica).
    if ((this.resolver || this.urls.length > 1) && (!this.worked || MOVE_ON.includes(code))) {
      this.moveOn = true;
      this.failed = this._base;
    }
    this.worked = false;
    let delay: number;
    if (code === 1012 && !this.quick) {
      // The replica is restarting and another one is up: go at once (a little jitter spreads a herd).
      this.quick = true;
      delay = Math.floor(this.random() * 100);
    } else {
      const b = this.opts.backoff;
      if (code === 1013) this.attempt = Math.max(this.attempt, 2);   // overloaded: not too soon
      const ceiling = Math.min(b.maxMs, b.initialMs * b.factor ** this.attempt);
      delay = Math.round(ceiling * (0.5 + this.random() / 2));         // jitter: 50-100 % of the ceiling
    }
    delay = Math.max(delay, atLeastMs);
    this.attempt += 1;
    this.transition("reconnecting", { code, reason }, error);
    this.emit("retry", withError({ attempt: this.attempt, delayMs: delay, code, reason }, error));
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => { if (this.wanted) void this.open(); }, delay);
  }

  private send(frame: object): boolean {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1 || !this.helloSeen) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  private armPing(): void {
    clearTimeout(this.pingTimer);
    clearTimeout(this.pongTimer);
    const ws = this.ws;
    if (!ws) return;
    // After pingIntervalMs without any frame, ping; no frame within pongTimeoutMs after that
    // means the connection is dead (a half-open TCP connection, or a 1012 lost in a partition).
    this.pingTimer = setTimeout(() => {
      if (this.ws !== ws) return;
      this.send({ action: "ping" });
      this.pongTimer = setTimeout(() => this.dead(ws, 4000, "ping timeout"), this.opts.pongTimeoutMs);
    }, this.opts.pingIntervalMs);
  }

  // ---- frames -----------------------------------------------------------------------------
  private onText(data: unknown, resuming: boolean): void {
    if (typeof data !== "string") return;
    let f: ServerFrame;
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
      // A frame this client cannot handle (a server newer or broken) must not stop the socket.
      queueMicrotask(() => { throw e; });
    }
  }

  private onFrame(f: ServerFrame, resuming: boolean): void {
    this.emit("frame", f);
    if (f.id !== null && f.id !== undefined) {
      this.onEvent(f as EventFrame);
      return;
    }
    switch (f.event) {
      case "hello": this.onHello(f as HelloFrame, resuming); return;
      case "joined":
        if (typeof f.room === "string") {
          if (this.rooms.has(f.room)) {
            this.rooms.set(f.room, "joined");
            this.emit("room", { room: f.room, state: "joined" });
          } else {
            this.send({ action: "leave", room: f.room });   // left while the join was in flight
          }
        }
        return;
      case "left": {
        const p = (f as { payload?: { reason?: string } }).payload;
        if (typeof f.room === "string" && p?.reason === "removed") {
          this.rooms.delete(f.room);
          this.persist();
          this.emit("room", { room: f.room, state: "removed", reason: "removed" });
        }
        return;
      }
      case "resumed": {
        const p = (f as ResumedFrame).payload;
        if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
        this.persist();
        this.emit("resumed", { ...p, ...(this.resumedFromId !== undefined ? { afterId: this.resumedFromId } : {}) });
        return;
      }
      case "resume_gap": {
        const p = (f as ResumeGapFrame).payload;
        if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
        this.emit("resume_gap", withError(p, new GoneError("resume_gap", "missed events were reaped: the replay is incomplete",
          { horizon: p.horizon })) as ClientEvents["resume_gap"]);
        return;
      }
      case "pong": return;
      case "error": this.onServerError((f as ErrorFrame).payload); return;
      case "typing": this.emit("typing", f as TypingFrame); return;
      case "run.updated": this.emit("feed", f as RunUpdatedFrame); return;
      case "presence.state": case "presence.diff": this.presenceHub.frame(f as PresenceStateFrame | PresenceDiffFrame); return;
      case "subscribed": this.emit("subscribed", (f as SubscribedFrame).payload); return;
      case "stream.chunks": case "stream.end": case "stream.unsubscribed":
        this.onStreamFrame(f.event, (f as { payload: { stream: string } }).payload, false);
        return;
    }
    if (typeof f.event === "string" && f.event.startsWith(TOOL_CALL_PREFIX)) {
      void this.onToolCall(f as ToolCallFrame);
    }
  }

  private onHello(f: HelloFrame, resuming: boolean): void {
    const p = f.payload;
    this.helloSeen = true;
    this.worked = true;
    clearTimeout(this.openTimer);
    if (this.storedUser !== undefined && this.storedUser !== p.user_id) {
      this.forget();                // a position stored by another user of this tab means nothing here
      resuming = false;
    }
    this.storedUser = p.user_id;
    if (!this.user) this.user = { id: p.user_id, role: p.role, username: p.username };
    else this.user.username ??= p.username;
    // With nothing to resume from, start at the position the server gives: events after it come live.
    if (this.cursor === undefined && typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
    if (this.lastId === undefined && Number.isInteger(p.last_id)) this.lastId = p.last_id;
    this.persist();
    this.unsubAcks.clear();   // answers to the old socket's unsubscribes will not come
    for (const s of [...this.streamsById.values()]) s.connected();
    const joined = new Set(p.rooms ?? []);
    for (const [room, st] of this.rooms) {
      if (joined.has(room)) {
        if (st !== "joined") { this.rooms.set(room, "joined"); this.emit("room", { room, state: "joined" }); }
      }
    }
    this.transition("connected");
    this.emit("connected", { replica: p.replica, userId: p.user_id, username: p.username, role: p.role,
      resuming, transport: this.sse ? "sse" : "websocket", hello: p });
    // Rooms past the handshake's limit are joined with actions (refused ones come back as errors).
    for (const [room, st] of this.rooms) if (st === "joining" && !joined.has(room)) {
      if ([...this.rooms.keys()].indexOf(room) >= ROOMS_IN_HANDSHAKE) this.send({ action: "join", room });
    }
    const pending = this.outbox.splice(0);
    for (const text of pending) this.ws!.send(text);
    // Only a connection that stays up resets the backoff: a replica that accepts and drops at
    // once must not be hammered.
    clearTimeout(this.stableTimer);
    this.stableTimer = setTimeout(() => { this.attempt = 0; this.quick = false; }, this.opts.backoff.stableMs);
  }

  private onEvent(f: EventFrame): void {
    const id = f.id;
    if (!Number.isSafeInteger(id)) return;
    // Replayed and live copies of one event (and a replay overlapping what was shown before a
    // reload) are delivered once.
    if (id <= this.floor || this.seen.has(id)) return;
    this.seen.add(id);
    if (this.seen.size > this.opts.dedupeWindow) {
      const oldest = this.seen.values().next().value as number;
      this.seen.delete(oldest);
      if (oldest > this.floor) this.floor = oldest;
    }
    if (typeof f.cursor === "string" && CURSOR_RE.test(f.cursor)) this.cursor = f.cursor;
    if (this.lastId === undefined || id > this.lastId) this.lastId = id;
    this.persist();
    this.emit("event", f as AppEvent<Events>);
    // The durable copy of a stream's end (stream_close notifies the owner): it tells how the stream
    // ended; the chunks still come through the subscription.
    if (f.event === "stream.end") this.onStreamFrame("stream.end", f.payload as { stream: string }, true);
  }

  private onServerError(p: ErrorFrame["payload"]): void {
    if (typeof p.stream === "string") this.onStreamFrame("error", p as { stream: string }, false);
    if (p.action === "join" && typeof p.room === "string" && this.rooms.has(p.room) && p.code === "forbidden") {
      this.rooms.delete(p.room);   // not a member: forget the room (it is not re-joined on reconnect)
      this.persist();
      this.emit("room", { room: p.room, state: "refused", reason: p.message });
    }
    this.emit("error", withError(p, frameError(p)) as ClientEvents["error"]);
  }

  // ---- rooms, typing ------------------------------------------------------------------------
  /** Join a room now (if connected) and on every reconnect, until leave(). */
  join(room: string): void {
    if (this.rooms.get(room) === "joined") return;
    this.rooms.set(room, "joining");
    this.persist();
    this.emit("room", { room, state: "joining" });
    this.send({ action: "join", room });
  }

  leave(room: string): void {
    if (!this.rooms.delete(room)) return;
    this.persist();
    this.send({ action: "leave", room });
    this.emit("room", { room, state: "left" });
  }

  /** Receive a feed (the server's run feed: "runs", admins only) now and on every reconnect
   *  (in the handshake), until unsubscribe(). Its frames arrive as "feed" events. */
  subscribe(feed: string): void {
    if (this.feeds.has(feed)) return;
    this.feeds.add(feed);
    this.send({ action: "subscribe", feed });
  }

  unsubscribe(feed: string): void {
    if (!this.feeds.delete(feed)) return;
    this.send({ action: "unsubscribe", feed });
  }

  /** A handle on one room: joins it as join() does (now when connected, and in every reconnect's
   *  handshake) and gives its app events (`on(event, fn)`, typed by the event map), `presence()`,
   *  `typing()` and `leave()`. The same handle for the same name until it leaves. */
  room(name: string): SwitchboardRoom<Events> {
    if (!this.rooms.has(name)) this.join(name);
    let h = this.handles.get(name);
    if (!h) {
      h = new SwitchboardRoom<Events>(this.roomHost, name, () => this.handles.delete(name));
      this.handles.set(name, h);
    }
    return h;
  }

  private readonly roomHost = {
    on: (event: "event", fn: (e: EventFrame) => void) => this.on(event, fn as Listener<AppEvent<Events>>),
    state: (room: string) => this.rooms.get(room),
    presence: (room: string) => this.presence(room),
    typing: (room: string, payload?: unknown) => this.typing(room, payload),
    leave: (room: string) => this.leave(room),
    watch: (room: string) => this.presenceHub.watch(room),
    track: (room: string, meta: PresenceMeta) => this.presenceHub.track(room, meta),
  };

  /** The feeds this client asks for. */
  feedNames(): string[] { return [...this.feeds]; }

  /** The rooms this client wants, with their state. */
  roomStates(): Map<string, "joining" | "joined"> { return new Map(this.rooms); }

  /** Tell a joined room that this user is typing (ephemeral; dropped when not connected). */
  typing(room: string, payload: unknown = {}): boolean {
    return this.send({ action: "publish", event: "typing", room, payload });
  }

  // ---- streams -------------------------------------------------------------------------------
  /** Read a stream (docs/how-to/streams.md) as an async iterable of `{seq, data}`: each chunk once and in
   *  order, across reconnects (it subscribes again after the last seq it has). Subscribes when
   *  connected; `for await` ends at `stream.end`, `break` unsubscribes. One reader per id at a time. */
  stream(id: string, opts: StreamOptions = {}): SwitchboardStream {
    if (this.streamsById.has(id)) throw new Error(`SwitchboardClient: stream ${id} is already being read`);
    const after = opts.after ?? (opts.resume ? this.storedStreamSeqs()[id] : undefined) ?? 0;
    if (!Number.isSafeInteger(after) || after < 0) throw new RangeError(`stream: bad after ${after}`);
    const s = new SwitchboardStream(id, this.streamHost, after, opts);
    this.streamsById.set(id, s);
    s.start();
    return s;
  }

  /** `GET /streams`: this user's open streams (to pick up after a reload). */
  async streams(): Promise<StreamInfo[]> {
    return (await this.api("get", "/streams")).streams;
  }

  private readonly streamHost: StreamHost = {
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
      delete m[id];              // re-inserted last: the oldest ids go first
      m[id] = seq;
      const ids = Object.keys(m);
      for (const old of ids.slice(0, Math.max(0, ids.length - PERSIST_STREAMS))) delete m[old];
      try { this.storage?.setItem(`${this.storageKey}:streams`, JSON.stringify(m)); } catch { /* memory only */ }
    },
    release: (s) => { if (this.streamsById.get(s.id) === s) this.streamsById.delete(s.id); },
  };

  private storedStreamSeqs(): Record<string, number> {
    if (!this.streamSeqs) {
      this.streamSeqs = {};
      try {
        const m = JSON.parse(this.storage?.getItem(`${this.storageKey}:streams`) ?? "{}");
        for (const k of Object.keys(m ?? {})) if (Number.isSafeInteger(m[k]) && m[k] >= 0) this.streamSeqs[k] = m[k];
      } catch { /* unreadable: start fresh */ }
    }
    return this.streamSeqs;
  }

  private onStreamFrame(event: string, p: { stream: string }, stored: boolean): void {
    const id = p?.stream;
    if (typeof id !== "string") return;
    const pending = this.unsubAcks.get(id) ?? 0;
    if (event === "stream.unsubscribed" || (event === "error" && (p as ErrorFrame["payload"]).action === "stream.unsubscribe")) {
      if (pending > 0) {         // the answer to our own unsubscribe
        if (pending > 1) this.unsubAcks.set(id, pending - 1); else this.unsubAcks.delete(id);
      } else if (event === "stream.unsubscribed") {
        this.streamsById.get(id)?.dropped();
      }
      return;
    }
    const s = this.streamsById.get(id);
    if (!s) return;
    const q = p as Record<string, unknown>;
    if (event === "stream.chunks") s.chunks(q.seq, q.chunks, pending > 0);
    else if (event === "stream.end") s.ended(p as StreamEndFrame["payload"], !stored && pending === 0);
    else s.refused(p as ErrorFrame["payload"]);
  }

  // ---- tool answers -------------------------------------------------------------------------
  /** Answer `tool.call` frames for `name` with fn(args): its result (or {error}) goes back as
   *  `tool.result.<id>`. Returns the function that unregisters. */
  registerTool(name: string, fn: ToolFn): () => void {
    this.toolFns.set(name, fn);
    return () => { if (this.toolFns.get(name) === fn) this.toolFns.delete(name); };
  }

  /** Tool answers, grouped: `client.tools.register(name, fn)`. */
  readonly tools = {
    register: (name: string, fn: ToolFn): (() => void) => this.registerTool(name, fn),
    unregister: (name: string): void => { this.toolFns.delete(name); },
    names: (): string[] => [...this.toolFns.keys()],
  };

  private async onToolCall(f: ToolCallFrame): Promise<void> {
    const callId = f.event.slice(TOOL_CALL_PREFIX.length);
    if (this.answered.has(callId)) return;   // a call is answered once
    this.answered.add(callId);
    if (this.answered.size > 1000) this.answered.delete(this.answered.values().next().value as string);
    const name = String(f.payload?.name);
    const call: ToolCallInfo = { callId, name, args: f.payload?.args };
    this.emit("toolcall", call);
    let result: unknown;
    let error: string | undefined;
    const fn = this.toolFns.get(name);
    if (!fn) {
      error = `unknown tool "${name}"`;
      result = { error, tools: [...this.toolFns.keys()] };
    } else {
      try {
        result = await fn(call.args, call);
      } catch (e) {
        error = String((e as Error)?.message ?? e);
        result = { error };
      }
    }
    const text = JSON.stringify({ action: "publish", event: `tool.result.${callId}`,
      payload: result === undefined ? null : result });
    const ws = this.ws;
    if (ws && ws.readyState === 1 && this.helloSeen) ws.send(text);
    else this.outbox.push(text);   // sent after the next hello
    this.emit("toolresult", { ...call, result, ...(error ? { error } : {}) });
  }

  // ---- the resume position across reloads ---------------------------------------------------
  private restore(): void {
    if (!this.storage) return;
    try {
      const raw = this.storage.getItem(this.storageKey);
      if (!raw) return;
      const p = JSON.parse(raw) as Persisted;
      if (p?.v !== 1) return;
      if (typeof p.cursor === "string" && CURSOR_RE.test(p.cursor)) this.cursor = p.cursor;
      if (Number.isSafeInteger(p.lastId) && p.lastId! >= 0) this.lastId = p.lastId;
      if (typeof p.user === "string") this.storedUser = p.user;
      for (const id of p.ids ?? []) if (Number.isSafeInteger(id)) this.seen.add(id);
      // The rooms too: a reload re-joins them in the handshake, so their missed events replay.
      for (const r of p.rooms ?? []) if (typeof r === "string" && !this.rooms.has(r)) this.rooms.set(r, "joining");
    } catch {
      /* unreadable: start fresh */
    }
  }

  private persist(): void {
    if (!this.storage) return;
    const p: Persisted = { v: 1, user: this.storedUser, cursor: this.cursor, lastId: this.lastId,
      ids: [...this.seen].slice(-PERSIST_IDS), rooms: [...this.rooms.keys()] };
    try {
      this.storage.setItem(this.storageKey, JSON.stringify(p));
    } catch {
      /* quota or blocked: the position lives in memory only */
    }
  }

  /** Forget the resume position, the de-duplication window, the rooms and the stream positions, and end
   *  the streams being read (logout, another user). */
  forget(): void {
    this.rooms.clear();
    this.cursor = undefined;
    this.lastId = undefined;
    this.storedUser = undefined;
    this.seen.clear();
    this.floor = 0;
    this.outbox = [];
    this.answered.clear();
    this.streamSeqs = undefined;
    for (const s of [...this.streamsById.values()]) void s.return();   // another user's streams end here
    try {
      this.storage?.removeItem(this.storageKey);
      this.storage?.removeItem(`${this.storageKey}:streams`);
    } catch { /* ignore */ }
  }

  /** The resume position this client would use now (for display and tests). */
  position(): { cursor?: string; lastId?: number } {
    return { cursor: this.cursor, lastId: this.lastId };
  }
}
