// HTTP helpers: one fetch wrapper with a timeout, RFC 9457 problem+json errors,
// and the session calls (login / refresh / logout) of the COORD sessions contract.

/** A failed HTTP call. Problem+json members (RFC 9457) are copied onto it. */
export class HttpError extends Error {
  /** HTTP status; 0 when no answer arrived (network error or timeout). */
  readonly status: number;
  /** problem+json `type` (a URI), when the server sent one. */
  readonly type: string | undefined;
  readonly title: string | undefined;
  /** problem+json `detail` (older servers: `description`). */
  readonly detail: string | undefined;
  /** Seconds from `Retry-After`, 0 when absent. */
  readonly retryAfter: number;
  /** The whole parsed body (extension members such as `known_handlers` live here). */
  readonly body: Record<string, unknown> | null;

  constructor(status: number, message: string, body: Record<string, unknown> | null = null, retryAfter = 0) {
    super(message);
    this.name = "HttpError";
    this.status = status;
    this.body = body;
    this.retryAfter = retryAfter;
    this.type = typeof body?.type === "string" ? body.type : undefined;
    this.title = typeof body?.title === "string" ? body.title : undefined;
    const detail = body?.detail ?? body?.description;
    this.detail = typeof detail === "string" ? detail : undefined;
  }
}

/** `POST /auth/login` and `POST /auth/refresh` answer with this. */
export interface LoginResponse {
  access_token: string;
  token_type: string;
  expires_in: number;
  user_id: string;
  role: "admin" | "member";
}

export type FetchLike = (input: string | URL, init?: RequestInit) => Promise<Response>;

export interface RequestOptions {
  method: string;
  body?: unknown;
  token?: string | null;
  /** 'include' for the session calls (the refresh cookie), else 'same-origin'. */
  credentials?: RequestCredentials;
  timeoutMs: number;
}

export async function request<T>(fetchFn: FetchLike, url: URL, opt: RequestOptions): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json, application/problem+json" };
  if (opt.body !== undefined) headers["Content-Type"] = "application/json";
  if (opt.token) headers.Authorization = `Bearer ${opt.token}`;
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), opt.timeoutMs);
  let r: Response;
  try {
    r = await fetchFn(url, {
      method: opt.method, headers, cache: "no-store", signal: ctl.signal,
      credentials: opt.credentials ?? "same-origin",
      body: opt.body === undefined ? undefined : JSON.stringify(opt.body),
    });
  } catch (e) {
    clearTimeout(timer);
    const aborted = (e as { name?: string })?.name === "AbortError";
    throw new HttpError(0, aborted ? `no answer from ${url.pathname} within ${opt.timeoutMs} ms`
      : `network error on ${url.pathname}: ${(e as Error)?.message ?? e}`);
  }
  try {
    const text = r.status === 204 ? "" : await r.text();
    let data: unknown = null;
    if (text) {
      try { data = JSON.parse(text); } catch { data = null; }
    }
    if (!r.ok) {
      const body = data && typeof data === "object" ? data as Record<string, unknown> : null;
      const msg = (body && (body.detail ?? body.description ?? body.title)) || `HTTP ${r.status}`;
      throw new HttpError(r.status, String(msg), body, Number(r.headers.get("Retry-After")) || 0);
    }
    return data as T;
  } finally {
    clearTimeout(timer);
  }
}
