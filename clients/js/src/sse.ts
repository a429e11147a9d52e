// The fallback transport: the server's frames as Server-Sent Events (GET /sse, read with
// fetch streaming: browsers and Node 20 alike, and no EventSource auto-reconnect that would
// reuse a spent ticket), the client's frames as POST /sse/{connection}/actions. It looks like
// a WebSocket to the client (WebSocketLike), so reconnect, resume, rooms and typing are the
// client's own code either way.
import { HttpError, type FetchLike } from "./http.js";
import type { WebSocketLike } from "./client.js";

export interface SseHost {
  fetch: FetchLike;
  /** A JSON POST with the client's bearer token (refresh on 401), relative to the API base. */
  post: (path: string, body: unknown) => Promise<unknown>;
}

/** One SSE stream as a WebSocketLike: `close` events carry the code the socket would close with;
 *  an action the server refuses comes back as the `error` frame the socket would send. */
export class SseSocket implements WebSocketLike {
  readyState = 0;
  onopen: ((ev: any) => void) | null = null;
  onmessage: ((ev: { data: any }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: any) => void) | null = null;
  private readonly ctl = new AbortController();
  private conn = "";
  private secret = "";
  private queue: Promise<unknown> = Promise.resolve();   // actions go one at a time, in order

  constructor(url: string, private readonly host: SseHost) {
    void this.run(url);
  }

  private async run(url: string): Promise<void> {
    let code = 1006;
    let reason = "";
    try {
      const r = await this.host.fetch(url, { headers: { Accept: "text/event-stream" }, cache: "no-store",
        signal: this.ctl.signal });
      if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
      this.readyState = 1;
      this.onopen?.({});
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i: number;
        while ((i = buf.indexOf("\n\n")) >= 0) {   // one event per blank line (the server writes LF only)
          let name = "";
          const data: string[] = [];
          for (const line of buf.slice(0, i).split("\n")) {
            const m = /^(data|event): ?(.*)/.exec(line);    // comments (":"), id: and retry: are not needed
            if (m?.[1] === "data") data.push(m[2]); else if (m) name = m[2];
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
      if (!reason) reason = (e as Error)?.message ?? String(e);
    }
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  send(text: string): void {
    if (this.readyState !== 1 || !this.conn) return;
    const body = { ...JSON.parse(text), secret: this.secret };
    this.queue = this.queue.then(() => this.host.post(`sse/${this.conn}/actions`, body)).catch((e) => {
      // The refusal the socket would have sent as an error frame (a gone connection: the stream ends).
      const err = e instanceof HttpError ? e.body?.error as { code?: string } | undefined : undefined;
      if (err && err.code !== "not_connected" && this.readyState === 1) {
        this.onmessage?.({ data: JSON.stringify({ id: null, event: "error", room: null, payload: err, ts: Date.now() }) });
      }
    });
  }

  close(code = 1000, reason = ""): void {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.ctl.abort();
    const f = this.onclose;
    if (f) queueMicrotask(() => f({ code, reason }));
  }
}
