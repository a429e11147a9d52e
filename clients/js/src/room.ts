// A room handle: sb.room(name) joins the room the way join() does (now when connected, and in
// every reconnect's handshake) and gives the room's own app events, typing, presence and leave.
import type { EventFrame, PresenceMember, PresenceMeta } from "./frames.js";
import { listen, type PresenceJoinFn, type PresenceLeaveFn, type PresenceList, type PresenceSyncFn } from "./presence.js";

/** App event names to payload types, e.g. `{ "chat.message": { text: string } }`. A declaration the
 *  compiler trusts (the client does not check payloads): list what your backend publishes. */
export type EventMap = Record<string, unknown>;

/** A stored app event frame whose `event` is K and `payload` is Events[K]; a union over every K, so
 *  `if (e.event === "chat.message")` narrows `e.payload`. With the default map: any event, payload unknown. */
export type AppEvent<Events extends object = EventMap, K extends keyof Events & string = keyof Events & string> = {
  [P in K]: Omit<EventFrame, "event" | "payload"> & { event: P; payload: Events[P] };
}[K];

/** @internal What a room handle needs from its client. */
export interface RoomHost {
  on(event: "event", fn: (e: EventFrame) => void): () => void;
  state(room: string): "joining" | "joined" | undefined;
  presence(room: string): Promise<RoomPresence>;
  typing(room: string, payload?: unknown): boolean;
  leave(room: string): void;
  watch(room: string): PresenceList;
  track(room: string, meta: PresenceMeta): boolean;
}

export interface RoomPresence { room: string; members: Array<{ user_id: string; username: string; online: boolean }> }

type Fn = (e: any) => void;

export class SwitchboardRoom<Events extends object = EventMap> {
  readonly name: string;
  private readonly host: RoomHost;
  private readonly fns = new Map<string, Set<Fn>>();
  private unhook: (() => void) | undefined;
  private readonly done: () => void;

  /** @internal sb.room(name) makes these. */
  constructor(host: RoomHost, name: string, done: () => void) {
    this.host = host;
    this.name = name;
    this.done = done;
  }

  /** `joining` (asked for: now, or with the next connection), `joined`, or `left` (left, refused or removed:
   *  the client no longer wants it; the `room` event says why). */
  get state(): "joining" | "joined" | "left" {
    return this.host.state(this.name) ?? "left";
  }

  /** This room's stored app events named `event`, each once and in order (the client's `event` events
   *  with this room). Returns the function that unsubscribes. */
  on<K extends keyof Events & string>(event: K, fn: (e: AppEvent<Events, K>) => void): () => void {
    let set = this.fns.get(event);
    if (!set) this.fns.set(event, (set = new Set()));
    set.add(fn);
    this.unhook ??= this.host.on("event", (e) => {
      if (e.room !== this.name) return;
      for (const f of [...(this.fns.get(e.event) ?? [])]) {
        try { f(e); } catch (err) { queueMicrotask(() => { throw err; }); }   // as the client's own listeners
      }
    });
    return () => this.off(event, fn);
  }

  off<K extends keyof Events & string>(event: K, fn: (e: AppEvent<Events, K>) => void): void {
    this.fns.get(event)?.delete(fn);
  }

  /** `GET /rooms/{room}/members`: every member with `online` (one read; online() is pushed). */
  presence(): Promise<RoomPresence> { return this.host.presence(this.name); }

  /** Pushed presence (presence.state / presence.diff): `fn(member, previous)` when a member comes online
   *  (`previous` undefined) or their metadata changes. Watching the room's presence starts with the first
   *  of onJoin / onLeave / onSync / online / track. Returns the function that unsubscribes. */
  onJoin(fn: PresenceJoinFn): () => void { return listen(this.host.watch(this.name).joins, fn); }

  /** Pushed presence: `fn(member)` when a member goes offline (their last socket, on any replica, closed). */
  onLeave(fn: PresenceLeaveFn): () => void { return listen(this.host.watch(this.name).leaves, fn); }

  /** Pushed presence: `fn(members)` after every state or diff, with the whole list. */
  onSync(fn: PresenceSyncFn): () => void { return listen(this.host.watch(this.name).syncs, fn); }

  /** The members online now, by username, each with the metadata of their tracking connections (pushed
   *  presence: empty until the first presence.state arrives). */
  online(): PresenceMember[] { return this.host.watch(this.name).list(); }

  /** Show this connection in the room's presence with `meta` (at most 8 scalar values, 256 bytes), now and
   *  after every reconnect, until leave(). False when not sent now (not connected or not joined yet). */
  track(meta: PresenceMeta): boolean { return this.host.track(this.name, meta); }

  /** Tell the room this user is typing (ephemeral; false when not connected). */
  typing(payload?: unknown): boolean { return this.host.typing(this.name, payload); }

  /** Leave the room (now and on later reconnects) and drop this handle's listeners. */
  leave(): void {
    this.unhook?.();
    this.unhook = undefined;
    this.fns.clear();
    this.done();
    this.host.leave(this.name);
  }
}
