// Compiled by `npm run typecheck` (tsc --strict): an event map types the app's events in
// on("event") and in room handles, the error classes narrow with instanceof, and code
// without a map keeps compiling as before.
import {
  AuthError, RateLimitedError, SwitchboardClient, SwitchboardError, type AppEvent, type EventFrame,
} from "../src/index.js";

interface ChatEvents {
  "chat.message": { text: string; from: string };
  "chat.deleted": { messageId: number };
}

export function typed(): void {
  const sb = new SwitchboardClient<ChatEvents>({ urls: ["https://a.example/", "https://b.example/"] });
  sb.on("event", (e) => {
    if (e.event === "chat.message") {
      const text: string = e.payload.text;
      console.log(text, e.id, e.room);
      // @ts-expect-error narrowed: a chat.message has no messageId
      console.log(e.payload.messageId);
    } else {
      const id: number = e.payload.messageId;   // the only other event of the map
      console.log(id);
    }
  });

  const ops = sb.room("ops");
  const off = ops.on("chat.message", (e) => console.log(e.payload.from, e.payload.text));
  ops.on("chat.deleted", (e) => console.log(e.payload.messageId));
  // @ts-expect-error not an event of the map
  ops.on("chat.edited", () => {});
  off();
  void ops.presence().then(({ members }) => members.filter((m) => m.online));
  ops.typing({ state: "typing" });
  ops.leave();

  sb.on("closed", ({ code, error }) => {
    if (error instanceof AuthError) console.log("log in again", error.code, code);
  });
  sb.on("retry", ({ error }) => {
    if (error instanceof RateLimitedError) console.log(`slow down for ${error.retryAfter} s`);
  });
  sb.on("error", (p) => {
    const e: SwitchboardError = p.error;
    console.log(e.code, p.code, p.message);
  });
  sb.on("resume_gap", (p) => console.log(p.error.horizon));
}

export function untyped(): void {
  // Without a map: any event name, payload unknown -- the frames are still EventFrames.
  const sb = new SwitchboardClient({ url: "https://api.example/" });
  sb.on("event", (e: EventFrame) => console.log(e.event, e.payload));
  sb.on("event", (e) => {
    const frame: EventFrame = e;
    // @ts-expect-error payload is unknown until checked
    console.log(e.payload.text, frame);
  });
  sb.room("ops").on("anything", (e: AppEvent) => console.log(e.payload));
  const resolved = new SwitchboardClient({ urls: async () => "https://api.example/" });
  resolved.connect();
}
