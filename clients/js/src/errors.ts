// What went wrong on the socket, as classes an app can branch on with instanceof:
// every one is a SwitchboardError with a machine-readable `code`. They ride on the
// events that already carried codes (closed / reconnecting / state, retry, error,
// resume_gap) as a non-enumerable `error` member, so those events' fields, their
// JSON and equality checks on them stay what they were.
import { HttpError } from "./http.js";

export interface SwitchboardErrorOptions {
  /** The WebSocket close code (or the client's own 4000-4003) that caused it. */
  closeCode?: number;
  /** The HTTP status that caused it (the ticket request). */
  status?: number;
  /** The underlying error (an HttpError for the ticket request). */
  cause?: unknown;
  /** RateLimitedError: seconds to wait. */
  retryAfter?: number;
  /** GoneError: events up to this id were reaped. */
  horizon?: number;
}

/** The common base: `code` says what happened, in snake_case (`session_ended`, `forbidden`, `rate_limited`,
 *  `service_restart`, `connection_lost`, an error frame's own code, ...). */
export class SwitchboardError extends Error {
  readonly code: string;
  /** The close code of the state change it came with (WebSocket close code, or the client's 4000-4003). */
  readonly closeCode: number | undefined;
  /** HTTP status, when an HTTP answer caused it (POST /ws/ticket). */
  readonly status: number | undefined;

  constructor(code: string, message: string, o: SwitchboardErrorOptions = {}) {
    super(message, o.cause === undefined ? undefined : { cause: o.cause });
    this.name = "SwitchboardError";
    this.code = code;
    this.closeCode = o.closeCode;
    this.status = o.status;
  }
}

/** The session or the ticket was refused: log in again. Close 1008 `session ended` / `session revoked`,
 *  a ticket answered 401, a refresh that failed while connected (4003). */
export class AuthError extends SwitchboardError {
  constructor(code: string, message: string, o?: SwitchboardErrorOptions) {
    super(code, message, o);
    this.name = "AuthError";
  }
}

/** Not allowed: close 1008 `user disabled` (or another policy close), a ticket answered 403,
 *  an error frame `forbidden` (a room the user is no member of) or `forbidden_event`. */
export class ForbiddenError extends SwitchboardError {
  constructor(code: string, message: string, o?: SwitchboardErrorOptions) {
    super(code, message, o);
    this.name = "ForbiddenError";
  }
}

/** The resume point is no longer available: some missed events are older than the server keeps
 *  (`resume_gap`): re-read the state over HTTP. */
export class GoneError extends SwitchboardError {
  /** Events up to this id were reaped (when the server said). */
  readonly horizon: number | undefined;
  constructor(code: string, message: string, o: SwitchboardErrorOptions = {}) {
    super(code, message, o);
    this.name = "GoneError";
    this.horizon = o.horizon;
  }
}

/** Slow down: a ticket answered 429 (`retryAfter` from Retry-After), an error frame `rate_limited`,
 *  close 1008 `frame rate exceeded`, close 1013 (try again later: overloaded, or too slow a reader). */
export class RateLimitedError extends SwitchboardError {
  /** Seconds to wait, when the server said (Retry-After); 0 when unknown. */
  readonly retryAfter: number;
  constructor(code: string, message: string, o: SwitchboardErrorOptions = {}) {
    super(code, message, o);
    this.name = "RateLimitedError";
    this.retryAfter = o.retryAfter ?? 0;
  }
}

/** The replica is going away: close 1012 (restarting, or it lost its database) or 1001. The client
 *  reconnects at once and resumes. */
export class ServerGoingAwayError extends SwitchboardError {
  constructor(code: string, message: string, o?: SwitchboardErrorOptions) {
    super(code, message, o);
    this.name = "ServerGoingAwayError";
  }
}

type ErrorClass = new (code: string, message: string, o?: SwitchboardErrorOptions) => SwitchboardError;

// Close code -> [class, code]. 1008 depends on the reason; anything not here: connection_lost.
const CLOSE: Record<number, [ErrorClass, string]> = {
  1001: [ServerGoingAwayError, "going_away"], 1012: [ServerGoingAwayError, "service_restart"],
  1013: [RateLimitedError, "try_again_later"], 1011: [SwitchboardError, "server_error"],
  1009: [SwitchboardError, "frame_too_large"], 1003: [SwitchboardError, "unsupported_data"],
  4000: [SwitchboardError, "ping_timeout"], 4001: [SwitchboardError, "hello_timeout"],
};
// 1008 reasons (server/switchboard/sessions.py, ws.py) -> class; any other: ForbiddenError.
const POLICY: Record<string, ErrorClass> = {
  session_ended: AuthError, session_revoked: AuthError, frame_rate_exceeded: RateLimitedError,
};

/** @internal The error for a state change with this close code and reason (undefined: a normal close). */
export function closeError(code: number, reason: string): SwitchboardError | undefined {
  if (code === 1000) return undefined;
  const o = { closeCode: code };
  const msg = reason || `closed ${code}`;
  if (code === 1008) {
    const c = reason.toLowerCase().replace(/[^a-z0-9]+/g, "_").replace(/^_|_$/g, "") || "policy_violation";
    return new (POLICY[c] ?? ForbiddenError)(c, msg, o);
  }
  const [C, c] = CLOSE[code] ?? [SwitchboardError, "connection_lost"];
  return new C(c, msg, o);
}

/** @internal The error for a failed HTTP call on the way to a socket (the ticket, the URL resolver). */
export function httpError(e: unknown, closeCode: number, msg: string, other = "no_ticket"): SwitchboardError {
  const s = e instanceof HttpError ? e.status : undefined;
  const o = { closeCode, status: s, cause: e, retryAfter: (e as HttpError)?.retryAfter };
  if (s === 401) return new AuthError("unauthorized", msg, o);
  if (s === 403) return new ForbiddenError("forbidden", msg, o);
  if (s === 429) return new RateLimitedError("rate_limited", msg, o);
  return new SwitchboardError(s === undefined ? other : s === 0 ? "network_error"
    : s >= 500 ? "server_error" : "http_error", msg, o);
}

/** @internal Attach `error` to an event's value without making it enumerable (JSON, spreads and
 *  equality checks see the fields they always saw). */
export function withError<T extends object>(value: T, error: SwitchboardError | undefined): T {
  if (error) Object.defineProperty(value, "error", { value: error, configurable: true });
  return value;
}
