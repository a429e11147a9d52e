// A scripted WebSocket and fetch for suites that need no server (the same shape as
// unit.test.mjs's): the test plays the server's side frame by frame.
export class FakeWS {
  static all = [];
  constructor(url) {
    this.url = new URL(url);
    this.readyState = 0;
    this.sent = [];
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    FakeWS.all.push(this);
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  close() { this.readyState = 3; }
  hello(extra = {}) {
    this.readyState = 1;
    this.onopen?.({});
    this.frame({ id: null, event: "hello", room: null, ts: 1,
      payload: { replica: "r1", user_id: "u1", username: "alice", role: "member", last_id: 10, rooms: [], ...extra } });
  }
  frame(f) { this.onmessage?.({ data: JSON.stringify({ room: null, ts: 1, payload: {}, ...f }) }); }
  drop(code, reason = "") { this.readyState = 3; this.onclose?.({ code, reason }); }
}

export const json = (body, status = 200, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...headers } });

/** A fetch answering tickets (and login); `routes(url, init)` may answer first (return a Response or throw). */
export function fakeFetch(routes = () => undefined) {
  let n = 0;
  const calls = [];
  const f = async (url, init = {}) => {
    const u = new URL(url);
    calls.push(`${init.method ?? "GET"} ${u.host}${u.pathname}`);
    const r = await routes(u, init);
    if (r) return r;
    if (u.pathname.endsWith("/ws/ticket")) return json({ ticket: `t${++n}`, expires_in: 30 }, 201);
    if (u.pathname.endsWith("/auth/login")) {
      return json({ access_token: "a", token_type: "bearer", expires_in: 3600, user_id: "u1", role: "member" });
    }
    return json({}, 404);
  };
  f.calls = calls;
  return f;
}

/** The i-th socket the client opened (waits for it, bounded). */
export async function socket(i) {
  for (let k = 0; k < 2000 && FakeWS.all.length <= i; k++) await new Promise((r) => setTimeout(r, 5));
  if (!FakeWS.all[i]) throw new Error(`socket ${i} was not opened`);
  return FakeWS.all[i];
}
